#!/usr/bin/env python3
"""Parity and e2e (ctest parity_detailer_cpu): the per-task "detailer" vs diffusers' inpainting with
ADetailer's semantics, tiny model, CPU, fp32.

The tiny model's images are noise, in which the fixture detector (reference.detector_fixtures'
face_yolov8n.pt, exported by fixture_detector) finds nothing dependable. So each panel is an
"only masked" inpainting of the fixture's small.png (shapes on a gradient, which the detector's
statistics were measured on) whose mask is a corner patch: the panel is small.png's bytes outside
the patch, and the detector finds real detections around the noise the tiny model paints there.

Two `sdxl-batch run`s of the same panels: without a detailer (the base images) and with one
("detailer": the face detector, confidence 0.5, k largest 1, 2 or 3 per panel, ADetailer's defaults
otherwise; one panel with "[PROMPT], detailed" and 4 steps of its own).

Parity, per panel: the reference runs Ultralytics' predict on the base PNG (the detections must be
the report's: same count and order, boxes within 0.5 px), makes ADetailer's masks (PIL rectangles,
cv2.dilate with a 4 x 4 kernel, the k largest first) and inpaints region by region, each result
feeding the next, with StableDiffusionXLInpaintPipeline (padding_mask_crop = the padding, the mask
blurred by its mask processor's blur, strength = the denoising strength, seed = the panel's seed +
the region's index, the task's size). The detailed PNG must be within --min-psnr (40 dB) of it inside
the union of the padded crops, and equal to the base PNG, byte for byte, wherever the union of the
dilated and blurred masks is 0.

e2e: report.json counts the regions (the sum over the panels' boxes) and the detailer's UNet batches
(fewer than the regions: regions of different panels share calls); each image's record lists its
boxes, report.html draws them; the PNG parameters carry ADetailer's keys; the manifest records the
detailer and the detector's sha256, and a rerun with another denoising strength makes the images
again while a plain rerun makes none; a bad detailer (a folder that is not a detector folder, a
confidence of 0) is refused by validate and run with exit 2 and a message naming the task.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from parity_common import finish, parse_args, reference_pipeline
from parity_inpaint import inpaint_pipeline
from PIL import Image, ImageDraw
from testkit import parameters, read_manifest, read_report, run, run_ok

from reference.a1111_schedulers import make_scheduler
from reference.compare_images import psnr
from reference.reference_sdxl import a1111_embeds

PROMPT, NEGATIVE, CFG, STEPS = "comic panel, a face", "blurry", 5.0, 8
DILATE, BLUR, DENOISE, PADDING = 4, 4, 0.4, 32
# panel -> (seed, corner patch [x1, y1, x2, y2], confidence, k largest, detailer prompt, detailer steps or None;
# p4's 4 steps at denoise 0.4 are one sampler step: the inpainting's blend after the last step matters).
# Each confidence is at least 0.002 from every detection's score on the panel's base image (the
# detections are the same in both implementations to 1e-3): 1, 2, 2 and 3 regions.
PANELS = {"p1": (31, (0, 160, 48, 200), 0.31, 1, "", None),
          "p2": (32, (208, 0, 256, 40), 0.298, 2, "", None),
          "p3": (33, (0, 0, 48, 40), 0.298, 3, "", None),
          "p4": (34, (208, 160, 256, 200), 0.39, 3, "[PROMPT], detailed", 4)}


def corner_mask(size: tuple[int, int], box) -> Image.Image:
    m = Image.new("RGB", size, (0, 0, 0))
    ImageDraw.Draw(m).rectangle([box[0], box[1], box[2] - 1, box[3] - 1], fill=(255, 255, 255))
    return m


def write_batch(work: Path, detector: Path, name: str, detailer: bool, denoise: float = DENOISE) -> Path:
    tasks = []
    for tag, (seed, _, conf, k, prompt, steps) in PANELS.items():
        t = {"id": tag, "prompt": PROMPT, "negative": NEGATIVE, "seed": seed, "steps": STEPS, "cfg": CFG,
             "init_image": "small.png", "mask": f"mask-{tag}.png", "mask_blur": 0, "strength": 1.0,
             "inpaint_area": "masked", "inpaint_padding": 8}
        if detailer:
            unit = {"detector": str(detector), "confidence": conf, "max": k, "denoise": denoise}
            if prompt:
                unit["prompt"] = prompt
            if steps:
                unit["steps"] = steps
            t["detailer"] = [unit]
        tasks.append(t)
    bf = work / f"{name}.json"
    bf.write_text(json.dumps({"version": 1, "output": {"template": "{id}-{index}.png"}, "tasks": tasks}, indent=1))
    return bf


def run_batch(a, bf: Path, out: Path, fresh: bool = True) -> float:
    if fresh:
        shutil.rmtree(out, ignore_errors=True)
    t = time.time()
    run_ok([a.binary, "run", str(bf), "--model", a.model, "--out", str(out), "--threads", "1", "--no-progress",
            "--max-batch", "4"],
           f"sdxl-batch run {bf.name}")
    return time.time() - t


def adetailer_masks(model, base: Path, conf: float, k: int) -> tuple[list[list[float]], list[Image.Image]]:
    """Ultralytics' boxes on the base image and ADetailer's masks of them (pred_preprocessing)."""
    import cv2

    r = model.predict(str(base), conf=conf, iou=0.7, imgsz=a_imgsz(), rect=False, device="cpu", verbose=False)[0]
    boxes = [d[:4] for d in r.boxes.data.tolist()]
    size = Image.open(base).size
    if k and len(boxes) > k:
        areas = [(b[2] - b[0]) * (b[3] - b[1]) for b in boxes]
        boxes = [boxes[i] for i in np.argsort(areas)[-k:][::-1]]
    masks = []
    for b in boxes:
        m = Image.new("L", size, 0)
        ImageDraw.Draw(m).rectangle(b, fill=255)
        arr = cv2.dilate(np.array(m), np.ones((DILATE, DILATE), np.uint8), iterations=1)
        if arr.any():
            masks.append(Image.fromarray(arr).convert("RGB"))
    return boxes, masks


def a_imgsz() -> int:
    from reference.detector_fixtures import IMGSZ
    return IMGSZ


def reference_detail(inp, pipe, base_config, base: Path, masks: list[Image.Image], seed: int, prompt: str,
                     steps: int | None) -> tuple[Image.Image, np.ndarray, list[tuple[int, int, int, int]]]:
    """The regions inpainted in order: the final image, the union of the blurred masks, the crops."""
    cur = Image.open(base).convert("RGB")
    w, h = cur.size
    text = prompt.replace("[PROMPT]", PROMPT) if prompt else PROMPT
    embeds = a1111_embeds(pipe, text, NEGATIVE, True)
    inp.scheduler = make_scheduler(base_config, "Euler", "Automatic")
    union, crops = np.zeros((h, w), bool), []
    for j, m in enumerate(masks):
        blurred = inp.mask_processor.blur(m, blur_factor=BLUR)
        union |= np.array(blurred.convert("L")) > 0
        crops.append(inp.mask_processor.get_crop_region(blurred, w, h, pad=PADDING))
        cur = inp(**embeds, image=cur, mask_image=blurred, height=h, width=w, strength=DENOISE,
                  num_inference_steps=steps or STEPS, guidance_scale=CFG, padding_mask_crop=PADDING,
                  generator=[torch.Generator("cpu").manual_seed(seed + j)]).images[0]
    return cur, union, crops


def parity_rows(a, work: Path, base_dir: Path, det_dir: Path, report: dict) -> list[dict]:
    from reference.detector_fixtures import offline_env
    offline_env()
    from ultralytics import YOLO

    yolo = YOLO(str(a.checkpoint), task="detect")
    pipe = reference_pipeline(a.diffusers)
    inp = inpaint_pipeline(pipe)
    base_config = dict(pipe.scheduler.config)
    records = {r["task"]: r for r in report["images"]}
    rows = []
    for tag, (seed, _, conf, k, prompt, steps) in PANELS.items():
        base, ours = base_dir / f"{tag}-0.png", det_dir / f"{tag}-0.png"
        boxes, masks = adetailer_masks(yolo, base, conf, k)
        got = [d["box"] for d in records[tag].get("detailer", [])]
        same_boxes = len(got) == len(boxes) and all(max(abs(x - y) for x, y in zip(g, b)) <= 0.5
                                                    for g, b in zip(got, boxes))
        with torch.inference_mode():
            ref, union, crops = reference_detail(inp, pipe, base_config, base, masks, seed, prompt, steps)
        ref.save(work / f"{tag}-ref.png")
        o, r, b = (np.array(Image.open(p).convert("RGB")) for p in (ours, work / f"{tag}-ref.png", base))
        inside = np.zeros(union.shape, bool)
        for x1, y1, x2, y2 in crops:
            inside[y1:y2, x1:x2] = True
        p = psnr(o[inside], r[inside]) if inside.any() else float("inf")
        changed_outside = int((o[~union] != b[~union]).any(axis=-1).sum())
        ok = bool(same_boxes and masks and p >= a.min_psnr and changed_outside == 0)
        rows.append({"case": tag, "value": p, "ok": ok,
                     "what": f"{len(masks)} region(s), boxes as Ultralytics' {same_boxes}; {changed_outside} pixels "
                             f"changed outside the blurred masks ({int((~union).sum())})"})
        print(f"{tag}: PSNR {p:6.2f} dB  {rows[-1]['what']}", flush=True)
    return rows


def check_report(det_dir: Path) -> list[str]:
    """report.json's counts and boxes, report.html's boxes, the PNGs' ADetailer keys, the manifest."""
    errs = []
    rep = read_report(det_dir)
    regions = sum(len(r.get("detailer", [])) for r in rep["images"])
    d = rep.get("detailer", {})
    print(f"report: {len(rep['images'])} images, {d.get('regions')} detailer regions in {d.get('batches')} "
          f"UNet batches", flush=True)
    if d.get("regions") != regions or regions < len(PANELS):
        errs.append(f"report.json counts {d.get('regions')} regions, the images list {regions}")
    if not (0 < d.get("batches", 0) < regions):
        errs.append(f"{d.get('batches')} detailer batches for {regions} regions: not batched")
    for r in rep["images"]:
        n = len(r.get("detailer", []))
        if not 1 <= n <= PANELS[r["task"]][3]:
            errs.append(f"{r['task']}: {n} regions, expected 1..{PANELS[r['task']][3]}")
    mib = [dev.get("engine", {}).get("detector_cache_resident_mib", 0) for dev in rep.get("devices", [])]
    if not mib or not all(m > 0 for m in mib):
        errs.append(f"report.json's detector_cache_resident_mib is {mib}: the loaded detector's weights not counted")
    html = (det_dir / "report.html").read_text()
    if html.count('class="boxed"') != len(PANELS) or html.count("<i style=\"left:") != regions:
        errs.append("report.html does not draw every image's boxes")
    for tag, (_, _, conf, k, prompt, steps) in PANELS.items():
        params = parameters(det_dir / f"{tag}-0.png")
        want = (f"ADetailer model: face_yolov8n.pt, " + (f'ADetailer prompt: "{prompt}", ' if prompt else "") +
                f"ADetailer confidence: {conf}, ADetailer mask only top k largest: {k}, ADetailer dilate erode: "
                f"{DILATE}, ADetailer mask blur: {BLUR}, ADetailer denoising strength: {DENOISE}, ADetailer inpaint "
                f"only masked: True, ADetailer inpaint padding: {PADDING}")
        if want not in params:
            errs.append(f"{tag}: parameters lack {want!r}:\n{params}")
        if steps and f"ADetailer steps: {steps}" not in params:
            errs.append(f"{tag}: parameters lack its detailer steps")
    for e in read_manifest(det_dir):
        u = e["params"].get("detailer", [{}])[0]
        if len(u.get("weights_sha256", "")) != 64 or u.get("denoise") != DENOISE:
            errs.append(f"manifest of {e['task']}: detailer {u}")
    return errs


