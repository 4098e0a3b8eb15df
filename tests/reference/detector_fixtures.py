"""Ultralytics YOLO checkpoints with random weights in the format Ultralytics publishes them (the dict its
trainer's final checkpoint holds: "model" the fp16 module, "train_args", "date", "version", ...), and
files the export must refuse; and the test images the detector parity test runs on.

No real detector weights are reachable here, so the models are built from Ultralytics' own configs
(yolov8n.yaml, yolov8n-seg.yaml, yolo11n.yaml) with seeded random weights. Random weights give junk
scores far below any threshold (Ultralytics' bias_init makes every class logit about -9); the class
bias is set so that at least TARGET_PASSING anchors of each test image score above 0.25, after BatchNorm statistics
measured on the test images (_calibrate), so that detection,
NMS and masks have real work to do.

Kinds (what an ADetailer folder holds):
  face_yolov8n.pt        detect, YOLOv8n, nc=1 {0: "face"}
  hand_yolo11n.pt        detect, YOLO11n, nc=2 {0: "hand", 1: "fist"} (class-aware NMS)
  person_yolov8n-seg.pt  segment, YOLOv8n-seg, nc=1 {0: "person"}
Refused:
  pose_yolov8n-pose.pt   a pose model (keypoints)
  cls_yolov8n-cls.pt     a classification model
  obb_yolov8n-obb.pt     an oriented-box model
  truncated.pt           face_yolov8n.pt's bytes cut in half
  not_ultralytics.pt     a torch.save'd state dict (no Ultralytics model)
  evil.pt                a bare pickle whose global is os.system (never unpickled)
  evil_zip.pt            a torch.save zip archive whose pickle names an Ultralytics class and calls
                         os.system (past the export's scan of the names; Ultralytics' restricted loader
                         refuses the global)
Environment: every Ultralytics import goes through offline_env() first (no network, settings in a
temporary folder), as the export does.
"""
from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path

import numpy as np

DETECT = {"face_yolov8n.pt": ("yolov8n.yaml", {0: "face"}),
          "hand_yolo11n.pt": ("yolo11n.yaml", {0: "hand", 1: "fist"}),
          "person_yolov8n-seg.pt": ("yolov8n-seg.yaml", {0: "person"})}
REFUSED_KINDS = {"pose_yolov8n-pose.pt": ("yolov8n-pose.yaml", "pose"),
                 "cls_yolov8n-cls.pt": ("yolov8n-cls.yaml", "classify"),
                 "obb_yolov8n-obb.pt": ("yolov8n-obb.yaml", "obb")}
IMAGES = {"wide.png": (480, 640), "tall.png": (700, 380), "small.png": (200, 256), "big.png": (900, 1100)}  # H, W
IMGSZ = 320  # ADetailer's models are 640; a quarter of the compute proves the same
TARGET_PASSING = 20  # anchors of the test image that scores lowest above 0.25 after the bias is set
MAX_LOGIT = 6.0  # the best anchor's score at most sigmoid(6) = 0.9975: none saturates at 1.0 (float32 ties)
LOGIT_025 = -1.0986122886681098  # logit(0.25)


def offline_env(config_dir: str | None = None) -> None:
    """Ultralytics' switches for no network and no writes outside a temporary folder (before it is imported)."""
    os.environ.setdefault("YOLO_CONFIG_DIR", config_dir or tempfile.mkdtemp(prefix="yolo-cfg-"))
    os.environ["YOLO_OFFLINE"] = "1"
    os.environ["YOLO_AUTOINSTALL"] = "false"
    os.environ["ULTRALYTICS_SKIP_REQUIREMENTS_CHECKS"] = "1"
    os.environ["ULTRALYTICS_SAFE_LOAD"] = "1"
    os.environ["YOLO_VERBOSE"] = "false"


def make_images(out: Path) -> list[Path]:
    """Discs and boxes on gradients, seeded, PNG (RGB)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(42)
    paths = []
    for name, (h, w) in IMAGES.items():
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([xx * 255 / w, yy * 255 / h, (xx + yy) * 127 / (w + h)], -1).astype(np.uint8)
        img = Image.fromarray(base)
        d = ImageDraw.Draw(img)
        for _ in range(6):
            x, y, r = rng.integers(0, w), rng.integers(0, h), rng.integers(10, max(12, min(h, w) // 4))
            colour = tuple(int(c) for c in rng.integers(0, 256, 3))
            (d.ellipse if rng.random() < 0.5 else d.rectangle)([x - r, y - r, x + r, y + r], fill=colour)
        path = out / name
        img.save(path)
        paths.append(path)
    return paths


def _letterboxed(path: Path):
    """The image as Ultralytics' predictor feeds a fixed 640 x 640 model: [1,3,640,640] float in [0,1]."""
    import cv2
    import torch
    from ultralytics.data.augment import LetterBox

    im = cv2.imread(str(path))
    lb = LetterBox((IMGSZ, IMGSZ), auto=False, stride=32)(image=im)
    return torch.from_numpy(np.ascontiguousarray(lb[..., ::-1].transpose(2, 0, 1))).float()[None] / 255


