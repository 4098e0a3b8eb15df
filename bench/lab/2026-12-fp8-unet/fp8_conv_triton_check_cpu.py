#!/usr/bin/env python3
"""CPU check of the probe fp8_conv_triton.py's kernels (beside it) under TRITON_INTERPRET=1 (no GPU), at
one tiny shape against fp32 references. It checks the probe's own code: its autotuning wrapper, the
residual epilogue and its GroupNorm + SiLU kernel, none of which the product runs; the product's
convolution (scripts/export/fp8_conv.py) is tested by tests/gpu_kernels/test_fp8_conv_op.py.

    .venv/bin/python bench/lab/2026-12-fp8-unet/fp8_conv_triton_check_cpu.py [--all-impls]   # about 6 s


- conv3x3_fp8 (the pointer kernel, stride 1 with bias and residual, and stride 2; the TMA kernels too
  with --all-impls): against an fp32 convolution of the dequantised e4m3 inputs (only the fp16 output's
  rounding remains: relative L2 < 2e-3) and of the original fp32 inputs (the quantisation's error:
  < 0.06); every output element written (the output is poisoned with NaN first).
- groupnorm_silu_fp8 with an fp16 output against fp32 GroupNorm + SiLU (< 2e-3). Its e4m3 output is not
  checked here: Triton 3.6's interpreter rounds some fp32 -> e4m3 conversions wrongly (7.9 -> 4.0, a
  mantissa carry lost), which the GPU's cvt does not; the GPU probe checks it.

Exit 0: pass; 1: a check failed; 77: Triton is not installed.
"""
from __future__ import annotations

import os
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    import triton  # noqa: E402,F401
except ImportError:
    print("SKIP: triton is not installed")
    sys.exit(77)

import fp8_conv_triton as K  # noqa: E402

CFG = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "BW": 8, "num_warps": 4, "num_stages": 2}


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def conv_check(impl: str, stride: int, residual: bool, g: torch.Generator) -> list[str]:
    n, h, ci, co = 1, 8, 32, 48  # Cout 48: a partial N tile; h 8: padding on every side of each tile
    x = torch.randn(n, h, h, ci, generator=g)
    w = torch.randn(co, 3, 3, ci, generator=g) / (9 * ci) ** 0.5
    b = (torch.randn(co, generator=g) * 0.1).half()
    xs = (x.abs().amax() / K.E4M3_MAX).reshape(1)
    ws = w.abs().amax(dim=(1, 2, 3)) / K.E4M3_MAX
    x8 = (x / xs).clamp(-448, 448).to(torch.float8_e4m3fn)
    w8 = (w / ws.view(-1, 1, 1, 1)).clamp(-448, 448).to(torch.float8_e4m3fn)
    ho = (h - 1) // stride + 1
    res = torch.randn(n, ho, ho, co, generator=g).half() if residual else None
    out = torch.full((n, ho, ho, co), float("nan"), dtype=torch.float16)
    K.conv3x3_fp8(x8, xs, w8, ws, b, res, stride=stride, impl=impl, config=CFG, out=out)

    def conv(xx, ww):
        y = F.conv2d(xx.permute(0, 3, 1, 2), ww.permute(0, 3, 1, 2), b.float(), padding=1, stride=stride)
        return y.permute(0, 2, 3, 1) + (res.float() if residual else 0)

    exact = conv(x8.float() * xs, w8.float() * ws.view(-1, 1, 1, 1))
    e_exact, e_fp32 = rel(out, exact), rel(out, conv(x, w))
    tag = f"conv {impl} stride {stride}{' + residual' if residual else ''}"
    print(f"{tag}: rel L2 vs dequantised {e_exact:.2e}, vs fp32 {e_fp32:.4f}")
    fails = []
    if not torch.isfinite(out).all():
        fails.append(f"{tag}: output not all written / not finite")
    if not e_exact < 2e-3:
        fails.append(f"{tag}: {e_exact} against the dequantised reference")
    if not e_fp32 < 0.06:
        fails.append(f"{tag}: {e_fp32} against fp32")
    return fails


def gn_check(g: torch.Generator) -> list[str]:
    x = (torch.randn(1, 6, 6, 96, generator=g) * 2 + 0.5).half()  # 36 rows: a partial row block
    gamma, beta = (1 + 0.2 * torch.randn(96, generator=g)).half(), (0.2 * torch.randn(96, generator=g)).half()
    ref = F.silu(F.group_norm(x.float().permute(0, 3, 1, 2), 32, gamma.float(), beta.float(), 1e-5)).permute(0, 2, 3, 1)
    y = K.groupnorm_silu_fp8(x, gamma, beta, None, splits=2, block_hw=16)
    e = rel(y, ref)
    print(f"groupnorm + silu (fp16 out): rel L2 vs fp32 {e:.2e}")
    return [] if e < 2e-3 else [f"groupnorm: {e} against fp32"]


def main() -> int:
    t0 = time.time()
    g = torch.Generator().manual_seed(0)
    fails = conv_check("ptr", 1, True, g) + conv_check("ptr", 2, False, g)
    if "--all-impls" in sys.argv:
        fails += conv_check("tma_w", 1, False, g) + conv_check("tma", 1, True, g)
    fails += gn_check(g)
    print(f"{time.time() - t0:.1f} s")
    for f in fails:
        print("FAIL:", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