def check_resume_and_refusals(a, work: Path, detector: Path, det_dir: Path) -> list[str]:
    errs = []
    before = {p.name: p.stat().st_mtime_ns for p in det_dir.glob("p*.png")}
    run_batch(a, work / "detailed.json", det_dir, fresh=False)
    if read_report(det_dir).get("images"):
        errs.append("a rerun with the same settings made images again")
    run_batch(a, write_batch(work, detector, "detailed-other", True, denoise=0.35), det_dir, fresh=False)
    remade = len(read_report(det_dir).get("images", []))
    if remade != len(PANELS):
        errs.append(f"a rerun with another denoising strength made {remade} of {len(PANELS)} images again")
    bad = json.loads((work / "detailed.json").read_text())
    bad["tasks"][1]["detailer"][0]["detector"] = str(a.model)
    bad["tasks"][2]["detailer"][0]["confidence"] = 0
    bf = work / "bad.json"
    bf.write_text(json.dumps(bad, indent=1))
    for cmd in (["validate", str(bf), "--model", a.model],
                ["run", str(bf), "--model", a.model, "--out", str(work / "bad-out"), "--no-progress"]):
        r = run([a.binary, *cmd], timeout=300)
        msg = r.stderr + r.stdout
        ok = (r.returncode == 2 and "/tasks/1/detailer/0/detector" in msg and "(task 'p2')" in msg
              and "/tasks/2/detailer/0/confidence" in msg and "(task 'p3')" in msg)
        print(f"{cmd[0]} of a bad detailer: exit {r.returncode}, names the tasks {ok}", flush=True)
        if not ok:
            errs.append(f"{cmd[0]} of a bad detailer: exit {r.returncode}\n{msg[-2000:]}")
    if list((work / "bad-out").glob("*.png")):
        errs.append("a refused batch wrote images")
    return errs


