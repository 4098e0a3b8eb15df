#!/usr/bin/env python3
"""Parity (ctest parity_detect_cpu): `sdxl-batch detect` on detector folders (export_sdxl.py --detector) vs
Ultralytics' own predict on the same checkpoints, CPU.

reference.detector_fixtures writes YOLOv8n (detect, 1 class), YOLO11n (detect, 2 classes: class-aware NMS)
and YOLOv8n-seg (segment) checkpoints with seeded random weights in Ultralytics' published checkpoint
format, their class bias set so that real detections happen, and four PNGs of different sizes and
aspects (landscape, portrait, smaller than the input: scaled up, larger: scaled down). Each is exported
(without network when `unshare -n` is available: Ultralytics must not need it), then ONE `sdxl-batch
detect` process per folder runs every image. The reference is YOLO(checkpoint).predict with the same
conf, iou 0.7, imgsz and rect=False (the fixed-size letterbox of a fixed-size TorchScript model, as
Ultralytics' predict on the exported module uses), on the CPU. Per image: the same number of
detections in the same order (detections whose scores tie within 1e-5 may swap: such ties sort by
float noise on either side), boxes within 0.5 px, scores within 1e-3, the same classes; for the seg
model the mask areas (Ultralytics' masks brought to the image by its scale_masks, > 0.5) within 1%.
The letterbox alone (sdxl_letterbox_runner) equals Ultralytics' LetterBox byte for byte on these and on
noise images of odd sizes. Also: model.json (kind, task, classes, imgsz); each refused file (pose, classification, obb, truncated,
a state dict, a bare pickle, a zip whose pickle names an Ultralytics class and calls os.system) fails the export with exit 1, a
message naming the file and why, and no --out; bad `detect` input (confidence 0 or above 1, a missing
or unreadable image, a truncated one after a good one, a folder that is not a detector folder) fails with
a clear message and prints no detection.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from reference.detector_fixtures import DETECT, IMAGES, IMGSZ, offline_env, write_fixtures
from testkit import run

CONF, IOU = 0.25, 0.7
REFUSED = {"pose_yolov8n-pose.pt": "pose", "cls_yolov8n-cls.pt": "classification", "obb_yolov8n-obb.pt": "obb",
           "truncated.pt": "truncated", "not_ultralytics.pt": "not an Ultralytics checkpoint",
           "evil.pt": "bare pickle", "evil_zip.pt": "not a loadable Ultralytics checkpoint"}


def offline_prefix() -> list[str]:
    """`unshare -n` (a process without network) where this machine allows it, else nothing."""
    ok = shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0
    return ["unshare", "-n"] if ok else []


def export(a, prefix: list[str], src: Path, out: Path):
    return run([*prefix, a.python, a.source / "scripts/export_sdxl.py", "--detector", src, "--out", out], timeout=300)


def reference(ckpt: Path, images: list[Path], task: str) -> dict[str, list[dict]]:
    """Ultralytics' predict: {image name: [{box, score, class, mask_area}]}."""
    import torch
    from ultralytics import YOLO
    from ultralytics.utils import ops

    torch.set_num_threads(1)  # as the fixtures: a second OpenMP thread only waits on a busy 2-core machine
    model = YOLO(str(ckpt), task=task)
    out = {}
    for path in images:
        r = model.predict(str(path), conf=CONF, iou=IOU, imgsz=IMGSZ, rect=False, device="cpu", max_det=300,
                          verbose=False)[0]
        rows = []
        areas = []
        if r.masks is not None:
            scaled = ops.scale_masks(r.masks.data[None].float(), r.orig_shape)[0] > 0.5
            areas = [int(m.sum()) for m in scaled]
        for i, d in enumerate(r.boxes.data.tolist()):
            rows.append({"box": d[:4], "score": d[4], "class": int(d[5]), "mask_area": areas[i] if areas else None})
        out[path.name] = rows
    return out


