"""export_sdxl.py --detector FILE.pt --out DIR: an Ultralytics YOLO detection or segmentation checkpoint as
published for ADetailer (YOLOv8 / YOLO11: face_yolov8n.pt, hand_yolov8n.pt, person_yolov8n-seg.pt) as a
detector folder that `sdxl-batch detect` runs.

Reading: the file must be a regular .pt file and a complete torch zip archive, not TorchScript
(inputs.not_torchscript: loading one runs its code); a truncated file is refused before anything
unpickles it, and a bare pickle is not an Ultralytics checkpoint. It is copied into the temporary
folder, and the copy is checked again and is what is loaded: what was checked is what is loaded. The
names of the classes its pickle refers to are read without unpickling (pickletools): a pickle that
names no Ultralytics class, or a classification, pose or obb model class, is refused before torch is
imported. It is then loaded only by Ultralytics' own loader in its restricted mode
(nn.tasks.torch_safe_load(safe_only=True): torch.load(weights_only=True) against Ultralytics' allow-list
of its model classes and torch's layers, never a plain unpickling, never an automatic pip install of a
module the file names), under allocation_budget: the allow-list lets a pickle call torch's layers with
any sizes, so what they allocate while the file loads is bounded (BUILD_MAX_BYTES) before it is
allocated. Accepted: the checkpoint dict Ultralytics writes ("model" or "ema" an Ultralytics
DetectionModel or SegmentationModel with a YOLO Detect / Segment head that needs NMS), its imgsz
integers, multiples of the stride, at most IMGSZ_MAX, its class names ids 0..n-1 without control
characters. Refused by name: classification, pose, oriented-box (obb) models, end-to-end heads (YOLOv10,
YOLO26: no NMS), open-vocabulary models (YOLO-World, YOLOE), RT-DETR. Each refusal, and a failure inside
Ultralytics' export, is one line naming the file (exit 1).

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

from .inputs import ExportError, not_torchscript, open_regular, regular_file

REFUSED_TASKS = {"classify": "a classification model", "pose": "a pose (keypoint) model",
                 "obb": "an oriented-box (obb) model"}
CLASSES_MAX = 100000  # the runtime's limit on model.json "classes" (src/model/model_config.cpp)


def check_file(path: Path) -> None:
    """A regular .pt file that is a complete torch zip archive, before anything unpickles it."""
    regular_file(path, "--detector")
    if path.suffix.lower() != ".pt":
        raise ExportError(f"--detector {path}: extension '{path.suffix}' is not .pt (an Ultralytics checkpoint)")
    check_archive(path, path)


def check_archive(read: Path, path: Path) -> None:
    """The archive checks of check_file on the file read (path or its copy), naming path: a complete zip
    archive, not TorchScript, whose pickle names an Ultralytics class and no refused model class."""
    with open_regular(read, f"--detector {path}") as f:
        not_torchscript(f, f"--detector {path}")
    if not zipfile.is_zipfile(read):
        with open(read, "rb") as f:
            head = f.read(4)
        what = ("a truncated or damaged zip archive (its end is missing)" if head == b"PK\x03\x04" else
                "a bare pickle, not torch.save's zip archive" if head[:1] == b"\x80" else "not a zip archive")
        raise ExportError(f"--detector {path}: not an Ultralytics checkpoint: {what}")
    try:
        with zipfile.ZipFile(read) as z:
            names = z.namelist()
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise ExportError(f"--detector {path}: truncated or damaged ({e})")
    if bad is not None:
        raise ExportError(f"--detector {path}: truncated or damaged (entry {bad} fails its CRC)")
    pickles = [n for n in names if n.endswith("/data.pkl")]
    if not pickles:
        raise ExportError(f"--detector {path}: not a torch checkpoint (no data.pkl in the archive)")
    refuse_by_globals(path, pickle_globals(read, pickles[0], path))


# Model classes whose checkpoints are refused from the names in their pickle, before torch is imported
# (load_model refuses the same kinds again from the loaded model).
REFUSED_CLASSES = {"ultralytics.nn.tasks.ClassificationModel": "classify", "ultralytics.nn.tasks.PoseModel": "pose",
                   "ultralytics.nn.tasks.OBBModel": "obb"}


def pickle_globals(read: Path, member: str, path: Path) -> set[str]:
    """The "module.name" globals a pickle in the archive read names, read by pickletools without unpickling
    (the two strings before a STACK_GLOBAL, also through the memo); errors name path."""
    import pickletools

    with zipfile.ZipFile(read) as z:
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


# What the layers a checkpoint's pickle constructs may allocate while it loads. Ultralytics' allow-list lets
# a pickle call its model classes and torch's layers with any arguments (a few bytes make an nn.Linear of
# any size); a checkpoint as Ultralytics writes it constructs none (its tensors come from the archive's
# entries, which inputs.not_torchscript bounds by the file's size). The largest YOLO (x-seg, 72 M
# parameters) is 0.3 GB in fp32.
BUILD_MAX_BYTES = 2**30


def allocation_budget(path: Path, limit: int = BUILD_MAX_BYTES):
    """A torch function mode under which the tensors torch's factory functions (torch.empty, zeros, ...:
    what a layer's __init__ allocates with) create add up to at most `limit` bytes: each call is first
    made on the meta device, and one that would pass the limit is refused (ExportError naming path)
    before anything is allocated."""
    import torch
    from torch.overrides import TorchFunctionMode

    factories = {torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.randint,
                 torch.randperm, torch.empty_strided, torch.eye, torch.arange, torch.linspace, torch.logspace,
                 torch.tensor}

    class Budget(TorchFunctionMode):
        used = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in factories and kwargs.get("out") is None:  # into out=: nothing new is allocated
                probe = func(*args, **{**kwargs, "device": "meta"})
                self.used += probe.numel() * probe.element_size()
                if self.used > limit:
                    raise ExportError(f"--detector {path}: its pickle constructs layers of more than "
                                      f"{limit // 2**20} MiB of tensors ({tuple(probe.shape)} of {probe.dtype} "
                                      f"brings them to {self.used // 2**20} MiB); refused before allocating them")
            return func(*args, **kwargs)

    return Budget()


def load_model(copy: Path, path: Path):
    """(the checkpoint's model, its task, its train_args): copy (the user's file path copied into the
    temporary folder, checked again there) through Ultralytics' restricted loader under allocation_budget,
    or ExportError naming path and why it is refused."""
    from ultralytics.nn.tasks import (BaseModel, ClassificationModel, DetectionModel, OBBModel, PoseModel,
                                      SegmentationModel, guess_model_task, torch_safe_load)

    try:
        with allocation_budget(path):
            ckpt, _ = torch_safe_load(str(copy), safe_only=True)
    except Exception as e:  # noqa: BLE001  (a global outside the allow-list, a damaged archive, a missing module)
        raise ExportError(f"--detector {path}: not a loadable Ultralytics checkpoint: "
                          f"{_first_line(e).replace(str(copy), str(path))}")
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


IMGSZ_MAX = 2048  # pixels a side; ADetailer's detectors are 640, the largest YOLO trainings 1280


def _side(v) -> int | None:
    """One side of imgsz as an integer: an int (not a bool) or a float with an integral value; else None."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def _imgsz(path: Path, train_args: dict, model) -> list[int]:
    """The checkpoint's training size [h, w] (an int, [s] or [h, w], as Ultralytics takes it), each side a
    multiple of the model's stride from the stride to IMGSZ_MAX; else ExportError naming path."""
    args = getattr(model, "args", None)
    raw = train_args["imgsz"] if "imgsz" in train_args else (args.get("imgsz", 640) if isinstance(args, dict)
                                                              else 640)
    sides = [raw] if not isinstance(raw, (list, tuple)) else list(raw)
    size = [_side(v) for v in sides]
    if not 1 <= len(size) <= 2 or None in size:
        raise ExportError(f"--detector {path}: imgsz {str(raw)[:60]!r} of the checkpoint is not a size (an integer, "
                          "or [height, width] of integers)")
    size = size * 2 if len(size) == 1 else size
    stride = int(max(model.stride))
    if any(s < stride or s > IMGSZ_MAX or s % stride for s in size):
        raise ExportError(f"--detector {path}: imgsz {size} of the checkpoint is not a multiple of its stride {stride} "
                          f"from {stride} to {IMGSZ_MAX}")
    return size


