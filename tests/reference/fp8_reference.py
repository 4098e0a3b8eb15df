"""Reference of the FP8 UNet (export_sdxl.py --fp8, sdxl-batch --precision fp8) for the
parity tests, written from the layer contract, not from scripts/export/fp8_quant.py:

  one quantised nn.Linear (K inputs, N outputs) of the export, unet_fp8.ts, holds
    <name>.weight        float8_e4m3fn [N, K]   (W8)
    <name>.weight_scale  float32 []             (s_w)
    <name>.input_scale   float32 []             (s_in)
    <name>.bias          model dtype [N]        (when the layer has one)
  and computes  y = (sat(x / s_in) as e4m3) @ W8^T * (s_in * s_w) + bias,
  sat() clamping to +-448 (e4m3's largest finite value) before the cast (round to nearest even);
  here all in fp32 (x / s_in too), the result cast to the model dtype.

  A LoRA on a quantised layer: with W = W8.float() * s_w + delta (delta the LoRA merge in fp32:
  weight * alpha/rank * up @ down, every LoRA of the set summed), the layer's scale and weight become
    s_w' = s_w if amax|W| <= 464 * s_w else amax|W| / 448,   W8' = sat(round(W / s_w')) as e4m3,
  quantised once: the export's s_w while the clamp at 448 costs no more than rounding (e4m3's top
  step is 32), a coarser one (nothing clipped) beyond.

What the export quantises (the contract, contract_layer_names): every nn.Linear of the UNet's
transformer blocks and the Transformer2DModel's proj_in / proj_out, except the cross-attention's
to_k / to_v, and only where both widths are multiples of 16 (_scaled_mm's alignment).

With --fp8-conv also 3x3 convolutions (EmulatedFp8Conv2d): <name>.weight e4m3 [Cout, Cin, 3, 3],
<name>.weight_scale float32 [Cout, 1, 1, 1] (per output channel), <name>.input_scale float32 [];
  y = conv(sat(x / s_in) as e4m3 * s_in, W8 * s_w) + bias in fp32, rounded to fp16, then the model dtype.
--fp8-geglu changes no tensor: the fused feed-forward is the two quantised layers' contract with GEGLU
between them (in fp32 here), so the emulation of the unfused layers is its reference too.

    from reference.fp8_reference import read_tensors, emulate_fp8_unet, fuse_lora_files_fp8
    tensors = read_tensors(model_dir / "unet_fp8.ts")
    names = emulate_fp8_unet(pipe.unet, tensors)     # the diffusers UNet now computes as unet_fp8.ts
    counts = fuse_lora_files_fp8(pipe, [(lora_file, 0.8)])
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

E4M3_MAX = 448.0
FP8 = torch.float8_e4m3fn
KEEP_SCALE_UP_TO = 464.0  # a LoRA-merged weight keeps its scale while its amax is within this many scales


def to_e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """sat(x / scale) as e4m3, the division in fp32."""
    return (x.float() / scale.float()).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)


class EmulatedFp8Linear(nn.Module):
    """An nn.Linear of the FP8 UNet, computed in fp32 (module docstring). Its tensors are buffers
    (not parameters: nothing that asks the UNet for its dtype or parameters sees an e4m3 tensor)."""

    def __init__(self, weight8: torch.Tensor, weight_scale: torch.Tensor, input_scale: torch.Tensor,
                 bias: torch.Tensor | None, out_dtype: torch.dtype):
        super().__init__()
        self.out_features, self.in_features = weight8.shape
        self.out_dtype = out_dtype
        self.register_buffer("weight8", weight8.detach().clone())
        self.register_buffer("weight_scale", weight_scale.detach().float().clone().reshape(()))
        self.register_buffer("input_scale", input_scale.detach().float().clone().reshape(()))
        self.register_buffer("bias", None if bias is None else bias.detach().clone().to(out_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq = to_e4m3(x, self.input_scale).float()
        y = (xq @ self.weight8.float().t()) * (self.input_scale * self.weight_scale)
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(self.out_dtype)

    def dequantized(self) -> torch.Tensor:
        """The weight the matmul sees, fp32: W8 * s_w."""
        return self.weight8.float() * self.weight_scale

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"weight_scale={float(self.weight_scale):.4g}, input_scale={float(self.input_scale):.4g}")


class EmulatedFp8Conv2d(nn.Module):
    """A 3x3 convolution (padding 1) of --fp8-conv's FP8 UNet, computed in fp32 (module docstring)."""

    def __init__(self, weight8: torch.Tensor, weight_scale: torch.Tensor, input_scale: torch.Tensor,
                 bias: torch.Tensor | None, stride: int, out_dtype: torch.dtype):
        super().__init__()
        self.stride, self.out_dtype = stride, out_dtype
        self.register_buffer("weight8", weight8.detach().clone())
        self.register_buffer("weight_scale", weight_scale.detach().float().clone().reshape(-1, 1, 1, 1))
        self.register_buffer("input_scale", input_scale.detach().float().clone().reshape(()))
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # channels-last, as unet_fp8.ts convolves: the same fp32 summation order, so the same fp16 roundings
        cl = torch.channels_last
        xq = (to_e4m3(x, self.input_scale).float() * self.input_scale).contiguous(memory_format=cl)
        w = (self.weight8.float() * self.weight_scale).contiguous(memory_format=cl)
        y = torch.nn.functional.conv2d(xq, w, self.bias, self.stride, 1)
        return y.to(torch.float16).to(self.out_dtype)


