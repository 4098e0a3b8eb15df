"""Weight files before and after they are read: a safetensors header checked before the file is
handed to the library (a truncated file, a pickle), and a module built on the meta device filled
from a state dict (every tensor must arrive with its shape). Used by every export kind that reads
weights (checkpoint, controlnet, ip_adapter)."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from .common import ExportError

HEADER_MAX = 100 * 2**20


def read_header(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape, from the safetensors header, after checking that the file
    holds every byte the header describes."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ExportError(f"{path}: {size} bytes, too short to be a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if head[:2] == b"PK" or head[:1] == b"\x80":
            raise ExportError(f"{path}: a pickle (.ckpt/.pt) checkpoint; loading one can run code. "
                              "Convert it to .safetensors with a tool you trust first")
        if n > min(HEADER_MAX, size - 8):
            raise ExportError(f"{path}: not a safetensors file (header length {n} does not fit in {size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ExportError(f"{path}: not a safetensors file (header is not JSON: {e})")
    if not isinstance(header, dict):
        raise ExportError(f"{path}: not a safetensors file (header is not a JSON object)")
    shapes, end = {}, 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            shapes[name] = [int(d) for d in info["shape"]]
            end = max(end, int(info["data_offsets"][1]))
        except (KeyError, TypeError, ValueError, IndexError):
            raise ExportError(f"{path}: tensor '{name}' has no valid shape / data_offsets in the header")
    if 8 + n + end > size:
        raise ExportError(f"{path}: truncated: the header describes {8 + n + end} bytes, the file has {size} "
                          "(an interrupted download or copy?)")
    return shapes



def _materialise_position_ids(module: torch.nn.Module, device: str) -> None:
    """CLIP's position_ids is a non-persistent buffer (no file holds it): make it on `device`."""
    for name, buf in list(module.named_buffers()):
        if buf.device.type != "meta":
            continue
        if not name.endswith("position_ids"):
            raise ExportError(f"internal: buffer {name} has no value after loading")
        owner = module.get_submodule(name.rsplit(".", 1)[0]) if "." in name else module
        owner.register_buffer("position_ids", torch.arange(buf.shape[-1], device=device).expand(buf.shape),
                              persistent=False)



def fill_module(module: torch.nn.Module, sd: dict[str, torch.Tensor], label: str, src: Path,
                device: str, dtype: torch.dtype) -> torch.nn.Module:
    """Assign `sd` to a module built on the meta device: every parameter must arrive with
    its shape; a tensor the module does not have is an error too (a wider or deeper model)."""
    want = module.state_dict()
    missing = sorted(set(want) - set(sd))
    extra = sorted(k for k in set(sd) - set(want) if not k.endswith("position_ids"))
    wrong = sorted(k for k in set(want) & set(sd) if list(want[k].shape) != list(sd[k].shape))
    if missing or extra or wrong:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
        if wrong:
            k = wrong[0]
            parts.append(f"{len(wrong)} of another shape (e.g. {k}: file {list(sd[k].shape)}, "
                         f"model {list(want[k].shape)})")
        if extra:
            parts.append(f"{len(extra)} the model does not have (e.g. {', '.join(extra[:3])})")
        hint = (" A model of another shape needs --config DIR with its configs" if wrong or extra
                else " The file is incomplete or was written by a tool that renamed them")
        raise ExportError(f"{src}: {label} does not fit the architecture: {'; '.join(parts)}.{hint}")
    sd = {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype) for k, v in sd.items() if k in want}
    module.load_state_dict(sd, strict=True, assign=True)
    _materialise_position_ids(module, device)
    return module.eval().requires_grad_(False)

