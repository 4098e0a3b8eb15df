"""export_sdxl.py --upscaler FILE [FILE...] --out DIR: upscaler folders (DIR/<file stem>) that sdxl-batch
runs after decode ("upscale" in a batch file, `sdxl-batch upscale`).

A file is read as spandrel (requirements.txt pins it) reads it, minus its TorchScript path: .pth / .pt /
.ckpt through spandrel's restricted unpickler, .safetensors as is; never a plain torch.load of a pickle,
never torch.jit.load (spandrel would try a .pt as TorchScript first, which runs the archive's code): a
TorchScript archive is refused by inputs.not_torchscript, on the same open file torch.load then reads.
spandrel recognises the architecture from the keys and builds its module; the export accepts only
image-to-image models on RGB (spandrel's purposes "SR" and "Restoration", 3 channels in and out,
scale 1 to SCALE_MAX, what the runtime runs) and refuses, by name and before anything is written, a
file spandrel cannot read (truncated or damaged), a key layout no architecture of spandrel's main
registry recognises (spandrel keeps its non-commercial architectures in the separate
spandrel-extra-arches package, which the export does not load), face restoration ("FaceSR") and
inpainting models. Every file is checked
before the first folder is written: one refused file leaves nothing in --out.

Folder: upscaler.ts and model.json. upscaler.ts maps an image [B,3,h,w] in [0,1] (the model dtype)
to [B,3,h*scale,w*scale], not clamped (the runtime clamps after tiling, as ComfyUI's
ImageUpscaleWithModel does). model.json:
  kind "upscaler", name, source, architecture {id, name, tags}, scale, dtype (fp16 where spandrel says
  the architecture supports half precision, else fp32; --dtype fp32 forces fp32),
  size_requirements {minimum, multiple_of, square} (spandrel's),
  tile {"fixed": false} for convolutional architectures, traced once and checked at a second size; or
  {"fixed": true, "size": T} for the window-attention architectures (WINDOW_ARCHS), whose spandrel
  forward builds the shifted-window masks from the input size in Python: traced at T x T
  (--upscaler-tile, default 512, ComfyUI's tile) and run only at that size (the runtime pads a smaller
  tile by reflection to T and crops the output),
  check (the traced module vs spandrel's eager module in fp32), files (size and sha256).
"""
from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .common import Checker, check_names, file_digests, log, publish, sha256_file, summarize_checks
from .inputs import ExportError, not_torchscript, open_regular, read_header, regular_file

EXTENSIONS = (".pth", ".pt", ".ckpt", ".safetensors")
ACCEPTED_PURPOSES = ("SR", "Restoration")
SCALE_MAX = 16  # the runtime's limit on model.json "scale" (src/model/model_config.cpp, parse_upscaler_config)
# spandrel architecture ids whose forward computes window partitions and attention masks from the
# input size in Python: a trace holds one size.
WINDOW_ARCHS = {"SwinIR", "Swin2SR", "HAT", "DAT", "ATD", "DRCT", "GRL", "RGT", "SRFormer", "IPT", "MoSR", "FDAT"}
DYNAMIC_TRACE, DYNAMIC_CHECK = (40, 48), (37, 53)  # (h, w): traced at the first (rounded up to the padding
# multiple), checked at both (the second odd, so a padding the trace dropped shows)


@dataclass
class Loaded:
    path: Path
    descriptor: object  # spandrel ImageModelDescriptor


def check_file(path: Path) -> None:
    """The file's existence, kind and extension (and a safetensors header) before torch or spandrel read it."""
    regular_file(path, "--upscaler")
    if path.suffix.lower() not in EXTENSIONS:
        raise ExportError(f"--upscaler {path}: extension '{path.suffix}' is not one of {', '.join(EXTENSIONS)}")
    if path.suffix.lower() == ".safetensors":
        read_header(path)


