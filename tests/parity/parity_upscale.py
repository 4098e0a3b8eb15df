#!/usr/bin/env python3
"""Parity (ctest parity_upscale_cpu): upscaler folders (export_sdxl.py --upscaler) vs spandrel, CPU, fp32.

reference.upscaler_fixtures writes one file per supported layout (ESRGAN old keys, Real-ESRGAN x4 /
x2 / x1 with pixel-unshuffle, Anime6B, Compact, SwinIR) with random weights. ONE export call makes
every folder (--upscaler-tile 64: SwinIR is traced at 64 x 64). Each folder's upscaler.ts (its weights
cast to fp32) is run through ComfyUI's tiled upscale (reference.upscaler_fixtures.comfy_upscale) on a
167 x 101 image at tile 64, overlap 16 (several tiles, feathered seams, short tiles at the borders),
against spandrel's own module on the original file through the same tiling: PSNR >= --min-psnr.
A fixed-tile module (tile.fixed in model.json) runs every tile padded by reflection to its size and
the output cropped (the runtime's rule); spandrel's module takes each tile as it is.
Also checks model.json (kind, scale, architecture, dtype: fp16 exactly where spandrel says
supports_half) and that each refused file (reference.upscaler_fixtures.REFUSED) fails the export with
exit 1, a message naming the file and why, and nothing left in --out.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from reference.upscaler_fixtures import FIXTURES, REFUSED, comfy_upscale, write_fixtures
from testkit import run

TILE, OVERLAP, W, H = 64, 16, 167, 101
EXPECT = {  # fixture -> (architecture id, scale, dtype, fixed tile)
    "esrgan_old_x4": ("ESRGAN", 4, "fp16", False), "realesrgan_x4": ("ESRGAN", 4, "fp16", False),
    "realesrgan_x2": ("ESRGAN", 2, "fp16", False), "realesrgan_x1": ("ESRGAN", 1, "fp16", False),
    "anime6b_x4": ("ESRGAN", 4, "fp16", False), "compact_x4": ("Compact", 4, "fp16", False),
    "swinir_x2": ("SwinIR", 2, "fp32", True),
}


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.double() - b.double()) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


def fixed_tile(ts, size: int, scale: int):
    """A module traced at size x size run on a smaller tile: padded to size (by reflection where the tile
    is more than half the size, else by replicating the edge), the output cropped."""
    def call(x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[2:]
        mode = "reflect" if size - w < w and size - h < h else "replicate"
        y = ts(F.pad(x, (0, size - w, 0, size - h), mode=mode))
        return y[:, :, : h * scale, : w * scale]
    return call


def check_refused(a, src: Path, work: Path) -> list[str]:
    """Each REFUSED file, exported beside a good one: exit 1, its name and reason in the message, no --out."""
    errors = []
    for name, why in REFUSED.items():
        out = work / f"refused-{name}"
        shutil.rmtree(out, ignore_errors=True)
        r = run([a.python, a.source / "scripts/export_sdxl.py", "--upscaler", src / "compact_x4.pth", src / name,
                 "--out", out], timeout=120)
        msg = (r.stderr.strip().splitlines() or [""])[-1]
        ok = r.returncode == 1 and name in msg and why in msg and not out.exists()
        print(f"refused {name:24} rc={r.returncode} {'ok' if ok else 'FAIL'}: {msg[:150]}")
        if not ok:
            errors.append(f"{name}: rc {r.returncode}, out left: {out.exists()}, message: {msg[:300]}")
    return errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--python", required=True)
    ap.add_argument("--source", required=True, type=Path)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--min-psnr", type=float, default=40.0)
    a = ap.parse_args()
    from spandrel import ModelLoader

    torch.set_num_threads(1)
    t0 = time.time()
    shutil.rmtree(a.work, ignore_errors=True)
    src, out = a.work / "files", a.work / "upscalers"
    paths = write_fixtures(src)
    r = run([a.python, a.source / "scripts/export_sdxl.py", "--upscaler", *paths, "--upscaler-tile", TILE,
             "--out", out], timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"export failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    print(f"export of {len(paths)} files: {time.time() - t0:.1f} s")
    image = torch.rand(1, 3, H, W, generator=torch.Generator().manual_seed(3))
    errors, rows = [], []
    for f in FIXTURES:
        stem = Path(f).stem
        meta = json.loads((out / stem / "model.json").read_text())
        got = (meta["kind"], meta["architecture"]["id"], meta["scale"], meta["dtype"], meta["tile"]["fixed"])
        if got != ("upscaler", *EXPECT[stem]):
            errors.append(f"{stem}: model.json says {got}, expected {('upscaler', *EXPECT[stem])}")
        ts = torch.jit.load(str(out / stem / "upscaler.ts"), map_location="cpu").float()
        scale = meta["scale"]
        ours_fn = fixed_tile(ts, meta["tile"]["size"], scale) if meta["tile"]["fixed"] else ts
        ref_model = ModelLoader("cpu").load_from_file(src / f).model.eval().float()
        ours = comfy_upscale(ours_fn, scale, image, TILE, OVERLAP)
        ref = comfy_upscale(ref_model, scale, image, TILE, OVERLAP)
        p = psnr(ours, ref) if ours.shape == ref.shape else float("-inf")
        ok = p >= a.min_psnr and tuple(ours.shape[2:]) == (H * scale, W * scale)
        rows.append(dict(case=stem, shape=f"{ours.shape[3]}x{ours.shape[2]}", psnr=p, ok=ok))
        print(f"{stem:16} {meta['architecture']['name']:20} x{scale} {rows[-1]['shape']:>9} {p:8.2f} dB"
              + ("" if ok else "  FAIL"))
        if not ok:
            errors.append(f"{stem}: PSNR {p:.2f} dB (< {a.min_psnr}) or wrong size {rows[-1]['shape']}")
    errors += check_refused(a, src, a.work)
    (a.work / "parity_upscale.json").write_text(json.dumps(rows, indent=1, default=str))
    print(f"total {time.time() - t0:.1f} s")
    if errors:
        print("FAIL:\n  " + "\n  ".join(errors))
        return 1
    print(f"all {len(rows)} upscalers >= {a.min_psnr} dB, {len(REFUSED)} files refused by name")
    return 0


if __name__ == "__main__":
    sys.exit(main())
