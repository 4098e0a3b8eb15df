#!/usr/bin/env python3
"""Probe (GPU machine): how long does SDXL's VAE decode take per image at 1024², as sdxl-batch
runs it (the traced vae_decoder.ts, fp16, one image per call) and compiled by Inductor, and
where does its time go?

The full-size SDXL VAE with random weights (fp16, cuda), latents of 128x128 (1024² images).
Variants (each: first-call seconds, median ms per image over --iters calls, a kernel profile
by class, relative L2 against "ts"):
  ts            torch.jit.trace of export_sdxl.py's VaeDecoderTS, NCHW: what the program runs
  ts-cl         the same trace, weights and input channels-last (eager layout propagation)
  compile       torch.compile, static shapes (Inductor picks channels-last itself)
  compile-dyn   torch.compile with dynamic latent height and width, as a package for any
                image size would be (Inductor keeps NCHW for dynamic convolutions)
  compile-dyn-cl  compile-dyn with force_layout_optimization=True (channels-last anyway)
--batch N (default 1) decodes N images per call; times are per image. The VAE's FLOPs at
1024² (about 10 TFLOP per image) give TFLOP/s. Results go to --out/vae-decode-probe.json after
each variant.

    python3 bench/lab/2026-12-vae-decode/vae_decode_probe.py --out DIR [--batch 1] [--iters 10] [--variants ts,compile]
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "scripts"))
# the timing and profiling helpers of the FP8 lab (timed, profile_kernels, rel_l2)
sys.path.insert(0, str(REPO / "bench" / "lab" / "2026-12-fp8-unet"))
from export.architecture import architecture  # noqa: E402  (scripts/export/, the export's package)
from export.sdxl_modules import VaeDecoderTS  # noqa: E402
from fp8_compile_probe import profile_kernels, rel_l2, timed  # noqa: E402

VARIANTS = ("ts", "ts-cl", "compile", "compile-dyn", "compile-dyn-cl")


def vae_flops(lat_h: int, lat_w: int) -> float:
    """FLOPs of one decode (convolutions, linear layers and attention), counted with
    torch.utils.flop_counter on the meta device."""
    from diffusers import AutoencoderKL
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"), FlopCounterMode(display=False) as fc:
        meta = AutoencoderKL(**architecture("full")["vae"]).to(torch.float16)
        meta.decode(torch.zeros(1, 4, lat_h, lat_w, dtype=torch.float16))
    return float(fc.get_total_flops())


def build_vae():
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(**architecture("full")["vae"]).to("cuda", torch.float16).eval().requires_grad_(False)


def channels_last(mod: torch.nn.Module) -> None:
    for p in mod.parameters():
        if p.dim() == 4:
            p.data = p.data.contiguous(memory_format=torch.channels_last)


def decoder_for(variant: str, vae, z):
    """The callable a variant times, and the Inductor settings its first call compiles under."""
    if variant == "ts-cl":  # a copy: the other variants keep the NCHW weights
        vae = copy.deepcopy(vae)
        channels_last(vae)
    wrapper = VaeDecoderTS(vae, z.dtype).eval()
    if variant.startswith("ts"):
        with torch.no_grad():
            return torch.jit.trace(wrapper, (z,), check_trace=False), contextlib.nullcontext()
    torch._dynamo.reset()
    settings = (torch._inductor.config.patch(force_layout_optimization=True)
                if variant == "compile-dyn-cl" else contextlib.nullcontext())
    return torch.compile(wrapper, dynamic=variant.startswith("compile-dyn")), settings


def measure(variant: str, vae, z, iters: int, flops_per_image: float) -> tuple[dict, torch.Tensor]:
    fn, settings = decoder_for(variant, vae, z)
    x = z.contiguous(memory_format=torch.channels_last) if variant == "ts-cl" else z

    def step():
        with torch.no_grad():
            return fn(x)

    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    with settings:
        out = step()
        torch.cuda.synchronize()
    first_s = time.time() - t0
    ms = sorted(timed(step, iters))
    per_image = ms[len(ms) // 2] / z.shape[0]
    r = {"first_call_s": round(first_s, 1), "ms_per_image_median": round(per_image, 2),
         "ms_per_image_min": round(ms[0] / z.shape[0], 2),
         "tflops": round(flops_per_image / (per_image / 1000.0) / 1e12, 1),
         "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}
    r.update(profile_kernels(step))
    classes = ", ".join(f"{c} {v['ms_per_step']}" for c, v in r["by_class"].items())
    print(f"{variant}: first call {first_s:.1f} s, {per_image:.2f} ms per image ({r['tflops']} TFLOP/s); "
          f"kernels per call {r['kernel_ms_per_step']} ms: {classes}", flush=True)
    return r, out.float().clone()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=1, help="images per decode call")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of " + ",".join(VARIANTS))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    vae = build_vae()
    z = torch.randn(a.batch, 4, 128, 128, generator=torch.Generator("cuda").manual_seed(1), device="cuda",
                    dtype=torch.float16)
    flops = vae_flops(128, 128)
    res = {"batch": a.batch, "iters": a.iters, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
           "tflop_per_image": round(flops / 1e12, 2), "variants": {}}
    outputs = {}
    for variant in (v for v in VARIANTS if v in a.variants.split(",")):
        try:
            res["variants"][variant], outputs[variant] = measure(variant, vae, z, a.iters, flops)
        except Exception as e:  # a variant that cannot run: say why, measure the others
            res["variants"][variant] = {"error": f"{type(e).__name__}: {str(e)[:2000]}"}
            print(f"{variant}: failed: {res['variants'][variant]['error'][:400]}", flush=True)
        if "ts" in outputs and variant in outputs and variant != "ts":
            res["variants"][variant]["rel_l2_vs_ts"] = round(rel_l2(outputs[variant], outputs["ts"]), 5)
        (out / "vae-decode-probe.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