def check_generate_and_plan(a, work: Path, detector: Path) -> list[str]:
    """`generate --detailer ...` writes, byte for byte, the PNG a run of the same task writes (one task,
    --max-batch 1: each pass alone, as generate makes it); a bad --detailer-* value is refused naming
    the flag; --dry-run plans the task's region passes: unknown before a run, measured after it."""
    errs = []
    tag = "p2"
    seed, _, conf, k, _, _ = PANELS[tag]
    one = json.loads(write_batch(work, detector, "detailed", True).read_text())
    one["tasks"] = [t for t in one["tasks"] if t["id"] == tag]
    bf = work / "one.json"
    bf.write_text(json.dumps(one, indent=1))
    out = work / "one-run"
    shutil.rmtree(out, ignore_errors=True)
    plan_cmd = [a.binary, "run", str(bf), "--model", a.model, "--out", str(out), "--dry-run", "--force"]
    before = run_ok(plan_cmd, "dry run before the run").stdout
    if f"{tag} (1 image(s)): face (unknown until detection)" not in before or \
            "region passes unknown until detection" not in before:
        errs.append(f"the dry run before any run does not say the regions are unknown:\n{before}")
    run_ok([a.binary, "run", str(bf), "--model", a.model, "--out", str(out), "--threads", "1", "--no-progress",
            "--max-batch", "1"], "sdxl-batch run one.json")
    regions = len(read_report(out)["images"][0].get("detailer", []))
    after = run_ok(plan_cmd, "dry run after the run").stdout
    want = f"{tag} (1 image(s)): face ({regions:.2f} region(s)/image measured); {regions:.1f} region pass(es), est. time"
    if want not in after or "unknown until detection" in after:
        errs.append(f"the dry run after a run does not count its {regions} region(s) ({want!r}):\n{after}")
    flags = ["generate", "--model", a.model, "--threads", "1", "--prompt", PROMPT, "--negative", NEGATIVE,
             "--seed", seed, "--steps", STEPS, "--cfg", CFG, "--init-image", work / "small.png",
             "--mask", work / f"mask-{tag}.png", "--mask-blur", 0, "--strength", 1.0, "--inpaint-area", "masked",
             "--inpaint-padding", 8, "--detailer", detector]
    t = time.time()
    run_ok([a.binary, *flags, "--detailer-confidence", conf, "--detailer-max", k, "--detailer-denoise", DENOISE,
            "--out", work / "generated.png"], "sdxl-batch generate --detailer")
    same = (work / "generated.png").read_bytes() == (out / f"{tag}-0.png").read_bytes()
    print(f"generate --detailer: {time.time() - t:.1f} s, {regions} region(s), the run's PNG byte for byte {same}",
          flush=True)
    if not same:
        errs.append(f"generate's PNG differs from the run's:\n{parameters(work / 'generated.png')}\n"
                    f"{parameters(out / f'{tag}-0.png')}")
    for bad, named in ((["--detailer-confidence", 0], "--detailer-confidence"),
                       (["--detailer-dilate", 500], "--detailer-dilate"),
                       (["--detailer-steps", 2], "--detailer-denoise of detailer 0"),  # int(2 * 0.4) = 0
                       (["--detailer-steps", 1, "--detailer-steps", 2], "--detailer-steps twice")):
        r = run([a.binary, *flags, *bad, "--out", work / "bad.png"], timeout=120)
        if r.returncode != 2 or named not in r.stderr + r.stdout:
            errs.append(f"generate {bad}: exit {r.returncode}, not refused naming {named}:\n{r.stderr[-1000:]}")
    r = run([a.binary, *flags[:-2], "--detailer-blur", 2, *flags[-2:], "--out", work / "bad.png"], timeout=120)
    if r.returncode != 2 or "--detailer-blur comes before any --detailer" not in r.stderr:
        errs.append(f"--detailer-blur before --detailer: exit {r.returncode}\n{r.stderr[-1000:]}")
    if (work / "bad.png").exists():
        errs.append("a refused generate wrote its PNG")
    return errs


