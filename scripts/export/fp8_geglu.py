"""FP8 (e4m3) feed-forward of the FP8 UNet's transformer blocks with GEGLU fused into the first GEMM
(issue 44, item 2): one Triton kernel computes proj(x) = x @ W^T for the hidden and the gate halves of
diffusers' GEGLU, applies the scales and biases, hidden * gelu(gate) (exact erf GELU) and writes the
result as e4m3 quantised with the output layer's static input scale, so the [M, 2I] fp16 intermediate
and the separate GEGLU + quantise kernel of today's FP8 UNet (fp8_quant.Fp8Linear) disappear.
Registered as the custom op `torch.ops.sdxl.fp8_geglu` with torch.library.triton_op, so torch.export +
AOTInductor compile the kernel into unet_fp8.pt2. export_sdxl.py --fp8 --fp8-geglu (experimental, off)
swaps it in after the quantisation (fuse_geglu). On the H200 it gains about 1.6 % of the FP8 run, as much
as two leases differ (bench/lab/2026-12-fp8-unet/results/2026-12-05-fp8-geglu-conv-h200.md; bench/runtime/fp8geglu.sh).

Contract of the op (the first layer is an Fp8Linear of K inputs and 2I outputs, fp8_quant's contract):
  x8         float8_e4m3fn [M, K] contiguous   sat(x / x_scale), the rows of the block's normed input
  x_scale    float32 [] or [1]                 the first layer's static input_scale
  w8         float8_e4m3fn [2I, K] contiguous  the first layer's weight as Fp8Linear stores it: rows
                                               0..I-1 the hidden half, rows I..2I-1 the gate half
  w_scale    float32 [] or [1]                 its weight_scale (per tensor)
  bias       [2I] (any float dtype) or None    its bias
  out_scale  float32 [] or [1], or None        the output layer's static input_scale
  p = (x8 * x_scale) @ (w8 * w_scale)^T + bias       products of e4m3 values accumulated in fp32 (on sm_90
                                                     Triton's fp8 dot accumulates as _scaled_mm's use_fast_accum)
  y = p[:, :I] * gelu(p[:, I:])                      gelu(g) = g/2 * (1 + erf(g / sqrt 2)), fp32
  returns fp16 [M, I] (y rounded once) when out_scale is None, else e4m3 [M, I] = sat(y / out_scale)
  (the division in fp32, then one round-to-nearest-even to e4m3; sat() clamps to +-448).
Against today's path (fp16 [M, 2I] out of _scaled_mm, GEGLU in fp16, the quotient rounded to fp16
before e4m3) only roundings differ: the fused kernel rounds once, from fp32.

Design: each program owns an [BLOCK_M, BLOCK_N] tile of y and keeps two fp32 accumulators, one for the
hidden columns n and one for the gate columns I + n, fed by the same A tile (one load of x per K step,
two wgmma). The weight keeps Fp8Linear's layout (LoRAs patch that tensor in place; an interleaved copy
would have to be rebuilt after every patch). Two BLOCK_N-wide accumulators cost the registers of one
2*BLOCK_N tile. K must be a multiple of BLOCK_K (SDXL: 640 and 1280); M and I may end in partial tiles.
Two variants (KERNELS): `ptr` loads the tiles with masked pointer loads, `tma` through TMA descriptors
(as fp8_conv's tma_w); the op launches `ptr` (or the variant SDXL_FP8_GEGLU_KERNEL names: kernel_variant)
with the probe's best configuration on the H200 (kernel_config).

On the CPU the op runs geglu_reference (the contract in torch, fp32). Traced by torch.jit (unet_fp8.ts
cannot hold a Triton kernel), or inside fp8_conv.emulated() (the reference of unet_fp8.ts's check), the
swapped module runs the unfused layers (Fp8Linear, GEGLU in the model dtype, Fp8Linear: FeedForward's own
forward), so unet_fp8.ts is the unfused one bit for bit, _scaled_mm on CUDA included (faster there than
geglu_reference's matmul of dequantised weights); only unet_fp8.pt2 runs the fused kernel.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from . import fp8_conv
from .fp8_conv import _tile_ids  # also applies fp8_conv's interpreter fix (TRITON_INTERPRET=1)
from .fp8_quant import E4M3_MAX, FP8, Fp8Linear, quantize_tensor

import triton
import triton.language as tl

OP = "sdxl::fp8_geglu"
FORMAT = ("e4m3fn feed-forward: GEGLU fused into the first GEMM (static per-tensor scales, fp32 "
          "accumulation, erf GELU in fp32), e4m3 out with the output layer's input scale")


@triton.jit
def _geglu_epilogue(acc_h, acc_g, out_ptr, bias_ptr, wscale_ptr, xscale_ptr, oscale_ptr, offs_m, offs_n, M, I,
                    HAS_BIAS: tl.constexpr, OUT_FP8: tl.constexpr):
    """Scales, biases, h * gelu(g) in fp32, then fp16 or sat(y / out_scale) as e4m3 into out [M, I]."""
    m_ok = offs_m < M
    n_ok = offs_n < I
    scale = tl.load(xscale_ptr) * tl.load(wscale_ptr)
    h = acc_h * scale
    g = acc_g * scale
    if HAS_BIAS:
        h += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        g += tl.load(bias_ptr + I + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y = h * (0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476)))
    ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * I + offs_n[None, :]
    mask = m_ok[:, None] & n_ok[None, :]
    if OUT_FP8:
        q = tl.minimum(tl.maximum(y / tl.load(oscale_ptr), -448.0), 448.0)
        tl.store(ptrs, q.to(tl.float8e4nv), mask=mask)
    else:
        tl.store(ptrs, y.to(tl.float16), mask=mask)


@triton.jit
def _fp8_geglu_kernel(x_ptr, w_ptr, out_ptr, bias_ptr, wscale_ptr, xscale_ptr, oscale_ptr, M, K, I,
                      HAS_BIAS: tl.constexpr, OUT_FP8: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """`ptr`: A and both weight tiles by masked pointer loads (pipelined by Triton into wgmma)."""
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, I, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < I
    a_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * K + offs_k[None, :]
    h_ptrs = w_ptr + offs_n.to(tl.int64)[None, :] * K + offs_k[:, None]  # [BLOCK_K, BLOCK_N]: W^T's tile
    # The gate half: rows I + n. Scalar arguments get no tensor methods: torch's mutation analysis
    # (torch.export) specialises them to Python ints, and a failed analysis makes every argument an output.
    g_ptrs = w_ptr + (offs_n.to(tl.int64) + I)[None, :] * K + offs_k[:, None]
    acc_h = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs + k, mask=m_ok[:, None], other=0.0)
        bh = tl.load(h_ptrs + k, mask=n_ok[None, :], other=0.0)
        bg = tl.load(g_ptrs + k, mask=n_ok[None, :], other=0.0)
        acc_h = tl.dot(a, bh, acc_h)
        acc_g = tl.dot(a, bg, acc_g)
    _geglu_epilogue(acc_h, acc_g, out_ptr, bias_ptr, wscale_ptr, xscale_ptr, oscale_ptr, offs_m, offs_n, M, I,
                    HAS_BIAS, OUT_FP8)


@triton.jit
def _fp8_geglu_tma(x_ptr, w_ptr, out_ptr, bias_ptr, wscale_ptr, xscale_ptr, oscale_ptr, M, K, I,
                   HAS_BIAS: tl.constexpr, OUT_FP8: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """`tma`: A and the weight tiles through TMA descriptors (the copy engine zero-fills past M and 2I; a
    partial last hidden tile reads gate rows into columns the epilogue does not store)."""
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, I, BLOCK_M, BLOCK_N, GROUP_M)
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[2 * I, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    acc_h = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = x_desc.load([pid_m * BLOCK_M, k])
        bh = w_desc.load([pid_n * BLOCK_N, k])
        bg = w_desc.load([I + pid_n * BLOCK_N, k])
        acc_h = tl.dot(a, bh.T, acc_h)
        acc_g = tl.dot(a, bg.T, acc_g)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    _geglu_epilogue(acc_h, acc_g, out_ptr, bias_ptr, wscale_ptr, xscale_ptr, oscale_ptr, offs_m, offs_n, M, I,
                    HAS_BIAS, OUT_FP8)


KERNELS = {"ptr": _fp8_geglu_kernel, "tma": _fp8_geglu_tma}
KERNEL_ENV = "SDXL_FP8_GEGLU_KERNEL"


def kernel_variant() -> str:
    """The variant the op launches: `ptr`, or the one SDXL_FP8_GEGLU_KERNEL names (read when the op is
    traced: torch.export bakes it into unet_fp8.pt2). ValueError for a name that is not in KERNELS."""
    name = os.environ.get(KERNEL_ENV, "").strip() or "ptr"
    if name not in KERNELS:
        raise ValueError(f"{KERNEL_ENV}={name!r}: not one of {', '.join(KERNELS)}")
    return name


def _cdiv(a, b):
    return (a + b - 1) // b


def block_k(k: int) -> int:
    """The largest K step of 128, 64, 32, 16 that divides K."""
    return next(b for b in (128, 64, 32, 16) if k % b == 0)


def kernel_config(k: int, i: int) -> dict:
    """The configuration the op launches: the autotuned best e4m3 `ptr` configuration per SDXL shape on the
    H200 (bench/lab/2026-12-fp8-unet/results/2026-12-05-fp8-kernels-h200/fp8-geglu-triton.json): 128x128 tiles (two
    accumulators: the registers of a 128x256 GEMM tile), 8 warps; K 640 in K steps of 64 with 4 stages,
    K 1280 (and other K) in the largest K step dividing K with 3 stages."""
    if k == 640:
        return dict(BLOCK_M=128, BLOCK_N=128 if i >= 128 else 64, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=4)
    return dict(BLOCK_M=128, BLOCK_N=128 if i >= 128 else 64, BLOCK_K=block_k(k), GROUP_M=8,
                num_warps=8, num_stages=3)


def launch(x8, x_scale, w8, w_scale, bias, out_scale, out, cfg: dict, wrap=None, impl: str = "ptr") -> None:
    """Runs kernel impl (KERNELS) with configuration cfg ({BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages[,
    GROUP_M]}) into out ([M, I], fp16 when out_scale is None, else e4m3); wrap: torch.library.wrap_triton
    inside the op. `tma` run eagerly on a GPU needs Triton's scratch allocator (fp8_conv.ensure_descriptor_scratch)."""
    m, k = x8.shape
    i = w8.shape[0] // 2
    cfg = dict(cfg)
    nw, ns = cfg.pop("num_warps"), cfg.pop("num_stages")
    cfg.setdefault("GROUP_M", 8)
    grid = (_cdiv(m, cfg["BLOCK_M"]) * _cdiv(i, cfg["BLOCK_N"]),)
    kernel = KERNELS[impl] if wrap is None else wrap(KERNELS[impl])
    # Unused pointer arguments (no bias, fp16 out) get w_scale: never read.
    kernel[grid](x8, w8, out, w_scale if bias is None else bias, w_scale, x_scale,
                 w_scale if out_scale is None else out_scale, m, k, i,
                 HAS_BIAS=bias is not None, OUT_FP8=out_scale is not None, **cfg, num_warps=nw, num_stages=ns)


