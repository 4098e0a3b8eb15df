#!/usr/bin/env python3
"""The loop sdxl-batch's `upscale` is measured against: spandrel's model and ComfyUI's tile-by-tile
upscale (ImageUpscaleWithModel over comfy.utils.tiled_scale, as tests/reference/upscaler_fixtures.py
reimplements it: tiles on the GPU, blended on the CPU), then a LANCZOS resize to the target and a PNG
written as ComfyUI's SaveImage writes it (compress_level 4). One image after another, timed per image
after a warm-up image; peak GPU memory from torch.

  upscale_bench.py --model FILE --images DIR --scale S --out DIR [--dtype fp32|fp16] [--json FILE]
  upscale_bench.py --make-rrdbnet FILE        a full-size 4x RRDBNet (23 blocks, 64 features), random weights,
                                              in Real-ESRGAN's key layout (params_ema)
  upscale_bench.py --make-panels DIR N SIZE   N panel-like PNGs of SIZE x SIZE
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from reference.upscaler_fixtures import realesrgan, tiled_scale


def make_panels(folder: Path, n: int, size: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    for i in range(n):
        px = np.zeros((size, size, 3), np.uint8)
        px[:] = np.linspace(30, 230, size, dtype=np.uint8)[None, :, None]
        for _ in range(12):  # flat blocks with ink-like edges: what a comic panel holds
            b = max(8, size // 6)
            x, y = rng.integers(0, size - b, 2)
            px[y:y + b, x:x + b] = rng.integers(0, 256, 3)
            px[y:y + b, x:x + 4] = 0
        Image.fromarray(px, "RGB").save(folder / f"panel{i:02d}.png")


def loop(a: argparse.Namespace) -> dict:
    from spandrel import ModelLoader
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    dtype = torch.float16 if a.dtype == "fp16" else torch.float32
    model = ModelLoader().load_from_file(a.model).eval().to(dev, dtype)
    scale = model.scale
    a.out.mkdir(parents=True, exist_ok=True)
    fn = lambda t: model.model(t.to(dtype)).float().cpu()  # noqa: E731  ComfyUI: tiles back to the CPU
    times = []
    files = sorted(a.images.glob("*.png"))
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for k, f in enumerate([files[0]] + files):  # the first one twice: a warm-up, not timed
        sync()
        t0 = time.perf_counter()
        img = np.asarray(Image.open(f).convert("RGB"), dtype=np.float32) / 255.0
        x = torch.from_numpy(img).permute(2, 0, 1)[None].to(dev)
        with torch.no_grad():
            y = tiled_scale(x, fn, 512, 512, 32, scale).clamp(0, 1)
        up = Image.fromarray((y[0].permute(1, 2, 0).numpy() * 255.0).clip(0, 255).astype(np.uint8))
        w, h = round(img.shape[1] * a.scale), round(img.shape[0] * a.scale)
        if up.size != (w, h):
            up = up.resize((w, h), Image.LANCZOS)
        up.save(a.out / f.name, compress_level=4)
        sync()
        if k:
            times.append(time.perf_counter() - t0)
    return {"loop": "spandrel + ComfyUI tiled_scale + PIL LANCZOS + SaveImage", "dtype": a.dtype,
            "images": len(times), "s_per_image": sum(times) / len(times), "times": times,
            "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--make-rrdbnet", type=Path)
    ap.add_argument("--make-panels", nargs=3, metavar=("DIR", "N", "SIZE"))
    ap.add_argument("--model", type=Path)
    ap.add_argument("--images", type=Path)
    ap.add_argument("--scale", type=float, default=2.0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--device", default="cuda", help="cuda (the measurement) or cpu (a smoke test)")
    a = ap.parse_args()
    if a.make_rrdbnet:
        torch.save({"params_ema": realesrgan(64, 32, 23, 3, torch.Generator().manual_seed(1))}, a.make_rrdbnet)
        return
    if a.make_panels:
        make_panels(Path(a.make_panels[0]), int(a.make_panels[1]), int(a.make_panels[2]))
        return
    r = loop(a)
    print(json.dumps({k: v for k, v in r.items() if k != "times"}))
    if a.json:
        a.json.write_text(json.dumps(r, indent=1) + "\n")


if __name__ == "__main__":
    main()
