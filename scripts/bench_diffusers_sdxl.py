#!/usr/bin/env python3
"""Time diffusers' StableDiffusionXLPipeline on a model directory saved by
export_sdxl.py --save-diffusers: seconds per image (after warm-up) and peak GPU
memory, at the settings sdxl-batch is measured with. Writes one JSON object.

    bench_diffusers_sdxl.py --diffusers DIR --out FILE.json [--steps 28 --cfg 7 --size 1024
                            --batch 1 --images 2 --dtype fp16 --png FIRST.png --seed 1]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--diffusers", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompt", default="comic panel, a lighthouse keeper in a storm, bold ink lines")
    ap.add_argument("--negative", default="blurry, lowres")
    ap.add_argument("--steps", type=int, default=28)
    ap.add_argument("--cfg", type=float, default=7.0)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--images", type=int, default=2, help="timed pipeline calls after one warm-up call")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--png", help="save the first timed image here (same seed as sdxl-batch's)")
    a = ap.parse_args()
    from diffusers import StableDiffusionXLPipeline

    t0 = time.perf_counter()
    pipe = StableDiffusionXLPipeline.from_pretrained(a.diffusers, dtype=DTYPES[a.dtype], local_files_only=True)
    pipe = pipe.to("cuda")
    pipe.set_progress_bar_config(disable=True)
    load_s = time.perf_counter() - t0

    def call(seed: int):
        gens = [torch.Generator("cpu").manual_seed(seed + i) for i in range(a.batch)]
        return pipe(prompt=[a.prompt] * a.batch, negative_prompt=[a.negative] * a.batch, num_inference_steps=a.steps,
                    guidance_scale=a.cfg, width=a.size, height=a.size, generator=gens).images

    call(a.seed)  # warm-up (cuDNN autotuning, allocator growth)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for k in range(a.images):
        t = time.perf_counter()
        imgs = call(a.seed)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        if k == 0 and a.png:
            imgs[0].save(a.png)
    per_image = min(times) / a.batch
    res = {"tool": "diffusers", "dtype": a.dtype, "batch": a.batch, "size": a.size, "steps": a.steps, "cfg": a.cfg,
           "load_s": load_s, "call_s": times, "s_per_image": per_image, "images_per_hour": 3600.0 / per_image,
           "peak_allocated_bytes": torch.cuda.max_memory_allocated(), "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
           "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
