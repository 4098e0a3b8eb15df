"""Weights once read: every value finite (a NaN or an infinity in a checkpoint or VAE exports fine
and then fails every image), and a module built on the meta device filled from a state dict (every
tensor must arrive with its shape). The files themselves are checked before they are read
(inputs.read_header). Used by every export kind that reads weights."""
from __future__ import annotations

from itertools import chain
from pathlib import Path

import torch

from .inputs import ExportError


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


def _nonfinite(t: torch.Tensor) -> str | None:
    """How many NaN (or, without NaN, infinite) values t holds, in words; None when all are finite."""
    if not t.is_floating_point():
        return None
    if t.element_size() == 1:  # float8: isfinite is not there for every float8 type; fp16 holds their range
        t = t.to(torch.float16)
    if bool(torch.isfinite(t).all()):
        return None
    nan = int(torch.isnan(t).sum())
    bad = nan or int((~torch.isfinite(t)).sum())
    return f"{bad} NaN (not-a-number) values" if nan else f"{bad} infinite values"


def check_finite(tensors: dict[str, torch.Tensor], src: Path, names=None, owner: str = "") -> None:
    """Refuses src when a tensor of `tensors` (those in `names`, in their order; default all) holds a
    NaN or an infinity, naming the first such tensor (and its owner, e.g. "the VAE's "): weights like
    that make every image NaN."""
    for k in (tensors if names is None else names):
        what = _nonfinite(tensors[k])
        if what:
            raise ExportError(f"{src}: {owner}tensor '{k}' holds {what} of {tensors[k].numel()}: every image would "
                              "fail (a damaged file, or weights saved from a diverged training run)")


def check_finite_module(module: torch.nn.Module, label: str, src: Path) -> None:
    """check_finite of a loaded module's parameters and buffers (a diffusers folder's component)."""
    check_finite(dict(chain(module.named_parameters(), module.named_buffers())), src, owner=f"{label}'s ")
