"""export_sdxl.py --detector FILE.pt --out DIR: an Ultralytics YOLO detection or segmentation checkpoint as
published for ADetailer (YOLOv8 / YOLO11: face_yolov8n.pt, hand_yolov8n.pt, person_yolov8n-seg.pt) as a
detector folder that `sdxl-batch detect` runs.

Reading: the file must be a regular .pt file and a complete torch zip archive (a truncated file is
refused before anything unpickles it; a bare pickle is not an Ultralytics checkpoint). The names of the
classes its pickle refers to are read without unpickling (pickletools): a pickle that names no
Ultralytics class, or a classification, pose or obb model class, is refused before torch is imported. It is then loaded
only by Ultralytics' own loader in its restricted mode (nn.tasks.torch_safe_load(safe_only=True):
torch.load(weights_only=True) against Ultralytics' allow-list of its model classes and torch's layers,
never a plain unpickling, never an automatic pip install of a module the file names). Accepted: the
checkpoint dict Ultralytics writes ("model" or "ema" an Ultralytics DetectionModel or
SegmentationModel with a YOLO Detect / Segment head that needs NMS). Refused by name: classification,
pose, oriented-box (obb) models, end-to-end heads (YOLOv10, YOLO26: no NMS), open-vocabulary models
(YOLO-World, YOLOE), RT-DETR.

Ultralytics never reaches the network here: YOLO_OFFLINE, no auto-install, no requirement checks, its
settings file in a temporary folder (Ultralytics would otherwise write ~/.config/Ultralytics).

Module: Ultralytics' own TorchScript export (YOLO(file).export(format="torchscript"), on the CPU, fp32,
batch 1, at the checkpoint's training size imgsz, fixed: its predictor letterboxes a fixed-size model
with auto=False). detector.ts maps [1,3,imgsz,imgsz] RGB in [0,1] to
  detect:  [1, 4 + nc, A]  (A anchors; rows: box centre x, y, width, height in input pixels, class scores)
  segment: ([1, 4 + nc + M, A], protos [1, M, imgsz/4, imgsz/4])  (M mask coefficients per anchor).
The export checks the module against the eager model on a random input. model.json:
  kind "detector", name, source, source_file {name, sha256}, task (detect / segment), classes (names by
  class id), imgsz [h, w], stride, mask_coefficients (segment), architecture (the model's yaml),
  ultralytics_version, torch_version, dtype fp32, export_device cpu, detector {file, input, output},
  check, files (size and sha256).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from .inputs import ExportError, regular_file

REFUSED_TASKS = {"classify": "a classification model", "pose": "a pose (keypoint) model",
                 "obb": "an oriented-box (obb) model"}


def check_file(path: Path) -> None:
    """A regular .pt file that is a complete torch zip archive, before anything unpickles it."""
    regular_file(path, "--detector")
    if path.suffix.lower() != ".pt":
        raise ExportError(f"--detector {path}: extension '{path.suffix}' is not .pt (an Ultralytics checkpoint)")
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            head = f.read(4)
        what = ("a truncated or damaged zip archive (its end is missing)" if head == b"PK\x03\x04" else
                "a bare pickle, not torch.save's zip archive" if head[:1] == b"\x80" else "not a zip archive")
        raise ExportError(f"--detector {path}: not an Ultralytics checkpoint: {what}")
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise ExportError(f"--detector {path}: truncated or damaged ({e})")
    if bad is not None:
        raise ExportError(f"--detector {path}: truncated or damaged (entry {bad} fails its CRC)")
    pickles = [n for n in names if n.endswith("/data.pkl")]
    if not pickles:
        raise ExportError(f"--detector {path}: not a torch checkpoint (no data.pkl in the archive)")
    refuse_by_globals(path, pickle_globals(path, pickles[0]))


# Model classes whose checkpoints are refused from the names in their pickle, before torch is imported
# (load_model refuses the same kinds again from the loaded model).
REFUSED_CLASSES = {"ultralytics.nn.tasks.ClassificationModel": "classify", "ultralytics.nn.tasks.PoseModel": "pose",
                   "ultralytics.nn.tasks.OBBModel": "obb"}


def pickle_globals(path: Path, member: str) -> set[str]:
    """The "module.name" globals a pickle in the archive names, read by pickletools without unpickling (the
    two strings before a STACK_GLOBAL, also through the memo)."""
    import pickletools

    with zipfile.ZipFile(path) as z:
        data = z.read(member)
    found, strings, memo = set(), [], {}
    last = None  # the string the previous opcode pushed, if it pushed one
    try:
        for op, arg, _ in pickletools.genops(data):
            pushed = None
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING",
                           "BINSTRING", "STRING"):
                pushed = arg
            elif op.name in ("BINPUT", "LONG_BINPUT", "PUT") and last is not None:
                memo[arg] = last
                pushed = last
            elif op.name == "MEMOIZE" and last is not None:
                memo[len(memo)] = last
                pushed = last
            elif op.name in ("BINGET", "LONG_BINGET", "GET") and arg in memo:
                pushed = memo[arg]
            elif op.name == "GLOBAL":
                found.add(arg.replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.add(f"{strings[-2]}.{strings[-1]}")
            if pushed is not None and op.name not in ("BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"):
                strings.append(pushed)
            last = pushed
    except Exception as e:  # noqa: BLE001  (a malformed pickle stream)
        raise ExportError(f"--detector {path}: truncated or damaged (its pickle does not parse: {_first_line(e)})")
    return found


def refuse_by_globals(path: Path, found: set[str]) -> None:
    """ExportError for a checkpoint whose pickle names no Ultralytics class, or a refused model class."""
    if not any(g.startswith("ultralytics.") for g in found):
        raise ExportError(f"--detector {path}: not an Ultralytics checkpoint (its pickle names no Ultralytics "
                          "class)")
    for cls, task in REFUSED_CLASSES.items():
        if cls in found:
            raise ExportError(f"--detector {path}: {REFUSED_TASKS[task]}, not a detection or segmentation model "
                              "(ADetailer's detectors are YOLO detect or -seg models)")


def offline_env(config_dir: Path) -> None:
    """Ultralytics' switches for no network, no installs and no writes outside config_dir (before import)."""
    os.environ["YOLO_CONFIG_DIR"] = str(config_dir)
    os.environ["YOLO_OFFLINE"] = "1"
    os.environ["YOLO_AUTOINSTALL"] = "false"
    os.environ["ULTRALYTICS_SKIP_REQUIREMENTS_CHECKS"] = "1"
    os.environ["ULTRALYTICS_SAFE_LOAD"] = "1"
    os.environ["YOLO_VERBOSE"] = "false"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def load_model(path: Path):
    """(the checkpoint's model, its task, its train_args) through Ultralytics' restricted loader, or
    ExportError naming the file and why it is refused."""
    from ultralytics.nn.tasks import (BaseModel, ClassificationModel, DetectionModel, OBBModel, PoseModel,
                                      SegmentationModel, guess_model_task, torch_safe_load)

    try:
        ckpt, _ = torch_safe_load(str(path), safe_only=True)
    except Exception as e:  # noqa: BLE001  (a global outside the allow-list, a damaged archive, a missing module)
        raise ExportError(f"--detector {path}: not a loadable Ultralytics checkpoint: {_first_line(e)}")
    model = ckpt.get("ema") or ckpt.get("model") if isinstance(ckpt, dict) else None
    if not isinstance(model, BaseModel):
        raise ExportError(f"--detector {path}: not an Ultralytics checkpoint (no Ultralytics model under "
                          "'model' or 'ema')")
    task = guess_model_task(model)
    if isinstance(model, (ClassificationModel, PoseModel, OBBModel)) or task in REFUSED_TASKS:
        raise ExportError(f"--detector {path}: {REFUSED_TASKS.get(task, task)}, not a detection or segmentation "
                          "model (ADetailer's detectors are YOLO detect or -seg models)")
    kind = type(model).__name__
    if type(model) not in (DetectionModel, SegmentationModel):
        raise ExportError(f"--detector {path}: {kind} (RT-DETR, YOLO-World, YOLOE, ...) is not supported: "
                          "only YOLO DetectionModel and SegmentationModel")
    head = model.model[-1]
    if getattr(head, "end2end", False):
        raise ExportError(f"--detector {path}: an end-to-end head (YOLOv10 / YOLO26, no NMS) is not supported")
    return model, task, dict(ckpt.get("train_args") or {})


