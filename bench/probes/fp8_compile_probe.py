#!/usr/bin/env python3
"""Probe (GPU machine): how fast is the FP8 UNet once Inductor fuses its input quantisation,
and where does the time of a compiled step go?

The full-size SDXL UNet with random weights (fp16, cuda), one CFG batch of --rows rows at
1024² (latent 128x128, 77 tokens). torch.compile (mode default, static shapes) of:
  fp16  the UNet as diffusers builds it;
  fp8   the same UNet with scripts/fp8_quant.py's layers (the layers export_sdxl.py --fp8
        quantises; input scales from one forward pass on the same inputs: the speed does
        not depend on their values).
For each: compile seconds (first call), then the median of --iters timed calls (CUDA
events), TFLOP/s from the UNet's FLOPs (13.52 TFLOP per CFG pair at 1024²), and the top
kernels of two profiled calls. Results are written to --out/fp8-compile-probe.json after
each stage, so a cut-off run keeps what it measured.

This is torch.compile, not the AOTInductor package sdxl-batch loads; both lower the graph
with Inductor, so the step time is what unet_fp8.pt2 should reach (to be confirmed by
bench/gpu_runtime.sh fp8-aoti).

    python3 bench/probes/fp8_compile_probe.py --out DIR [--rows 8] [--iters 20] [--only fp8]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import fp8_quant  # noqa: E402
from export_sdxl import architecture  # noqa: E402

TFLOP_PER_PAIR = 13.52  # UNet FLOPs of one CFG pair (2 rows) at 1024² (bench/results speed tables)


def build_unet():
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    with torch.device("cuda"):
        torch.set_default_dtype(torch.float16)
        unet = UNet2DConditionModel(**architecture("full")["unet"])
        torch.set_default_dtype(torch.float32)
    return unet.eval().requires_grad_(False)


def inputs(rows: int):
    g = torch.Generator("cuda").manual_seed(1)
    lat = torch.randn(rows, 4, 128, 128, generator=g, device="cuda", dtype=torch.float16)
    t = torch.full((rows,), 500.0, device="cuda")
    ctx = torch.randn(rows, 77, 2048, generator=g, device="cuda", dtype=torch.float16)
    added = {"text_embeds": torch.randn(rows, 1280, generator=g, device="cuda", dtype=torch.float16),
             "time_ids": torch.tensor([[1024, 1024, 0, 0, 1024, 1024]] * rows, device="cuda", dtype=torch.float16)}
    return lat, t, ctx, added


def calibrate_one_pass(unet, inp) -> dict[str, float]:
    lat, t, ctx, added = inp
    with fp8_quant.input_amax(unet, fp8_quant.fp8_layer_names(unet)) as amax:
        unet(lat, t, ctx, added_cond_kwargs=added)
    return amax


def timed(fn, iters: int) -> list[float]:
    out = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return out


def top_kernels(fn, n: int = 12) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            rows.append({"kernel": e.key[:90], "calls": e.count // 2, "ms_per_step": t / 2 / 1000.0})
    rows.sort(key=lambda r: -r["ms_per_step"])
    return rows[:n]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=8, help="UNet rows per call (CFG: 2 per image)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--only", choices=["fp16", "fp8"])
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"rows": a.rows, "iters": a.iters, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
           "variants": {}}

    def save():
        (out / "fp8-compile-probe.json").write_text(json.dumps(res, indent=1))

    t0 = time.time()
    unet = build_unet()
    inp = inputs(a.rows)
    res["build_s"] = round(time.time() - t0, 1)
    for variant in ("fp16", "fp8"):
        if a.only and variant != a.only:
            continue
        if variant == "fp8":
            with torch.no_grad():
                n = fp8_quant.quantize_unet(unet, calibrate_one_pass(unet, inp))
            res["fp8_layers"] = n
        torch._dynamo.reset()
        compiled = torch.compile(unet)
        lat, t, ctx, added = inp

        def step():
            with torch.no_grad():
                return compiled(lat, t, ctx, added_cond_kwargs=added).sample

        t0 = time.time()
        step()
        torch.cuda.synchronize()
        compile_s = time.time() - t0
        ms = sorted(timed(step, a.iters))
        med = ms[len(ms) // 2]
        tflops = TFLOP_PER_PAIR * (a.rows / 2) / (med / 1000.0)
        res["variants"][variant] = {"compile_s": round(compile_s, 1), "step_ms_median": round(med, 2),
                                    "step_ms_min": round(ms[0], 2), "ms_per_image_step": round(med / (a.rows / 2), 2),
                                    "tflops_fp16_equivalent": round(tflops, 1),
                                    "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}
        print(f"{variant}: compile {compile_s:.1f} s, step {med:.2f} ms (rows {a.rows}), "
              f"{med / (a.rows / 2):.2f} ms per image-step, {tflops:.0f} TFLOP/s", flush=True)
        save()
        res["variants"][variant]["top_kernels"] = top_kernels(step)
        save()
    if "fp16" in res["variants"] and "fp8" in res["variants"]:
        res["fp8_speedup"] = round(res["variants"]["fp16"]["step_ms_median"] / res["variants"]["fp8"]["step_ms_median"], 3)
        print(f"fp8 / fp16 step speed-up: {res['fp8_speedup']}x", flush=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