def _classes(path: Path, model) -> list[str]:
    """The class names by id (ids 0..n-1, n at most CLASSES_MAX, each name one line of text without control
    characters: model.json's rule for names); else ExportError naming path."""
    names = getattr(model, "names", None)
    names = dict(enumerate(names)) if isinstance(names, (list, tuple)) else names
    if not isinstance(names, dict) or not 1 <= len(names) <= CLASSES_MAX or \
            any(type(k) is not int for k in names) or set(names) != set(range(len(names))):
        raise ExportError(f"--detector {path}: its class names are not ids 0..n-1 (1 <= n <= {CLASSES_MAX}) with a "
                          "name each")
    out = [str(names[i]) for i in range(len(names))]
    for i, name in enumerate(out):
        bad = next((c for c in name if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF), None)
        if bad is not None:
            raise ExportError(f"--detector {path}: class {i}'s name {name[:60]!r} holds a control character "
                              f"(U+{ord(bad):04X}); class names are one line of text")
    return out


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


def _torchscript(copy: Path, path: Path, task: str, imgsz: list[int], job) -> Path:
    """Ultralytics' TorchScript export of copy (loaded again by Ultralytics' restricted loader under
    allocation_budget) at imgsz, moved to job.tmp/detector.ts; a failure inside Ultralytics or torch is
    ExportError naming path, not a traceback."""
    from ultralytics import YOLO

    try:
        with allocation_budget(path):
            yolo = YOLO(str(copy), task=task)
        ts = Path(yolo.export(format="torchscript", imgsz=imgsz, device="cpu", half=False, dynamic=False,
                              optimize=False, batch=1, nms=False, verbose=False))
    except Exception as e:  # noqa: BLE001  (a model whose layers do not run at its imgsz, ...)
        raise ExportError(f"--detector {path}: Ultralytics' TorchScript export of it failed at imgsz {imgsz}: "
                          f"{_first_line(e).replace(str(copy), str(path))}")
    shutil.move(str(ts), str(job.tmp / "detector.ts"))
    return job.tmp / "detector.ts"


