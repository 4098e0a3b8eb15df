#!/usr/bin/env python3
"""Probe (GPU machine): is FP8 self-attention faster than the fp16 attention the UNet runs now,
at SDXL's shapes, and how far is it from fp16?

The self-attention of SDXL's transformer blocks at 1024² (head dim 64): level 1, 10 heads over
4,096 tokens (10 blocks), and level 2, 20 heads over 1,024 tokens (60 blocks), for --rows rows
(CFG: 2 per image). For each shape, the median of --iters calls (CUDA events) of:
  sdpa-fp16        F.scaled_dot_product_attention, fp16 (what the compiled UNet runs: cuDNN/flash)
  flex-fp16        flex_attention, compiled, fp16 (the Triton template, to tell the template's
                   speed from FP8's)
  flex-fp8         flex_attention, compiled, on e4m3 q, k, v given as inputs (the kernel alone;
                   v column-major as the template wants it), the q/k scales in a score_mod
  flex-fp8-quant   the same with the quantisation of fp16 q, k, v inside the compiled function
                   (what a UNet would run), each quantised tensor pinned to a fixed layout by
                   as_strided (Inductor's flex lowering cannot index a freshly computed e4m3
                   buffer: "convert FlexibleLayout to FixedLayout first"; in torch 2.11 it fails
                   with the pin too -- bench/lab/2026-12-fp8-unet/results/2026-12-03-fp8-attention-h200.md)
Each output is compared with sdpa-fp16 (relative L2). Results: --out/fp8-attention-probe.json.

    python3 bench/lab/2026-12-fp8-unet/fp8_attention_probe.py --out DIR [--rows 16] [--iters 20]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fp8_compile_probe import column_major, flex_on_fp8, fp8_flex_attention, quantize_amax, timed  # noqa: E402
from export import fp8_quant  # noqa: E402  (scripts/ is on sys.path through fp8_compile_probe)

SHAPES = {"level1 (10 heads x 4096 tokens)": (10, 4096), "level2 (20 heads x 1024 tokens)": (20, 1024)}
# Self-attention calls per UNet call: 10 transformer blocks at level 1, 60 at level 2 (with the mid block).
CALLS_PER_STEP = {"level1 (10 heads x 4096 tokens)": 10, "level2 (20 heads x 1024 tokens)": 60}


def timed_ms(fn, iters: int) -> float:
    return sorted(timed(fn, iters))[iters // 2]


def make_fns():
    from torch.nn.attention.flex_attention import flex_attention

    flex = torch.compile(flex_attention)

    def flex_fp8(q8, k8, v8, sq, sk, sv):
        return flex_on_fp8(flex, q8, k8, v8, sq, sk, sv).half()

    @torch.compile
    def flex_fp8_quant(q, k, v):
        return fp8_flex_attention(flex_attention, q, k, v, pin=True).half()

    return flex, flex_fp8, flex_fp8_quant


def rel_l2(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def scaled_mm_fp8_output() -> dict:
    """Whether torch._scaled_mm writes e4m3 directly (a q/k/v projection that needs no separate
    quantise kernel), and which way its scale_result works: the relative L2 of the e4m3 output
    against the fp32 product if scale_result multiplies it, and if it divides it."""
    g = torch.Generator("cuda").manual_seed(2)
    x = torch.randn(4096, 1280, generator=g, device="cuda")
    w = torch.randn(1280, 1280, generator=g, device="cuda") / 1280 ** 0.5
    (x8, sx), (w8, sw) = quantize_amax(x), quantize_amax(w)
    ref = (x8.float() * sx) @ (w8.float() * sw).t()
    s_out = ref.abs().amax() / fp8_quant.E4M3_MAX
    try:
        y = torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, scale_result=s_out, out_dtype=torch.float8_e4m3fn,
                             use_fast_accum=True)
        y2 = torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, scale_result=1 / s_out,
                              out_dtype=torch.float8_e4m3fn, use_fast_accum=True)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e)[:500]}"}
    return {"scale_result=s, output*s": round(rel_l2(y.float() * s_out, ref), 5),
            "scale_result=1/s, output*s": round(rel_l2(y2.float() * s_out, ref), 5)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"rows": a.rows, "iters": a.iters, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
           "shapes": {}}
    res["scaled_mm_fp8_output"] = scaled_mm_fp8_output()
    print("scaled_mm e4m3 output:", res["scaled_mm_fp8_output"], flush=True)
    flex, flex_fp8, flex_fp8_quant = make_fns()
    g = torch.Generator("cuda").manual_seed(0)
    for name, (heads, n) in SHAPES.items():
        q, k, v = (torch.randn(a.rows, heads, n, 64, generator=g, device="cuda", dtype=torch.float16) for _ in range(3))
        (q8, sq), (k8, sk), (v8, sv) = quantize_amax(q), quantize_amax(k), quantize_amax(v)
        v8c = column_major(v8)
        flops = 4 * a.rows * heads * n * n * 64
        ref = F.scaled_dot_product_attention(q, k, v)
        r = {}
        for label, fn in (("sdpa-fp16", lambda: F.scaled_dot_product_attention(q, k, v)),
                          ("flex-fp16", lambda: flex(q, k, v)),
                          ("flex-fp8", lambda: flex_fp8(q8, k8, v8c, sq, sk, sv)),
                          ("flex-fp8-quant", lambda: flex_fp8_quant(q, k, v))):
            t0 = time.time()
            try:
                o = fn()
                torch.cuda.synchronize()
                first_s = time.time() - t0
                ms = timed_ms(fn, a.iters)
                r[label] = {"ms": round(ms, 3), "tflops": round(flops / ms / 1e9, 1), "first_call_s": round(first_s, 1),
                            "ms_per_unet_step": round(ms * CALLS_PER_STEP[name], 2), "rel_l2_vs_sdpa": round(rel_l2(o, ref), 5)}
            except Exception as e:  # a variant Inductor cannot compile: say why, measure the others
                r[label] = {"error": f"{type(e).__name__}: {str(e)[:1500]}"}
            print(f"{name} {label}: {r[label] if 'error' not in r[label] else r[label]['error'][:300]}", flush=True)
            res["shapes"][name] = r
            (out / "fp8-attention-probe.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
