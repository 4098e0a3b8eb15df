#!/usr/bin/env python3
"""Model files that test_export_hostile.py gives export_sdxl.py (issue 56), all small, made here with
random weights:

    export_hostile_models.py OUT MARKER

  evil.pth, evil.pt, evil.ckpt  a TorchScript archive whose __setstate__ writes 8 bytes to MARKER when
                                it is loaded (checked here: loading it once must write MARKER)
  compact_x2.pth                Real-ESRGAN's SRVGGNetCompact at scale 2, 8 features (a state dict)
  compact_x64.pth               the same layout at scale 64 (sdxl-batch runs scales 1 to 16)
  bomb.pth                      compact_x2's tensors and 64 MiB of zeros in a torch.save archive whose entries
                                are deflated: about 70 KB that expand to 64 MiB as torch loads them
  face.pt                       an Ultralytics YOLOv8n detect checkpoint, classes face and hand, imgsz 64
  imgsz-nan.pt, imgsz-str.pt, imgsz-4096.pt
                                it with that training size (train_args imgsz NaN, "abc", 4096)
  control-name.pt               it with a class name that holds ESC
  broken-layer.pt               it with a second conv that takes 8 channels where the first gives 16
  big-linear.pt                 a torch.save archive whose pickle names an Ultralytics class and calls
                                torch.nn.Linear(16384, 32768) (2 GiB of float32) as it loads
"""
from __future__ import annotations

import copy
import os
import sys
import tempfile
import zipfile
from pathlib import Path

import torch


class Evil(torch.nn.Module):
    """What a hostile "4x-Upscaler.pth" can be: its __setstate__ is TorchScript, run by torch.jit.load."""

    def __init__(self, marker: str):
        super().__init__()
        self.marker = marker
        self.weight = torch.nn.Parameter(torch.zeros(4))
        self.hit = torch.zeros(8, dtype=torch.uint8)

    def forward(self, x):
        return x

    @torch.jit.export
    def __getstate__(self):
        return (self.marker, self.weight, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[str, torch.Tensor, bool]):
        self.marker = state[0]
        self.weight = state[1]
        self.training = state[2]
        self.hit = torch.from_file(self.marker, shared=True, size=8, dtype=torch.uint8).fill_(88)


def write_evil(out: Path, marker: Path) -> None:
    torch.jit.save(torch.jit.script(Evil(str(marker))), str(out / "evil.pth"))
    torch.jit.load(str(out / "evil.pth"))  # the file must do what it is meant to: write the marker
    if marker.read_bytes() != b"X" * 8:
        raise SystemExit(f"{out / 'evil.pth'}: loading it did not write {marker}")
    marker.unlink()
    for ext in (".pt", ".ckpt"):
        (out / f"evil{ext}").write_bytes((out / "evil.pth").read_bytes())


def compact(scale: int, nf: int = 8, nconv: int = 2) -> dict:
    """SRVGGNetCompact's keys (body: conv, PReLU, (conv, PReLU) x nconv, conv to 3 * scale^2)."""
    g = torch.Generator().manual_seed(scale)
    sd = {"body.0.weight": torch.randn(nf, 3, 3, 3, generator=g) * 0.3, "body.0.bias": torch.zeros(nf),
          "body.1.weight": torch.full((nf,), 0.25)}
    for i in range(nconv):
        sd[f"body.{2 + 2 * i}.weight"] = torch.randn(nf, nf, 3, 3, generator=g) * 0.15
        sd[f"body.{2 + 2 * i}.bias"] = torch.zeros(nf)
        sd[f"body.{3 + 2 * i}.weight"] = torch.full((nf,), 0.25)
    sd[f"body.{2 + 2 * nconv}.weight"] = torch.randn(3 * scale * scale, nf, 3, 3, generator=g) * 0.15
    sd[f"body.{2 + 2 * nconv}.bias"] = torch.full((3 * scale * scale,), 0.5)
    return sd


def write_upscalers(out: Path) -> None:
    torch.save({"params": compact(2)}, out / "compact_x2.pth")
    torch.save({"params": compact(64)}, out / "compact_x64.pth")
    plain = out / "bomb-stored.pth"
    torch.save({"params": compact(2), "zeros": torch.zeros(16 * 2**20)}, plain)
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(out / "bomb.pth", "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():  # torch's reader inflates a deflated entry as well as it reads a stored one
            dst.writestr(info.filename, src.read(info.filename))
    plain.unlink()


class BigLinear:
    """Pickled as a call of torch.nn.Linear(16384, 32768), which Ultralytics' allow-list permits."""

    def __reduce__(self):
        return (torch.nn.Linear, (16384, 32768))


def write_detectors(out: Path) -> None:
    os.environ.update(YOLO_CONFIG_DIR=tempfile.mkdtemp(prefix="yolo-cfg-"), YOLO_OFFLINE="1",
                      YOLO_AUTOINSTALL="false", ULTRALYTICS_SKIP_REQUIREMENTS_CHECKS="1", YOLO_VERBOSE="false")
    from ultralytics.nn.tasks import DetectionModel, yaml_model_load

    torch.manual_seed(0)
    model = DetectionModel(yaml_model_load("yolov8n.yaml"), nc=2, verbose=False)
    model.names = {0: "face", 1: "hand"}
    model.args = {"imgsz": 64, "task": "detect"}
    ckpt = {"model": model.eval().half(), "train_args": {"imgsz": 64, "task": "detect"}}
    torch.save(ckpt, out / "face.pt")
    for name, imgsz in (("nan", float("nan")), ("str", "abc"), ("4096", 4096)):
        torch.save({**ckpt, "train_args": {"imgsz": imgsz, "task": "detect"}}, out / f"imgsz-{name}.pt")
    named = copy.deepcopy(model)
    named.names = {0: "fa\x1bce", 1: "hand"}
    torch.save({**ckpt, "model": named}, out / "control-name.pt")
    broken = copy.deepcopy(model)
    broken.model[1].conv.weight = torch.nn.Parameter(torch.zeros(32, 8, 3, 3, dtype=torch.half))  # takes 16
    torch.save({**ckpt, "model": broken}, out / "broken-layer.pt")
    torch.save({"model": BigLinear(), "class": DetectionModel, "train_args": {}}, out / "big-linear.pt")


def main() -> None:
    out, marker = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    write_evil(out, marker)
    write_upscalers(out)
    write_detectors(out)


if __name__ == "__main__":
    main()