def _imgsz(train_args: dict, model) -> list[int]:
    size = train_args.get("imgsz") or getattr(model, "args", {}).get("imgsz", 640)
    size = [int(size), int(size)] if isinstance(size, (int, float)) else [int(s) for s in size]
    stride = int(max(model.stride))
    if any(s <= 0 or s % stride for s in size):
        raise ExportError(f"--detector: imgsz {size} of the checkpoint is not a positive multiple of its stride "
                          f"{stride}")
    return size


def _tensors(x) -> list:
    """The tensors of a nested tuple / list, in order."""
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _tensors(item)]
    return [x]


def _check(ts_path: Path, model, imgsz: list[int]) -> dict:
    """The traced module vs Ultralytics' fused eager model on one random input (fp32, CPU)."""
    import torch

    x = torch.rand(1, 3, *imgsz, generator=torch.Generator().manual_seed(3))
    eager = model.float().fuse().eval()
    with torch.no_grad():
        want = eager(x)
        got = torch.jit.load(str(ts_path), map_location="cpu")(x)
    flat_want, flat_got = _tensors(want), _tensors(got)
    # The eager model also returns its head's feature maps; each traced output is compared with the eager
    # output of its shape (predictions, then the mask prototypes of a segment model).
    want = [next((w for w in flat_want if w.shape == g.shape), None) for g in flat_got]
    if any(w is None for w in want):
        raise SystemExit(f"--detector: the TorchScript outputs {[tuple(g.shape) for g in flat_got]} are not the "
                         "eager model's")
    got = flat_got
    diffs = [float((g - w).abs().max()) for g, w in zip(got, want)]
    if len(got) != len(want) or any(d > 1e-3 for d in diffs):
        raise SystemExit(f"--detector: the TorchScript module does not match the eager model (max abs diffs {diffs})")
    return {"level": "quick", "max_abs_diff": max(diffs), "outputs": len(got)}