def main() -> int:
    def extra(ap):
        ap.add_argument("--detector", required=True, help="the fixture's exported face detector folder")
        ap.add_argument("--checkpoint", required=True, help="its checkpoint (face_yolov8n.pt) for Ultralytics")
        ap.add_argument("--images", required=True, help="the fixture's test images (small.png)")

    a, work = parse_args(__doc__, extra)
    a.checkpoint = Path(a.checkpoint)
    shutil.copyfile(Path(a.images) / "small.png", work / "small.png")
    size = Image.open(work / "small.png").size
    for tag, (_, box, *_rest) in PANELS.items():
        corner_mask(size, box).save(work / f"mask-{tag}.png")
    detector = Path(a.detector)
    base_dir, det_dir = work / "base", work / "detailed"
    t_base = run_batch(a, write_batch(work, detector, "base", False), base_dir)
    t_det = run_batch(a, write_batch(work, detector, "detailed", True), det_dir)
    print(f"sdxl-batch run: base {t_base:.1f} s, detailed {t_det:.1f} s", flush=True)
    errs = check_report(det_dir)
    t0 = time.time()
    rows = parity_rows(a, work, base_dir, det_dir, read_report(det_dir))
    print(f"reference {time.time() - t0:.1f} s", flush=True)
    errs += check_resume_and_refusals(a, work, detector, det_dir)
    errs += check_generate_and_plan(a, work, detector)
    for e in errs:
        print("FAIL:", e)
    rows.append({"case": "e2e", "what": "report, metadata, manifest, resume, refusals", "ok": not errs,
                 "value": float("inf") if not errs else 0.0})
    failed = not all(r["ok"] for r in rows)
    return finish(rows, [("case", "case", "<6"), ("PSNR dB", "value", ">8.2f")], work / "parity_detailer.json",
                  failed, "a panel is below {min_psnr} dB, changed outside its regions, or an e2e check failed", "",
                  a.min_psnr)


if __name__ == "__main__":
    sys.exit(main())