def ours(a, folder: Path, images: list[Path]) -> tuple[dict[str, list[dict]], float]:
    t = time.time()
    r = run([a.binary, "detect", "--detector", folder, "--confidence", CONF, "--device", "cpu", *images], timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"sdxl-batch detect failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    got: dict[str, list[dict]] = {p.name: [] for p in images}
    for line in r.stdout.splitlines():
        j = json.loads(line)
        got[Path(j["image"]).name].append({"box": [j["x1"], j["y1"], j["x2"], j["y2"]], "score": j["score"],
                                           "class": j["class"], "name": j["name"], "mask_area": j.get("mask_area"),
                                           "size": (j["width"], j["height"])})
    return got, time.time() - t


TIE = 1e-5  # scores this close have no defined order between the two implementations
WORST = {"box px": 0.0, "score": 0.0, "mask area %": 0.0}  # the largest differences seen


def compare(name: str, classes: list[str], got: list[dict], want: list[dict]) -> list[str]:
    errs = []
    if len(got) != len(want):
        return [f"{name}: {len(got)} detections, Ultralytics {len(want)}"]
    used: set[int] = set()
    for i, g in enumerate(got):
        # Scores that tie within TIE sort either way (both sides' sums differ by float noise): the
        # detection at i is matched within want's run of tied scores around i, nearest box first.
        tied = [j for j in range(len(want)) if j not in used and abs(want[j]["score"] - want[i]["score"]) <= TIE
                and all(abs(want[k]["score"] - want[i]["score"]) <= TIE for k in range(min(i, j), max(i, j) + 1))]
        j = min(tied or [i], key=lambda k: max(abs(x - y) for x, y in zip(g["box"], want[k]["box"])))
        used.add(j)
        w = want[j]
        dbox = max(abs(x - y) for x, y in zip(g["box"], w["box"]))
        WORST["box px"] = max(WORST["box px"], dbox)
        WORST["score"] = max(WORST["score"], abs(g["score"] - w["score"]))
        if w["mask_area"] is not None and g["mask_area"] is not None:
            WORST["mask area %"] = max(WORST["mask area %"],
                                       100 * abs(g["mask_area"] - w["mask_area"]) / max(w["mask_area"], 1))
        if dbox > 0.5 or abs(g["score"] - w["score"]) > 1e-3 or g["class"] != w["class"]:
            errs.append(f"{name}[{i}]: ours {g['box']} {g['score']:.5f} class {g['class']}, Ultralytics {w['box']} "
                        f"{w['score']:.5f} class {w['class']}")
        if g["name"] != classes[w["class"]]:
            errs.append(f"{name}[{i}]: class name {g['name']!r}, expected {classes[w['class']]!r}")
        if (g["mask_area"] is None) != (w["mask_area"] is None) or (
                w["mask_area"] is not None and abs(g["mask_area"] - w["mask_area"]) > 0.01 * max(w["mask_area"], 1)):
            errs.append(f"{name}[{i}]: mask area {g['mask_area']}, Ultralytics {w['mask_area']}")
    return errs


def check_letterbox(a, images: list[Path]) -> list[str]:
    """sdxl_letterbox_runner's letterbox of the test images and of noise images of odd sizes (scaled up
    and down, thin) == Ultralytics' LetterBox(auto=False) (cv2.resize INTER_LINEAR), every byte."""
    import cv2
    import numpy as np
    from PIL import Image
    from ultralytics.data.augment import LetterBox

    rng = np.random.default_rng(7)
    paths = list(images)
    for h, w in ((37, 1000), (1001, 333), (2, 3), (319, 321), (333, 500)):
        paths.append(a.work / f"noise-{w}x{h}.png")
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(paths[-1])
    outs = [a.work / f"lb-{p.stem}.npy" for p in paths]
    r = run([a.letterbox_runner, IMGSZ, IMGSZ, *[x for pair in zip(paths, outs) for x in pair]], timeout=120)
    if r.returncode != 0:
        return [f"sdxl_letterbox_runner failed ({r.returncode}): {r.stderr[-1000:]}"]
    errs = []
    for p, o in zip(paths, outs):
        want = LetterBox((IMGSZ, IMGSZ), auto=False, stride=32)(image=cv2.imread(str(p)))[..., ::-1].astype(int)
        got = np.load(o).astype(int)
        if got.shape != want.shape or (got != want).any():
            diff = int(np.abs(got - want).max()) if got.shape == want.shape else -1
            errs.append(f"letterbox of {p.name}: {got.shape} vs {want.shape}, max difference {diff}")
    print(f"letterbox: {len(paths)} images == Ultralytics' LetterBox" if not errs else "letterbox: FAILED")
    return errs


def check_refusals(a, prefix: list[str], files: dict[str, Path]) -> list[str]:
    errs = []
    for fname, why in REFUSED.items():
        out = a.work / "refused" / Path(fname).stem
        r = export(a, prefix, files[fname], out)
        msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
        if r.returncode != 1 or fname not in msg or why not in msg or out.exists():
            errs.append(f"refusal of {fname}: exit {r.returncode}, out exists {out.exists()}, message {msg!r} "
                        f"(expected exit 1 naming the file and '{why}')")
    return errs


def check_bad_input(a, folder: Path, image: Path) -> list[str]:
    bad_png = a.work / "bad.png"
    bad_png.write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    cut_png = a.work / "cut.png"  # a valid header, the pixel data cut: found before anything is printed
    data = image.read_bytes()
    cut_png.write_bytes(data[: len(data) // 2])
    not_detector = a.work / "not-detector"
    not_detector.mkdir(exist_ok=True)
    (not_detector / "model.json").write_text(json.dumps({"format_version": 1, "kind": "upscaler"}))
    cases = [(["--confidence", "0", image], 2, "--confidence"), (["--confidence", "1.5", image], 2, "--confidence"),
             ([a.work / "missing.png"], 2, "missing.png"), ([bad_png], 2, "bad.png"),
             ([image, cut_png], 2, "cut.png")]
    errs = []
    for extra, code, needle in cases:
        r = run([a.binary, "detect", "--detector", folder, "--device", "cpu", *extra], timeout=60)
        if r.returncode != code or needle not in r.stderr or r.stdout.strip():
            errs.append(f"detect {extra}: exit {r.returncode} (want {code}), stderr {r.stderr.strip()[-300:]!r}")
    for folder_bad, needle in ((not_detector, "not a detector folder"), (a.work / "nowhere", "does not exist")):
        r = run([a.binary, "detect", "--detector", folder_bad, "--device", "cpu", image], timeout=60)
        if r.returncode != 1 or needle not in r.stderr:
            errs.append(f"detect --detector {folder_bad}: exit {r.returncode}, stderr {r.stderr.strip()[-300:]!r}")
    return errs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--python", required=True)
    ap.add_argument("--source", required=True, type=Path)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--binary", required=True)
    ap.add_argument("--letterbox-runner", required=True, help="sdxl_letterbox_runner")
    a = ap.parse_args()
    t0 = time.time()
    shutil.rmtree(a.work, ignore_errors=True)
    offline_env(str(a.work / "ultralytics-config"))
    files = write_fixtures(a.work / "files")
    images = [files[n] for n in IMAGES]
    prefix = offline_prefix()
    print(f"fixtures: {time.time() - t0:.1f} s; exports {'without network (unshare -n)' if prefix else 'as is'}")
    errors, total = check_letterbox(a, images), 0
    for fname, (_, names) in DETECT.items():
        folder = a.work / "detectors" / Path(fname).stem
        t = time.time()
        r = export(a, prefix, files[fname], folder)
        if r.returncode != 0:
            raise SystemExit(f"export of {fname} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
        meta = json.loads((folder / "model.json").read_text())
        task = "segment" if "-seg" in fname else "detect"
        classes = [names[i] for i in range(len(names))]
        if (meta["kind"], meta["task"], meta["classes"], meta["imgsz"]) != ("detector", task, classes, [IMGSZ] * 2):
            errors.append(f"{fname}: model.json says {meta['kind']}, {meta['task']}, {meta['classes']}, {meta['imgsz']}")
        te = time.time() - t
        got, secs = ours(a, folder, images)
        want = reference(files[fname], images, task)
        for img in images:
            errors += compare(f"{fname} {img.name}", classes, got[img.name], want[img.name])
            if got[img.name] and got[img.name][0]["size"] != IMAGES[img.name][::-1]:
                errors.append(f"{fname} {img.name}: size {got[img.name][0]['size']}")
        counts = [len(want[i.name]) for i in images]
        total += sum(counts)
        if sum(counts) < 4 or max(counts) < 2:
            errors.append(f"{fname}: too few detections to prove anything ({counts})")
        print(f"{fname:24s} export {te:5.1f} s, detect {secs:4.1f} s, detections per image {counts}")
    errors += check_refusals(a, prefix, files)
    errors += check_bad_input(a, a.work / "detectors" / "face_yolov8n", images[0])
    print(f"{total} detections compared (largest differences: {WORST}), {len(REFUSED)} refusals; "
          f"{time.time() - t0:.1f} s")
    for e in errors:
        print("FAIL", e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
