"""FP8 (e4m3) UNet for export_sdxl.py --fp8: the linear layers of every transformer
block run as FP8 matmuls with static per-tensor scales.

Contract of one quantised layer (Fp8Linear, replacing an nn.Linear of K inputs, N outputs):
  weight        float8_e4m3fn [N, K]   round(W / weight_scale), W the high-precision weight
  weight_scale  float32 []             amax(|W|) / 448
  input_scale   float32 []             amax(|x|) / 448 over the calibration run (static)
  bias          model dtype [N]        unchanged (when the layer has one)
  y = _scaled_mm(sat(x / input_scale), weight^T) * input_scale * weight_scale + bias,
  the division in x's dtype (fp16 for an fp16 model: x / s rounds to fp16, then to e4m3),
  accumulated in fp32 (use_fast_accum: Hopper's faster FP8 accumulation), output in
  the model dtype. Traced on a CUDA device the layer is torch._scaled_mm (FP8 tensor
  cores); traced on the CPU it is the same products as an fp32 matmul (the CPU's
  _scaled_mm is a reference loop), which the CPU tests run. sat() clamps to +-448 (e4m3's largest finite value) before the cast,
  so an input beyond the calibrated range saturates instead of becoming NaN.

Which layers: every nn.Linear inside the UNet's transformer blocks (proj_in, proj_out,
attn1 q/k/v/out, attn2 q/out, the feed-forward GEGLU and its output), except attn2's
to_k / to_v, whose input is the 77-token text context (a few rows: nothing to gain)
and which the IP-Adapter and LoRA paths keep exact. Convolutions, norms, attention and
the time embeddings stay in the model dtype. These layers carry about two thirds of the
UNet's FLOPs (docs/models-and-export.md#fp8-unet).

The scales are the same for every image: calibrated once at export on a few prompts'
whole sampling trajectories (calibrate()), so a task's result does not depend on the
batch it lands in. A LoRA merges into the dequantised weight and is quantised again
with the same weight_scale, or with amax / 448 where it reaches beyond 464 * weight_scale
(the weight_scale buffer updated in place; the C++ LoraPatcher, tests/reference/fp8_reference.py).
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

E4M3_MAX = 448.0
FP8 = torch.float8_e4m3fn
FORMAT = "e4m3fn, static per-tensor scales (weights: amax/448; inputs: calibrated amax/448)"
# Calibration prompts alternate these negatives: CFG's unconditional rows see both the
# zero embedding of an empty negative and a typical written one.
CALIBRATION_NEGATIVES = ("", "blurry, lowres, watermark, text")


def quantize_tensor(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """sat(x / scale) as e4m3: the rule for both weights and inputs."""
    return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)


class Fp8Linear(nn.Module):
    """nn.Linear's forward with an e4m3 weight and static per-tensor scales (module docstring)."""

    def __init__(self, out_features: int, in_features: int, bias: torch.Tensor | None, out_dtype: torch.dtype,
                 device) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.out_dtype = out_dtype
        self.weight = nn.Parameter(torch.zeros(out_features, in_features, dtype=FP8, device=device), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.register_buffer("weight_scale", torch.ones((), dtype=torch.float32, device=device))
        self.register_buffer("input_scale", torch.ones((), dtype=torch.float32, device=device))

    @classmethod
    def from_linear(cls, lin: nn.Linear, input_amax: float) -> "Fp8Linear":
        w = lin.weight.detach()
        q = cls(lin.out_features, lin.in_features, lin.bias, w.dtype, w.device)
        w_amax = float(w.float().abs().max())
        q.weight_scale.fill_(max(w_amax, 1e-12) / E4M3_MAX)
        q.input_scale.fill_(max(input_amax, 1e-12) / E4M3_MAX)
        q.weight.copy_(quantize_tensor(w.float(), q.weight_scale))
        return q

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        xq = quantize_tensor(rows, self.input_scale).contiguous()
        return self.matmul_e4m3(xq).reshape(x.shape[:-1] + (self.out_features,))

    def matmul_e4m3(self, xq: torch.Tensor) -> torch.Tensor:
        """The layer on an input already quantised with input_scale (e4m3 [M, K], contiguous): [M, N]
        in the model dtype (fp8_geglu's fused feed-forward hands its output layer e4m3 rows)."""
        if xq.is_cuda:
            return torch._scaled_mm(xq, self.weight.t(), scale_a=self.input_scale, scale_b=self.weight_scale,
                                    bias=self.bias, out_dtype=self.out_dtype, use_fast_accum=True)
        # the same products in an fp32 matmul: the CPU's _scaled_mm is a reference loop (minutes a layer)
        y = (xq.float() @ self.weight.float().t()) * (self.input_scale * self.weight_scale)
        return (y + self.bias.float() if self.bias is not None else y).to(self.out_dtype)

    def dequantized(self) -> torch.Tensor:
        """The weight as the matmul sees it, in fp32."""
        return self.weight.float() * self.weight_scale


def fp8_layer_names(unet: nn.Module) -> list[str]:
    """The nn.Linear layers that --fp8 quantises (module docstring), in module order."""
    names = []
    for name, mod in unet.named_modules():
        in_block = ".transformer_blocks." in f".{name}" or _is_projection(name)
        if not isinstance(mod, nn.Linear) or not in_block:
            continue
        if ".attn2.to_k" in name or ".attn2.to_v" in name:
            continue
        if mod.in_features % 16 or mod.out_features % 16:  # _scaled_mm's alignment
            continue
        names.append(name)
    return names


def _is_projection(name: str) -> bool:
    return (name.endswith(".proj_in") or name.endswith(".proj_out")) and ".attentions." in f".{name}"


@contextlib.contextmanager
def input_amax(unet: nn.Module, layer_names: list[str]):
    """Records each named layer's input amax over the UNet calls made inside the block (on the
    device: no host sync per call). Yields a dict that holds {name: float} after the block;
    a layer with no finite, non-zero range stops the export."""
    mods = dict(unet.named_modules())
    acc: dict[str, torch.Tensor] = {}
    result: dict[str, float] = {}

    def hook(_m, args, n):
        a = args[0].detach().abs().amax().float()
        acc[n] = a if n not in acc else torch.maximum(acc[n], a)

    hooks = [mods[n].register_forward_pre_hook(lambda m, args, n=n: hook(m, args, n)) for n in layer_names]
    try:
        yield result
    finally:
        for h in hooks:
            h.remove()
    result.update({n: float(acc[n]) if n in acc else 0.0 for n in layer_names})
    bad = [n for n, v in result.items() if not 0 < v < float("inf")]
    if bad:
        raise SystemExit(f"--fp8 calibration: layers with no finite, non-zero input range: {bad[:5]}")


@torch.no_grad()
def calibrate(pipe, layer_names: list[str], prompts: list[str], steps: int, width: int, height: int,
              cfg: float, seed: int) -> dict[str, float]:
    """Each layer's input amax over whole sampling trajectories of `prompts`, their negatives
    alternating CALIBRATION_NEGATIVES (diffusers' pipeline, output_type latent: the VAE is
    not needed)."""
    gen = torch.Generator("cpu").manual_seed(seed)
    with input_amax(pipe.unet, layer_names) as amax:
        for i, p in enumerate(prompts):
            pipe(prompt=p, negative_prompt=CALIBRATION_NEGATIVES[i % len(CALIBRATION_NEGATIVES)],
                 num_inference_steps=steps, guidance_scale=cfg, width=width, height=height, generator=gen,
                 output_type="latent")
    return amax


def quantize_unet(unet: nn.Module, amax: dict[str, float]) -> int:
    """Replaces each calibrated nn.Linear by its Fp8Linear, in place; returns how many."""
    for name, a in amax.items():
        parent_name, _, child = name.rpartition(".")
        parent = unet.get_submodule(parent_name) if parent_name else unet
        setattr(parent, child, Fp8Linear.from_linear(getattr(parent, child), a))
    return len(amax)
