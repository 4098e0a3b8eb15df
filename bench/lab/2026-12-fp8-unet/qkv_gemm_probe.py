#!/usr/bin/env python3
"""Probe (GPU machine): would one FP8 GEMM for a self-attention's q, k and v projections be faster
than the three the FP8 UNet runs now, at SDXL's shapes?

The self-attention projections of SDXL's transformer blocks at 1024², for --rows rows (CFG: 2 per
image): level 1, 640 channels over 4,096 tokens (10 blocks), level 2, 1,280 channels over 1,024
tokens (60 blocks). Each: three torch._scaled_mm calls (e4m3 input and weights, per-tensor scales,
fp16 output, the FP8 UNet's matmul) against one on the three weights concatenated (q, k and v
then being column slices of its output, which attention takes as they are). Median of --iters
calls (CUDA events); the ms per UNet step it would save. Results: --out/qkv-gemm-probe.json.

    python3 bench/lab/2026-12-fp8-unet/qkv_gemm_probe.py --out DIR [--rows 16] [--iters 50]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from cudnn_fp8_probe import median_ms  # this lab folder is the script's sys.path[0]
from fp8_compile_probe import quantize_amax

# (name, channels, tokens, blocks per UNet step)
CASES = [("level 1", 640, 4096, 10), ("level 2", 1280, 1024, 60)]


def case(rows: int, c: int, tokens: int, blocks: int, iters: int) -> dict:
    g = torch.Generator("cuda").manual_seed(c)
    x8, sx = quantize_amax(torch.randn(rows * tokens, c, generator=g, device="cuda", dtype=torch.float16))
    ws = [quantize_amax(torch.randn(c, c, generator=g, device="cuda", dtype=torch.float16) / c ** 0.5)
          for _ in range(3)]
    s_cat = max(s for _, s in ws)  # the three weights [3c, c] under one scale (their largest)
    w_cat8 = torch.cat([(w.float() * (s / s_cat)).to(torch.float8_e4m3fn) for w, s in ws])

    def three():
        return [torch._scaled_mm(x8, w.t(), scale_a=sx, scale_b=s, out_dtype=torch.float16) for w, s in ws]

    def one():
        y = torch._scaled_mm(x8, w_cat8.t(), scale_a=sx, scale_b=s_cat, out_dtype=torch.float16)
        return y[:, :c], y[:, c:2 * c], y[:, 2 * c:]

    ref, got = three(), one()
    err = max(float((a.float() - b.float()).norm() / a.float().norm()) for a, b in zip(ref, got))
    t3, t1 = median_ms(three, iters), median_ms(one, iters)
    flop = 2 * rows * tokens * c * 3 * c
    return {"rows": rows, "channels": c, "tokens": tokens, "blocks_per_step": blocks, "three_ms": round(t3, 4),
            "one_ms": round(t1, 4), "tflops_three": round(flop / t3 / 1e9, 1), "tflops_one": round(flop / t1 / 1e9, 1),
            "saving_ms_per_step": round(blocks * (t3 - t1), 3), "rel_l2_one_vs_three": round(err, 5)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("qkv_gemm_probe: no CUDA device here; run it on the GPU machine", file=sys.stderr)
        return 2
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cases": {name: case(a.rows, c, t, b, a.iters) for name, c, t, b in CASES}}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "qkv-gemm-probe.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