def _build(yaml: str, names: dict, seed: int, task: str):
    import torch
    from ultralytics.nn.tasks import guess_model_task, yaml_model_load
    from ultralytics.nn import tasks as T

    torch.manual_seed(seed)
    cfg = yaml_model_load(yaml)
    cls = {"detect": T.DetectionModel, "segment": T.SegmentationModel, "pose": T.PoseModel,
           "classify": T.ClassificationModel, "obb": T.OBBModel}[task or guess_model_task(cfg)]
    model = cls(cfg, nc=len(names), verbose=False)
    model.names = dict(names)
    model.args = {"imgsz": IMGSZ, "task": task}
    return model.eval()


def _calibrate(model, images: list[Path]) -> None:
    """BatchNorm statistics measured on the test images (as training would leave them), so that each layer's
    output has about unit variance and the head sees image-dependent features (with the identity statistics
    of a fresh model the signal fades layer by layer and every anchor scores the same); then the class
    logits scaled and their bias set so that at least TARGET_PASSING anchors of every test
    image score above 0.25 and none above sigmoid(MAX_LOGIT)."""
    import torch

    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # a cumulative average over the batches
    model.train()
    with torch.no_grad():
        for path in images:
            model(_letterboxed(path))
    model.eval()
    head = model.model[-1]
    with torch.no_grad():
        for seq in head.cv3:
            seq[-1].bias.zero_()
        top, kth = [], []
        raw = []  # the class convs' outputs: logits before the sigmoid (a float32 sigmoid saturates at 1)
        hooks = [seq[-1].register_forward_hook(lambda m, i, o: raw.append(o.flatten(2))) for seq in head.cv3]
        for path in images:
            raw.clear()
            model(_letterboxed(path))
            logits = torch.cat(raw, 2)[0].amax(0).double()
            top.append(float(logits.max()))
            kth.append(float(torch.topk(logits, TARGET_PASSING).values[-1]))
        for h in hooks:
            h.remove()
        # logit' = gain * logit + shift: the TARGET_PASSING-th anchor of every image at 0.25 or above, the best
        # anchor of all at most MAX_LOGIT (scores below 1 in float32: no ties)
        gain = min(1.0, (MAX_LOGIT - LOGIT_025) / max(max(top) - min(kth), 1e-6))
        shift = LOGIT_025 - gain * min(kth)
        for seq in head.cv3:
            seq[-1].weight.mul_(gain)
            seq[-1].bias.add_(shift)


def _save(model, path: Path, task: str) -> None:
    import copy
    from datetime import datetime

    import torch
    import ultralytics
    from ultralytics.cfg import DEFAULT_CFG_DICT

    train_args = {**DEFAULT_CFG_DICT, "task": task, "model": path.name, "imgsz": IMGSZ, "data": "synthetic.yaml"}
    torch.save({"date": datetime(2026, 1, 1).isoformat(), "version": ultralytics.__version__,
                "license": "AGPL-3.0 License (https://ultralytics.com/license)", "docs": "https://docs.ultralytics.com",
                "epoch": -1, "best_fitness": None, "model": copy.deepcopy(model).half(), "ema": None,
                "updates": None, "optimizer": None, "train_args": train_args, "train_metrics": None,
                "train_results": None}, path)


def write_face_detector(out: Path) -> dict[str, Path]:
    """The test images and face_yolov8n.pt alone (the same checkpoint write_fixtures makes), for the
    detailer's tests: {name: path}."""
    offline_env()
    import torch

    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    images = make_images(out)
    yaml, names = DETECT["face_yolov8n.pt"]
    model = _build(yaml, names, seed=10, task="detect")
    _calibrate(model, images)
    _save(model, out / "face_yolov8n.pt", "detect")
    return {**{p.name: p for p in images}, "face_yolov8n.pt": out / "face_yolov8n.pt"}


def write_fixtures(out: Path) -> dict[str, Path]:
    """Every checkpoint, refused file and test image into out; {name: path}."""
    offline_env()
    import torch

    torch.set_num_threads(1)  # small convolutions: a second OpenMP thread costs 10x on a busy 2-core machine
    out.mkdir(parents=True, exist_ok=True)
    images = make_images(out)
    files = {p.name: p for p in images}
    for i, (name, (yaml, names)) in enumerate(DETECT.items()):
        task = "segment" if "-seg" in yaml else "detect"
        model = _build(yaml, names, seed=10 + i, task=task)
        _calibrate(model, images)
        _save(model, out / name, task)
        files[name] = out / name
    for i, (name, (yaml, task)) in enumerate(REFUSED_KINDS.items()):
        _save(_build(yaml, {0: "thing"}, seed=20 + i, task=task), out / name, task)
        files[name] = out / name
    data = (out / "face_yolov8n.pt").read_bytes()
    (out / "truncated.pt").write_bytes(data[: len(data) // 2])
    torch.save({"weight": torch.zeros(3)}, out / "not_ultralytics.pt")

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo never",))

    with open(out / "evil.pt", "wb") as f:
        pickle.dump(Evil(), f)
    from ultralytics.nn.tasks import DetectionModel

    torch.save({"model": Evil(), "kind": DetectionModel}, out / "evil_zip.pt")  # names an Ultralytics class too
    for name in ("truncated.pt", "not_ultralytics.pt", "evil.pt", "evil_zip.pt"):
        files[name] = out / name
    return files


if __name__ == "__main__":
    import sys

    write = write_face_detector if "--face-only" in sys.argv[2:] else write_fixtures
    for k, v in write(Path(sys.argv[1])).items():
        print(k, v.stat().st_size)