def geglu_reference(x8: torch.Tensor, x_scale: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor,
                    bias: torch.Tensor | None, out_scale: torch.Tensor | None,
                    compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The op's math in torch (module docstring): dequantised in fp32, matmul and GEGLU in compute_dtype
    (fp32: the exact reference), fp16 or e4m3 out."""
    x = (x8.float() * x_scale.float().reshape(())).to(compute_dtype)
    w = (w8.float() * w_scale.float().reshape(())).to(compute_dtype)
    p = x @ w.t()
    if bias is not None:
        p = p + bias.to(compute_dtype)
    h, g = p.float().chunk(2, dim=-1)
    y = h * F.gelu(g)
    if out_scale is None:
        return y.to(torch.float16)
    return quantize_tensor(y, out_scale.float().reshape(()))


def _check_args(x8, w8, bias) -> None:
    torch._check(x8.dim() == 2 and w8.dim() == 2, lambda: "fp8_geglu: x8 [M, K], w8 [2I, K]")
    torch._check(w8.shape[1] == x8.shape[1] and w8.shape[0] % 2 == 0,
                 lambda: f"fp8_geglu: weight {tuple(w8.shape)} does not fit input {tuple(x8.shape)}")
    torch._check(bias is None or bias.shape == (w8.shape[0],), lambda: "fp8_geglu: bias [2I]")
    torch._check(x8.shape[1] % 16 == 0, lambda: "fp8_geglu: K a multiple of 16")


def _define_op():
    from torch.library import triton_op, wrap_triton

    @triton_op(OP, mutates_args=())
    def fp8_geglu_op(x8: torch.Tensor, x_scale: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor,
                     bias: torch.Tensor | None, out_scale: torch.Tensor | None) -> torch.Tensor:
        # The CUDA implementation; traced by torch.export (and run on fake tensors for shapes), so
        # torch ops and wrap_triton kernels only.
        _check_args(x8, w8, bias)
        x8, w8 = x8.contiguous(), w8.contiguous()  # no-ops for the module's tensors
        m, k = x8.shape
        i = w8.shape[0] // 2
        out = x8.new_empty((m, i), dtype=torch.float16 if out_scale is None else FP8)
        impl = kernel_variant()
        fp8_conv.ensure_descriptor_scratch(impl)
        launch(x8, x_scale, w8, w_scale, bias, out_scale, out, kernel_config(k, i), wrap=wrap_triton, impl=impl)
        return out

    @fp8_geglu_op.register_kernel("cpu")
    def _(x8, x_scale, w8, w_scale, bias, out_scale):
        _check_args(x8, w8, bias)
        return geglu_reference(x8, x_scale, w8, w_scale, bias, out_scale)

    return fp8_geglu_op


_fp8_geglu_op = _define_op()


def fp8_geglu(x8: torch.Tensor, x_scale: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor,
              bias: torch.Tensor | None = None, out_scale: torch.Tensor | None = None) -> torch.Tensor:
    """torch.ops.sdxl.fp8_geglu (module docstring): fp16 [M, I] when out_scale is None, else e4m3 [M, I]."""
    return torch.ops.sdxl.fp8_geglu(x8, x_scale, w8, w_scale, bias, out_scale)


# ------------------------------------------------------------------------------------------------ module


class Fp8GegluFeedForward(nn.Module):
    """A diffusers FeedForward (GEGLU, dropout, output linear) of the FP8 UNet whose GEGLU runs as the
    fused op and whose output layer takes the op's e4m3 rows. Same submodules and tensor names as the
    module it replaces (net.0.proj and net.2 stay the Fp8Linear layers: the LoRA patcher and
    fp8_conv.load_quantized_state find them where they were)."""

    def __init__(self, ff: nn.Module) -> None:
        super().__init__()
        self.net = ff.net

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if fp8_conv.torch_path():
            # unet_fp8.ts (no Triton kernel in TorchScript): the unfused layers, FeedForward's own forward:
            # _scaled_mm, GEGLU in the model dtype, _scaled_mm on CUDA, the unfused unet_fp8.ts bit for bit.
            for m in self.net:
                hidden_states = m(hidden_states)
            return hidden_states
        proj, out = self.net[0].proj, self.net[2]
        x8 = quantize_tensor(hidden_states.reshape(-1, proj.in_features), proj.input_scale).contiguous()
        h8 = torch.ops.sdxl.fp8_geglu(x8, proj.input_scale, proj.weight, proj.weight_scale, proj.bias, out.input_scale)
        y = out.matmul_e4m3(h8)
        return y.reshape(hidden_states.shape[:-1] + (out.out_features,))


def _fusable(ff: nn.Module) -> bool:
    from diffusers.models.activations import GEGLU

    net = getattr(ff, "net", None)
    if not isinstance(net, nn.ModuleList) or len(net) != 3 or not isinstance(net[0], GEGLU):
        return False
    proj, drop, out = net[0].proj, net[1], net[2]
    return (isinstance(proj, Fp8Linear) and isinstance(out, Fp8Linear) and isinstance(drop, nn.Dropout)
            and proj.out_features == 2 * out.in_features and out.in_features % 16 == 0)


def fuse_geglu(unet: nn.Module) -> int:
    """Replaces, in place, each diffusers FeedForward of the quantised UNet (fp8_quant.quantize_unet)
    whose GEGLU projection and output layer are both Fp8Linear by an Fp8GegluFeedForward; returns how
    many. The rest of the UNet is untouched."""
    from diffusers.models.attention import FeedForward

    names = [n for n, m in unet.named_modules() if isinstance(m, FeedForward) and _fusable(m)]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = unet.get_submodule(parent_name) if parent_name else unet
        setattr(parent, child, Fp8GegluFeedForward(getattr(parent, child)))
    return len(names)


__all__ = ["E4M3_MAX", "FORMAT", "KERNEL_ENV", "KERNELS", "OP", "Fp8GegluFeedForward", "fp8_geglu", "fuse_geglu",
           "geglu_reference", "kernel_config", "kernel_variant", "launch"]