def export(a, job) -> int:
    """The checked file loaded by Ultralytics, exported by Ultralytics into job.tmp, published as job.out."""
    from .common import file_digests, log, publish, sha256_file

    path = Path(a.detector)
    config = Path(tempfile.mkdtemp(prefix="ultralytics-config-", dir=job.tmp))
    offline_env(config)
    import torch
    import ultralytics
    from ultralytics import YOLO

    model, task, train_args = load_model(path)
    imgsz = _imgsz(train_args, model)
    work = Path(tempfile.mkdtemp(prefix="work-", dir=job.tmp))
    shutil.copyfile(path, work / "model.pt")  # Ultralytics writes its export beside the file it loaded
    ts = Path(YOLO(str(work / "model.pt"), task=task).export(format="torchscript", imgsz=imgsz, device="cpu",
                                                              half=False, dynamic=False, optimize=False, batch=1,
                                                              nms=False, verbose=False))
    shutil.move(str(ts), str(job.tmp / "detector.ts"))
    check = _check(job.tmp / "detector.ts", model, imgsz)
    shutil.rmtree(work)
    shutil.rmtree(config)
    names = dict(model.names)
    head = model.model[-1]
    meta = {
        "format_version": 1, "kind": "detector", "name": path.stem, "source": f"detector:{path.resolve()}",
        "source_file": {"name": path.name, "sha256": sha256_file(path)},
        "task": task, "classes": [str(names[i]) for i in range(len(names))], "imgsz": imgsz,
        "stride": int(max(model.stride)), "architecture": str(model.yaml.get("yaml_file", "")),
        "ultralytics_version": ultralytics.__version__, "torch_version": torch.__version__,
        "dtype": "fp32", "export_device": "cpu",
        "detector": {"file": "detector.ts", "input": "[1,3,imgsz_h,imgsz_w] RGB in [0,1], letterboxed",
                     "output": "[1,4+nc,A]" if task == "detect" else "([1,4+nc+M,A], protos [1,M,h/4,w/4])"},
        "check": check,
    }
    if task == "segment":
        meta["mask_coefficients"] = int(head.nm)
    (job.tmp / "model.json").write_text(json.dumps(meta, indent=1) + "\n")
    meta["files"] = file_digests(job.tmp)
    (job.tmp / "model.json").write_text(json.dumps(meta, indent=1) + "\n")
    publish(job.tmp, job.out)
    log(f"  wrote detector {job.out} ({task}, {len(names)} classes: {', '.join(meta['classes'][:5])}, "
        f"imgsz {imgsz[0]}x{imgsz[1]}, Ultralytics {ultralytics.__version__})")
    return 0