def export(a, job) -> int:
    """The checked file copied into job.tmp and checked again there (what is loaded is what was checked),
    loaded by Ultralytics, exported by Ultralytics into job.tmp, published as job.out."""
    from .common import file_digests, log, publish, sha256_file

    path = Path(a.detector)
    config = Path(tempfile.mkdtemp(prefix="ultralytics-config-", dir=job.tmp))
    offline_env(config)
    work = Path(tempfile.mkdtemp(prefix="work-", dir=job.tmp))
    copy = work / "model.pt"  # Ultralytics writes its export beside the file it loaded
    shutil.copyfile(path, copy)
    check_archive(copy, path)
    import torch
    import ultralytics

    model, task, train_args = load_model(copy, path)
    imgsz = _imgsz(path, train_args, model)
    classes = _classes(path, model)
    ts = _torchscript(copy, path, task, imgsz, job)
    try:
        check = _check(ts, model, imgsz)
    except Exception as e:  # noqa: BLE001
        raise ExportError(f"--detector {path}: the TorchScript module does not run at imgsz {imgsz}: {_first_line(e)}")
    source_sha256 = sha256_file(copy)
    shutil.rmtree(work)
    shutil.rmtree(config)
    head = model.model[-1]
    meta = {
        "format_version": 1, "kind": "detector", "name": path.stem, "source": f"detector:{path.resolve()}",
        "source_file": {"name": path.name, "sha256": source_sha256},
        "task": task, "classes": classes, "imgsz": imgsz,
        "stride": int(max(model.stride)), "architecture": str(model.yaml.get("yaml_file", "")),
        "ultralytics_version": ultralytics.__version__, "torch_version": torch.__version__,
        "dtype": "fp32", "export_device": "cpu",
        "detector": {"file": "detector.ts", "input": "[1,3,imgsz_h,imgsz_w] RGB in [0,1], letterboxed",
                     "output": "[1,4+nc,A]" if task == "detect" else "([1,4+nc+M,A], protos [1,M,h/4,w/4])"},
        "check": check,
    }
    if task == "segment":
        meta["mask_coefficients"] = int(head.nm)
    meta["files"] = file_digests(job.tmp)  # before model.json exists: a file cannot record its own sha256
    (job.tmp / "model.json").write_text(json.dumps(meta, indent=1) + "\n")
    publish(job.tmp, job.out)
    log(f"  wrote detector {job.out} ({task}, {len(classes)} classes: {', '.join(classes[:5])}, "
        f"imgsz {imgsz[0]}x{imgsz[1]}, Ultralytics {ultralytics.__version__})")
    return 0