def read_state_dict(path: Path) -> dict:
    """The file's tensors, canonicalised as spandrel's loader does: a .safetensors file by safetensors, any
    other through spandrel's restricted unpickler on the file opened once and checked (not TorchScript,
    inputs.not_torchscript) before torch.load reads it."""
    from safetensors.torch import load_file
    from spandrel import canonicalize_state_dict
    from spandrel.__helpers.unpickler import RestrictedUnpickle

    label = f"--upscaler {path}"
    if path.suffix.lower() == ".safetensors":
        read_header(path)
        return canonicalize_state_dict(load_file(str(path), device="cpu"))
    with open_regular(path, label) as f:
        not_torchscript(f, label)
        return canonicalize_state_dict(torch.load(f, map_location="cpu", pickle_module=RestrictedUnpickle,
                                                  weights_only=False))


def load(path: Path) -> Loaded:
    """spandrel's descriptor of path, or ExportError naming the file and why it is refused."""
    from spandrel import ImageModelDescriptor, ModelLoader, UnsupportedModelError

    try:
        state = read_state_dict(path)
    except ExportError:
        raise
    except Exception as e:  # noqa: BLE001  (truncated zip, bad pickle, a global the unpickler refuses)
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise ExportError(f"--upscaler {path}: cannot be read as a model file (truncated or damaged?): {first}")
    try:
        desc = ModelLoader("cpu").load_from_state_dict(state)
    except UnsupportedModelError:
        raise ExportError(f"--upscaler {path}: unknown key layout: no architecture of spandrel's main registry "
                          "recognises it (spandrel's non-commercial architectures are not supported)")
    except Exception as e:  # noqa: BLE001  (a recognised layout with inconsistent shapes)
        raise ExportError(f"--upscaler {path}: recognised by its keys but the weights do not fit the architecture: "
                          f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__}")
    arch = f"{desc.architecture.name} ({desc.architecture.id})"
    if not isinstance(desc, ImageModelDescriptor) or desc.purpose not in ACCEPTED_PURPOSES:
        raise ExportError(f"--upscaler {path}: {arch} is a {desc.purpose} model (purpose '{desc.purpose}'), "
                          "not an upscaler")
    if desc.input_channels != 3 or desc.output_channels != 3:
        raise ExportError(f"--upscaler {path}: {arch} takes {desc.input_channels} and gives {desc.output_channels} "
                          "channels; an upscaler maps RGB to RGB")
    if not 1 <= desc.scale <= SCALE_MAX:
        raise ExportError(f"--upscaler {path}: {arch} has scale {desc.scale}; sdxl-batch runs upscalers of scale 1 "
                          f"to {SCALE_MAX}")
    return Loaded(path, desc)


class PadCrop(torch.nn.Module):
    """The scripted shell around the traced module (`model`: its parameter names are "model." + the
    file's keys as spandrel names them): pads the input by reflection to a multiple of `multiple` and
    crops the output to h*scale x w*scale. spandrel's pixel-unshuffle ESRGANs pad inside forward under
    a Python `if`, which a trace at a multiple size drops; here the padding is in the graph for every size."""

    def __init__(self, model, multiple: int, scale: int):
        super().__init__()
        self.model = model
        self.multiple = multiple
        self.scale = scale

    def forward(self, x):
        h, w = x.shape[2], x.shape[3]
        ph = (self.multiple - h % self.multiple) % self.multiple
        pw = (self.multiple - w % self.multiple) % self.multiple
        if ph > 0 or pw > 0:
            x = torch.nn.functional.pad(x, [0, pw, 0, ph], mode="reflect")
        return self.model(x)[:, :, : h * self.scale, : w * self.scale]


def trace_size(desc, tile: int) -> tuple[int, int] | None:
    """The fixed (h, w) the architecture is traced at, or None when it is traced for any size."""
    if desc.architecture.id not in WINDOW_ARCHS:
        return None
    req = desc.size_requirements
    if tile < req.minimum or tile % max(1, req.multiple_of):
        raise ExportError(f"--upscaler-tile {tile}: {desc.architecture.name} needs a multiple of "
                          f"{req.multiple_of} of at least {req.minimum}")
    return (tile, tile)