def read_tensors(ts_path: str | Path) -> dict[str, torch.Tensor]:
    """unet_fp8.ts's named parameters and buffers (no prefix: the UNet's own names), on the CPU."""
    m = torch.jit.load(str(ts_path), map_location="cpu")
    out = {n: t.detach() for n, t in m.named_parameters()}
    out.update({n: t.detach() for n, t in m.named_buffers()})
    return out


def fp8_layer_names(tensors: dict[str, torch.Tensor]) -> list[str]:
    """The quantised layers of an export: those with a <name>.weight_scale, sorted."""
    return sorted(n[: -len(".weight_scale")] for n in tensors if n.endswith(".weight_scale"))


def contract_layer_names(unet: nn.Module) -> list[str]:
    """The layers the contract quantises (module docstring), from the UNet's module tree, sorted."""
    from diffusers.models.transformers.transformer_2d import Transformer2DModel

    names = set()
    for tname, tmod in unet.named_modules():
        if not isinstance(tmod, Transformer2DModel):
            continue
        for sub, mod in tmod.named_modules():
            if not isinstance(mod, nn.Linear):
                continue
            parts = sub.split(".")
            in_blocks = parts[0] == "transformer_blocks"
            if not (in_blocks or sub in ("proj_in", "proj_out")):
                continue
            if in_blocks and len(parts) >= 4 and parts[2] == "attn2" and parts[3] in ("to_k", "to_v"):
                continue
            if mod.in_features % 16 or mod.out_features % 16:
                continue
            names.add(f"{tname}.{sub}")
    return sorted(names)


def _set_submodule(root: nn.Module, name: str, mod: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent_name) if parent_name else root, child, mod)


