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
With --runner (sdxl_upscaler_runner, the C++ runtime image/upscaler.h in ONE process for every folder,
up to 3 tiles of one shape per model call, as the upscale command batches them on a GPU),
the runtime's output is compared with the same reference too (PSNR >= --min-psnr).
With --binary, `sdxl-batch upscale` (one process; a second one must resume and write nothing) takes a
PNG with A1111 parameters to a 300 x 200 frame (--upscale-fit crop) with Real-ESRGAN x4, against
spandrel's model, ComfyUI's 8-bit conversion, PIL's LANCZOS and the centre crop; the PNG's parameters
must keep the source's and add A1111's Postprocess fields. LANCZOS alone to a padded frame must equal PIL
exactly, and --upscale 0 is refused.
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


def run_runtime(a, out: Path, image: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every folder through the C++ runtime (one sdxl_upscaler_runner process) -> {stem: [1,3,H*s,W*s]}."""
    inp = a.work / "input.npy"
    np.save(inp, image.numpy().astype(np.float32))
    pairs = [(out / Path(f).stem, a.work / f"runtime-{Path(f).stem}.npy") for f in FIXTURES]
    t = time.time()
    r = run([a.runner, f"{TILE}:3", OVERLAP, inp, *[x for p in pairs for x in p]], timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"sdxl_upscaler_runner failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    print(f"runtime on {len(pairs)} folders: {time.time() - t:.1f} s")
    return {folder.name: torch.from_numpy(np.load(npy)) for folder, npy in pairs}


FRAME = (300, 200)  # the frame of the command's check, W x H (crop)


def reference_frame(model, image: torch.Tensor, scale: int) -> np.ndarray:
    """A1111's upscale_with_model to FRAME with crop: model passes (ComfyUI's tiling, 8-bit truncation) while
    smaller than the resize size, PIL LANCZOS to it, the centre cut out."""
    from PIL import Image

    h, w = image.shape[2:]
    k = max(FRAME[0] / w, FRAME[1] / h)
    rw, rh = max(round(w * k), FRAME[0]), max(round(h * k), FRAME[1])
    x = image
    for _ in range(3):
        if x.shape[3] >= rw and x.shape[2] >= rh:
            break
        x = torch.from_numpy(np.clip(255.0 * comfy_upscale(model, scale, x).numpy(), 0, 255).astype(np.uint8))
        x = x.float() / 255.0
    pil = Image.fromarray((x[0].permute(1, 2, 0).numpy() * 255.0).round().astype(np.uint8))
    arr = np.asarray(pil.resize((rw, rh), Image.LANCZOS))
    sx, sy = (rw - FRAME[0]) // 2, (rh - FRAME[1]) // 2
    return arr[sy:sy + FRAME[1], sx:sx + FRAME[0]]


def check_command(a, src: Path, out: Path, image: torch.Tensor) -> list[str]:
    """`sdxl-batch upscale` on one PNG with Real-ESRGAN x4 to FRAME (crop), then the same again (resumed)."""
    from PIL import Image, PngImagePlugin
    from spandrel import ModelLoader

    inp = a.work / "cmd-in"
    inp.mkdir(parents=True, exist_ok=True)
    u8 = (image[0].permute(1, 2, 0).numpy() * 255.0).round().astype(np.uint8)
    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", "a fox\nSteps: 20, Sampler: Euler, Seed: 7, Size: 167x101")
    Image.fromarray(u8).save(inp / "panel.png", pnginfo=info)
    dst = a.work / "cmd-out"
    shutil.rmtree(dst, ignore_errors=True)
    cmd = [a.binary, "upscale", "--upscale-model", out / "realesrgan_x4", "--upscale-size", f"{FRAME[0]}x{FRAME[1]}",
           "--upscale-fit", "crop", "--device", "cpu", "--out", dst, inp]
    errors, t = [], time.time()
    for attempt in ("first", "resumed"):
        r = run(cmd, timeout=120)
        if r.returncode != 0:
            return [f"sdxl-batch upscale ({attempt}) failed ({r.returncode}): {(r.stderr or r.stdout)[-1500:]}"]
        if attempt == "resumed" and "0 written, 1 already done" not in r.stdout:
            errors.append(f"the second run did not resume: {r.stdout.strip()[-300:]}")
    print(f"sdxl-batch upscale, two runs: {time.time() - t:.1f} s")
    png = Image.open(dst / "panel.png")
    params = png.text.get("parameters", "")
    want = ("Steps: 20, Sampler: Euler, Seed: 7, Size: 167x101, Postprocess upscale to: 300x200, "
            "Postprocess upscale fit: crop, Postprocess upscaler: realesrgan_x4")
    if not params.endswith(want) or not params.startswith("a fox\n"):
        errors.append(f"parameters: {params!r}, expected to end with {want!r}")
    ours = torch.from_numpy(np.asarray(png.convert("RGB")).astype(np.float64) / 255.0)
    model = ModelLoader("cpu").load_from_file(src / "realesrgan_x4.pth").model.eval().float()
    ref = torch.from_numpy(reference_frame(model, image, 4).astype(np.float64) / 255.0)
    p = psnr(ours, ref) if ours.shape == ref.shape else float("-inf")
    print(f"sdxl-batch upscale realesrgan_x4 -> {FRAME[0]}x{FRAME[1]} crop: {p:.2f} dB")
    if p < a.min_psnr:
        errors.append(f"sdxl-batch upscale: PSNR {p:.2f} dB < {a.min_psnr} (shape {tuple(ours.shape)})")
    report = json.loads((dst / "report.json").read_text())
    if report.get("skipped") != 1 or report.get("failed") != 0:
        errors.append(f"report.json of the resumed run: {report}")
    return errors + check_lanczos_pad(a, inp, u8)


def check_lanczos_pad(a, inp: Path, u8: np.ndarray) -> list[str]:
    """--upscale-model Lanczos to 200 x 300 with pad == PIL LANCZOS to the fitting size centred on black (exact);
    --upscale 0 refused (exit 2, naming the flag)."""
    from PIL import Image

    dst = a.work / "cmd-pad"
    shutil.rmtree(dst, ignore_errors=True)
    r = run([a.binary, "upscale", "--upscale-model", "Lanczos", "--upscale-size", "200x300", "--upscale-fit", "pad",
             "--out", dst, inp / "panel.png"], timeout=60)
    if r.returncode != 0:
        return [f"sdxl-batch upscale Lanczos pad failed ({r.returncode}): {(r.stderr or r.stdout)[-800:]}"]
    h, w = u8.shape[:2]
    k = min(200 / w, 300 / h)
    rw, rh = min(round(w * k), 200), min(round(h * k), 300)
    want = np.zeros((300, 200, 3), np.uint8)
    oy, ox = (300 - rh) // 2, (200 - rw) // 2
    want[oy:oy + rh, ox:ox + rw] = np.asarray(Image.fromarray(u8).resize((rw, rh), Image.LANCZOS))
    got = np.asarray(Image.open(dst / "panel.png").convert("RGB"))
    errors = [] if got.shape == want.shape and np.array_equal(got, want) else [
        f"Lanczos pad: {got.shape} differs from PIL's (max diff "
        f"{np.abs(got.astype(int) - want).max() if got.shape == want.shape else 'n/a'})"]
    r = run([a.binary, "upscale", "--upscale-model", "Lanczos", "--upscale", "0", "--out", dst, inp], timeout=60)
    if r.returncode != 2 or "--upscale '0'" not in r.stderr + r.stdout:
        errors.append(f"--upscale 0: exit {r.returncode}, {(r.stderr + r.stdout).strip()[-200:]}")
    print(f"Lanczos pad 200x300: {'exact' if not errors else 'FAIL'}")
    return errors


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
    ap.add_argument("--runner", help="sdxl_upscaler_runner: also check the C++ runtime")
    ap.add_argument("--binary", help="sdxl-batch: also check `sdxl-batch upscale`")
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
    runtime = run_runtime(a, out, image) if a.runner else {}
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
        cpp = runtime.get(stem)
        pc = (psnr(cpp, ref) if cpp.shape == ref.shape else float("-inf")) if cpp is not None else float("nan")
        ok = ok and (cpp is None or pc >= a.min_psnr)
        rows.append(dict(case=stem, shape=f"{ours.shape[3]}x{ours.shape[2]}", psnr_export=p, psnr_runtime=pc, ok=ok))
        print(f"{stem:16} {meta['architecture']['name']:20} x{scale} {rows[-1]['shape']:>9} export {p:8.2f} dB"
              f"  runtime {pc:8.2f} dB" + ("" if ok else "  FAIL"))
        if not ok:
            errors.append(f"{stem}: PSNR export {p:.2f} / runtime {pc:.2f} dB (< {a.min_psnr}) or wrong size")
    if a.binary:
        errors += check_command(a, src, out, image)
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