def export_one(item: Loaded, tmp: Path, dtype_name: str, tile: int) -> dict:
    """Traces item into tmp (upscaler.ts), checks it against spandrel's module, writes model.json."""
    desc = item.descriptor
    half = dtype_name != "fp32" and desc.supports_half
    eager = desc.model.eval().float()
    fixed = trace_size(desc, tile)
    req = desc.size_requirements
    multiple = int(getattr(eager, "shuffle_factor", None) or 1)  # ESRGAN's pixel-unshuffle variants
    trace_hw = fixed or tuple(-(-max(s, req.minimum) // multiple) * multiple for s in DYNAMIC_TRACE)
    sizes = [trace_hw] if fixed else [trace_hw, DYNAMIC_CHECK]
    gen = torch.Generator().manual_seed(5)
    inputs = [torch.rand(1, 3, h, w, generator=gen) for h, w in sizes]
    with torch.no_grad():
        traced = torch.jit.trace(eager, (inputs[0],), check_trace=False, strict=False)
    torch.jit.save(torch.jit.script(PadCrop(traced, multiple, int(desc.scale))), str(tmp / "upscaler.ts"))
    check_names(tmp / "upscaler.ts", eager, "cpu", "upscaler", prefix="model.")
    chk = Checker(torch.float32, "cpu")
    ts = torch.jit.load(str(tmp / "upscaler.ts"), map_location="cpu")
    for x in inputs:
        chk.run_safe("upscaler.ts", dict(batch=1, height=x.shape[2], width=x.shape[3]), ts, eager, (x,))
    bad = [r for r in chk.results if not r["ok"]]
    if bad:
        raise SystemExit(f"--upscaler {item.path}: the traced module does not match spandrel's: {bad[0]}")
    if half:  # traced in fp32 (the check); the fp16 module is the same graph with its weights cast
        ts = torch.jit.load(str(tmp / "upscaler.ts"), map_location="cpu").half()
        torch.jit.save(ts, str(tmp / "upscaler.ts"))
    meta = {
        "format_version": 1, "kind": "upscaler", "name": item.path.stem, "source": f"upscaler:{item.path.resolve()}",
        "architecture": {"id": desc.architecture.id, "name": desc.architecture.name, "tags": list(desc.tags)},
        "source_file": {"name": item.path.name, "sha256": sha256_file(item.path)},
        "scale": int(desc.scale), "dtype": "fp16" if half else "fp32", "export_device": "cpu",
        "supports_half": bool(desc.supports_half), "supports_bfloat16": bool(desc.supports_bfloat16),
        "torch_version": torch.__version__,
        "size_requirements": {"minimum": int(req.minimum), "multiple_of": int(req.multiple_of),
                              "square": bool(req.square)},
        "tile": {"fixed": True, "size": fixed[0]} if fixed else {"fixed": False},
        "upscaler": {"file": "upscaler.ts", "input": "[B,3,h,w] RGB in [0,1]", "output": "[B,3,h*scale,w*scale]"},
        "check": {"level": "quick", "modules": summarize_checks(chk.results), "notes": []},
    }
    meta["files"] = file_digests(tmp)  # before model.json exists: a file cannot record its own sha256
    (tmp / "model.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def export_all(a) -> int:
    """Every --upscaler file checked and loaded first (ExportError on the first refused: nothing written),
    then each exported to --out/<stem> (atomically, one folder at a time)."""
    paths = [Path(p) for p in a.upscaler]
    for p in paths:
        check_file(p)
    stems = [p.stem for p in paths]
    dup = sorted({s for s in stems if stems.count(s) > 1})
    if dup:
        raise ExportError(f"--upscaler: two files would both be written to {a.out}/{dup[0]}")
    out = Path(a.out).resolve()
    for s in stems:
        if (out / s).exists() and not a.force:
            raise SystemExit(f"{out / s} exists (use --force to overwrite)")
    torch.set_grad_enabled(False)
    items = [load(p) for p in paths]
    dtype_name = a.dtype or "fp16"
    out.mkdir(parents=True, exist_ok=True)
    for item in items:
        tmp = Path(tempfile.mkdtemp(prefix=f".{item.path.stem}.tmp-", dir=out))
        try:
            meta = export_one(item, tmp, dtype_name, a.upscaler_tile)
            publish(tmp, out / item.path.stem)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        tile = f"fixed tile {meta['tile']['size']}" if meta["tile"]["fixed"] else "any tile size"
        log(f"  wrote upscaler {out / item.path.stem} ({meta['architecture']['name']}, x{meta['scale']}, "
            f"{meta['dtype']}, {tile})")
    return 0