def emulate_fp8_unet(unet: nn.Module, tensors: dict[str, torch.Tensor]) -> list[str]:
    """Replaces, in place, each nn.Linear of the diffusers UNet that has a <name>.weight_scale in
    `tensors` (read_tensors) by an EmulatedFp8Linear with that layer's e4m3 weight, scales and bias,
    each 3x3 nn.Conv2d that has one (--fp8-conv) by an EmulatedFp8Conv2d; the output in the UNet's
    dtype. Returns the names replaced. Refuses tensors that do not fit the contract (a weight that is
    not e4m3 of the layer's shape, a scale that is not finite, positive fp32 of the layer's shape, a
    layer that is neither)."""
    names = fp8_layer_names(tensors)
    if not names:
        raise ValueError("no <layer>.weight_scale among the tensors: not an FP8 UNet (unet_fp8.ts)")
    for name in names:
        lin = unet.get_submodule(name)
        conv = isinstance(lin, nn.Conv2d) and lin.kernel_size == (3, 3) and lin.padding == (1, 1)
        if not (isinstance(lin, nn.Linear) or conv):
            raise ValueError(f"{name}: has a weight_scale but is a {type(lin).__name__}, not an nn.Linear or a "
                             "3x3 nn.Conv2d")
        w8, s_w, s_in = (tensors.get(f"{name}.{t}") for t in ("weight", "weight_scale", "input_scale"))
        if w8 is None or s_in is None:
            raise ValueError(f"{name}: weight_scale without weight / input_scale")
        if w8.dtype != FP8 or tuple(w8.shape) != tuple(lin.weight.shape):
            raise ValueError(f"{name}.weight: {w8.dtype} {tuple(w8.shape)}, the contract wants {FP8} "
                             f"{tuple(lin.weight.shape)}")
        for label, s, n in (("weight_scale", s_w, w8.shape[0] if conv else 1), ("input_scale", s_in, 1)):
            if s.dtype != torch.float32 or s.numel() != n or not bool((torch.isfinite(s) & (s > 0)).all()):
                raise ValueError(f"{name}.{label}: {s.dtype} {tuple(s.shape)} {s.flatten()[:1].tolist()}, the contract "
                                 f"wants {n} finite positive float32 value(s)")
        if (lin.bias is None) != (f"{name}.bias" not in tensors):
            raise ValueError(f"{name}: the bias of the export and the UNet's disagree")
        dev, dtype = lin.weight.device, lin.weight.dtype
        bias = tensors[f"{name}.bias"].to(dev) if lin.bias is not None else None
        if conv:
            emu = EmulatedFp8Conv2d(w8.to(dev), s_w.to(dev), s_in.to(dev), bias, lin.stride[0], dtype)
        else:
            emu = EmulatedFp8Linear(w8.to(dev), s_w.to(dev), s_in.to(dev), bias, dtype)
        _set_submodule(unet, name, emu)
    return names


@torch.no_grad()
def fuse_lora_files_fp8(pipe, specs: list[tuple[str, float]], originals: dict | None = None) -> dict:
    """reference.lora_reference.fuse_lora_files on a pipeline whose UNet went through emulate_fp8_unet:
    the text encoders and the UNet's other layers fused as there; each quantised layer a LoRA touches
    gets W = W8 * s_w + delta (delta the sum of the specs' weight * alpha/rank * up @ down in fp32),
    s_w' = s_w up to amax|W| = 464 * s_w, amax|W| / 448 beyond (a LoRA far beyond the export's range
    coarsens the layer's steps instead of being clipped) and W8' = sat(round(W / s_w')), quantised once.

    The delta comes from fuse_lora_files itself: during the fuse each quantised layer is stood in for
    by an fp32 nn.Linear of zeros, so what the fuse leaves there is fused - base with base = 0, i.e.
    the merge's delta, exactly (no cancellation against the weight). Returns fuse_lora_files' counts
    plus "unet_fp8": how many quantised layers changed and "unet_fp8_rescaled": how many of them got a
    larger s_w. originals: as fuse_lora_files' (the e4m3 weights and their scales are kept too), so
    lora_reference.restore_originals undoes everything."""
    from reference.lora_reference import fuse_lora_files

    unet = pipe.unet
    fp8 = {n: m for n, m in unet.named_modules() if isinstance(m, EmulatedFp8Linear)}
    stand_ins = {}
    for n, m in fp8.items():
        lin = nn.Linear(m.in_features, m.out_features, bias=False, device=m.weight8.device, dtype=torch.float32)
        lin.weight.requires_grad_(False).zero_()
        stand_ins[n] = lin
        _set_submodule(unet, n, lin)
    try:
        counts = fuse_lora_files(pipe, specs, originals)  # the stand-ins' zeros among originals: harmless
    finally:
        for n, m in fp8.items():
            _set_submodule(unet, n, m)
    changed = rescaled = 0
    for n, m in fp8.items():
        delta = stand_ins[n].weight
        if not bool(delta.any()):
            continue
        if originals is not None:
            for t in (m.weight8, m.weight_scale):
                originals.setdefault(id(t), (t, t.clone()))
        merged = m.dequantized() + delta
        amax = merged.abs().amax()
        scale = torch.where(amax > KEEP_SCALE_UP_TO * m.weight_scale, amax / E4M3_MAX, m.weight_scale)
        rescaled += int(bool(scale > m.weight_scale))
        m.weight_scale.copy_(scale)
        m.weight8.copy_(to_e4m3(merged, m.weight_scale))
        changed += 1
    counts["unet_fp8"], counts["unet_fp8_rescaled"] = changed, rescaled
    return counts
