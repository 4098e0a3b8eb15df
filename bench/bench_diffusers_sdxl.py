#!/usr/bin/env python3
"""Time diffusers' StableDiffusionXLPipeline on a model directory saved by
export_sdxl.py --save-diffusers: seconds per image (after warm-up) and peak GPU
memory, at the settings sdxl-batch is measured with. One JSON object per
configuration, printed as one line (and appended to --jsonl); --out keeps the
last one as a file (what gpu_skeleton.sh reads).

    bench_diffusers_sdxl.py --diffusers DIR --out FILE.json [--steps 28 --cfg 7 --size 1024
                            --batch 1 --images 2 --dtype fp16 --png FIRST.png --seed 1]
    bench_diffusers_sdxl.py --diffusers DIR --configs eager:1,eager:4,compile:1 --jsonl rows.jsonl
                            [--compile-mode default --deadline-s 300 --device cuda]

A configuration is MODE:BATCH, MODE eager or compile (torch.compile of the
UNet, --compile-mode). The pipeline is loaded once; each configuration runs one
warm-up call (for compile: the compilation, reported as compile_s = warm-up
call - mean timed call) and --images timed calls of BATCH images.
s_per_image = the best timed call / BATCH; s_per_image_mean = the mean.
Peak memory: torch.cuda.max_memory_allocated over the timed calls (weights
included); on the CPU the process's peak resident set instead.
--deadline-s: a configuration that cannot start before this many seconds after
the start is recorded as skipped (so a time-boxed caller still gets the rows
that finished).
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import traceback

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
MODES = ("eager", "compile")


def parse_configs(text: str) -> list[tuple[str, int]]:
    out = []
    for item in text.split(","):
        mode, _, batch = item.strip().partition(":")
        if mode not in MODES or not batch.isdigit() or int(batch) < 1:
            raise SystemExit(f"--configs: '{item}' is not MODE:BATCH with MODE in {MODES} and BATCH >= 1")
        out.append((mode, int(batch)))
    return out


def main() -> int:
    t_start = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--diffusers", required=True)
    ap.add_argument("--out", help="write the last configuration's JSON object here")
    ap.add_argument("--jsonl", help="append each configuration's JSON object here as soon as it is measured")
    ap.add_argument("--prompt", default="comic panel, a lighthouse keeper in a storm, bold ink lines")
    ap.add_argument("--negative", default="blurry, lowres")
    ap.add_argument("--steps", type=int, default=28)
    ap.add_argument("--cfg", type=float, default=7.0)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1, help="batch of the single eager configuration (without --configs)")
    ap.add_argument("--configs", help="MODE:BATCH,... e.g. eager:1,eager:4,compile:1 (default eager:--batch)")
    ap.add_argument("--compile-mode", default="default",
                    help="torch.compile mode: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs")
    ap.add_argument("--compile-backend", default="inductor",
                    help="torch.compile backend (inductor; the CPU smoke test uses eager: dynamo without code generation)")
    ap.add_argument("--images", type=int, default=2, help="timed pipeline calls after one warm-up call")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (the CPU only for smoke tests)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--deadline-s", type=float, default=0, help="skip configurations that would start after this (0: none)")
    ap.add_argument("--png", help="save the first timed image of the first configuration here")
    a = ap.parse_args()
    configs = parse_configs(a.configs) if a.configs else [("eager", a.batch)]
    if a.images < 1 or a.steps < 1 or a.size % 8:
        ap.error("--images and --steps must be >= 1, --size a multiple of 8")
    cuda = a.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        ap.error(f"--device {a.device}: no CUDA device visible to torch")
    from diffusers import StableDiffusionXLPipeline

    t0 = time.perf_counter()
    pipe = StableDiffusionXLPipeline.from_pretrained(a.diffusers, dtype=DTYPES[a.dtype], local_files_only=True)
    pipe = pipe.to(a.device)
    pipe.set_progress_bar_config(disable=True)
    load_s = time.perf_counter() - t0
    eager_unet = pipe.unet

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def call(batch: int, seed: int):
        gens = [torch.Generator("cpu").manual_seed(seed + i) for i in range(batch)]
        return pipe(prompt=[a.prompt] * batch, negative_prompt=[a.negative] * batch, num_inference_steps=a.steps,
                    guidance_scale=a.cfg, width=a.size, height=a.size, generator=gens).images

    last = None
    failed = 0
    for ci, (mode, batch) in enumerate(configs):
        res = {"tool": "diffusers", "mode": mode, "batch": batch, "dtype": a.dtype, "size": a.size, "steps": a.steps,
               "cfg": a.cfg, "load_s": load_s, "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name() if cuda else "cpu"}
        if mode == "compile":
            res["compile_mode"] = a.compile_mode if a.compile_backend == "inductor" else f"backend {a.compile_backend}"
        elapsed = time.perf_counter() - t_start
        if a.deadline_s and elapsed > a.deadline_s:
            res["error"] = f"skipped: {elapsed:.0f} s elapsed, past --deadline-s {a.deadline_s:.0f}"
        else:
            try:
                pipe.unet = torch.compile(eager_unet, mode=a.compile_mode, backend=a.compile_backend) if mode == "compile" else eager_unet
                sync()
                t = time.perf_counter()
                call(batch, a.seed)  # warm-up (compilation, cuDNN autotuning, allocator growth)
                sync()
                warm_s = time.perf_counter() - t
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                times = []
                for k in range(a.images):
                    t = time.perf_counter()
                    imgs = call(batch, a.seed)
                    sync()
                    times.append(time.perf_counter() - t)
                    if k == 0 and ci == 0 and a.png:
                        imgs[0].save(a.png)
                mean = sum(times) / len(times)
                res.update({"warmup_s": warm_s, "call_s": times, "s_per_image": min(times) / batch,
                            "s_per_image_mean": mean / batch, "images_per_hour": 3600.0 * batch / mean})
                if mode == "compile":
                    res["compile_s"] = max(0.0, warm_s - mean)
                if cuda:
                    res["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
                    res["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
                else:  # ru_maxrss is KiB on Linux: the whole process so far
                    res["peak_allocated_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
                    res["peak_memory_note"] = "process peak RSS"
            except Exception as e:  # noqa: BLE001  (one failed configuration must not lose the others)
                traceback.print_exc(file=sys.stderr)
                res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                if cuda:
                    torch.cuda.empty_cache()
        line = json.dumps(res)
        print(line, flush=True)
        if a.jsonl:
            with open(a.jsonl, "a") as f:
                f.write(line + "\n")
        last = res
        failed += "error" in res
    if a.out and last is not None:
        with open(a.out, "w") as f:
            json.dump(last, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
