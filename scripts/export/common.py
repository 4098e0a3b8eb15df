"""What every export kind shares: dtypes, the log, the job an export kind gets, tracing a module and checking its parameter names, comparing traces with their
eager modules, hashing files and publishing the finished folder. Imports nothing from the package."""
from __future__ import annotations

import hashlib
import math
import os
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class Job:
    """What cli gives an export kind's export(a, job): the kind (its flag's name), the dtype, the
    device, the folder to publish (out) and the temporary folder beside it the files are written to."""
    kind: str
    dtype_name: str
    dtype: torch.dtype
    device: str
    out: Path
    tmp: Path
    t_start: float


def dtype_str(dtype: torch.dtype) -> str:
    """fp32 / fp16 / bf16 of a torch dtype (model.json's names)."""
    return {v: k for k, v in DTYPES.items()}[dtype]


def log(msg: str) -> None:
    print(msg, flush=True)


def count_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


class SharedChildren(nn.Module):
    """Registers the children of `inner` as its own (so the traced module's
    parameter names equal inner's state-dict keys) and calls inner's methods."""

    def __init__(self, inner: nn.Module, children: tuple[str, ...] | None = None):
        super().__init__()
        assert not list(inner.named_parameters(recurse=False)), "direct params not supported"
        assert not list(inner.named_buffers(recurse=False)), "direct buffers not supported"
        for n, m in inner.named_children():
            if children is None or n in children:
                self.add_module(n, m)
        object.__setattr__(self, "_inner", inner)  # not a registered submodule


def trace_module(mod: nn.Module, inputs: tuple | dict, path: Path):
    """Traces mod's forward on `inputs`, or each method of a {method: inputs} dict, into `path`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", category=torch.jit.TracerWarning)
        with torch.no_grad():
            if isinstance(inputs, dict):
                ts = torch.jit.trace_module(mod, inputs, check_trace=False, strict=False)
            else:
                ts = torch.jit.trace(mod, inputs, check_trace=False, strict=False)
    torch.jit.save(ts, str(path))
    return tracer_warnings(caught)


def tracer_warnings(caught: list) -> list[str]:
    """The distinct TracerWarnings of a trace (warnings.catch_warnings(record=True)), one line each."""
    return sorted({f"{Path(w.filename).name}:{w.lineno}: {str(w.message).splitlines()[0][:90]}"
                   for w in caught if issubclass(w.category, torch.jit.TracerWarning)})


def check_names(ts_path: Path, ref: nn.Module, device: str, label: str, prefix: str = "") -> None:
    """The traced module must carry every parameter (none baked as constants) under the same names."""
    ts = torch.jit.load(str(ts_path), map_location=device)
    got = {n: p for n, p in ts.named_parameters()}
    want = {prefix + n: p for n, p in ref.named_parameters()}
    if set(got) != set(want):
        missing = sorted(set(want) - set(got))[:5]
        extra = sorted(set(got) - set(want))[:5]
        raise SystemExit(f"{label}: parameter names differ from the eager module (missing {missing}, extra {extra})")


class Checker:
    def __init__(self, dtype: torch.dtype, device: str):
        self.dtype = dtype
        self.device = device
        self.rtol = 1e-4 if dtype == torch.float32 else 2e-2
        self.results: list[dict] = []

    def _cmp(self, a, b):
        a = a.float()
        b = b.float()
        if a.shape != b.shape:
            return math.inf, float(b.abs().max()), False
        finite = bool(torch.isfinite(a).all()) == bool(torch.isfinite(b).all())
        d = float((a - b).abs().max()) if finite else math.inf
        scale = float(b.abs().max())
        return d, scale, finite and d <= self.rtol * max(1.0, scale)

    def run(self, module: str, key: dict, ts, eager, inputs: tuple):
        with torch.no_grad():
            t0 = time.perf_counter()
            out_t = ts(*inputs)
            t1 = time.perf_counter()
            out_e = eager(*inputs)
            t2 = time.perf_counter()
        if not isinstance(out_t, (tuple, list)):
            out_t, out_e = (out_t,), (out_e,)
        worst, ok, scale = 0.0, True, 0.0
        err = None
        try:
            for a, b in zip(out_t, out_e):
                d, s, good = self._cmp(a, b)
                worst, scale, ok = max(worst, d), max(scale, s), ok and good
        except Exception as e:  # noqa: BLE001
            ok, err = False, str(e)[:200]
        r = dict(module=module, **key, max_abs_diff=worst, ref_abs_max=scale, ok=ok,
                 ts_s=round(t1 - t0, 3), eager_s=round(t2 - t1, 3))
        if err:
            r["error"] = err
        self.results.append(r)
        return out_t

    def run_safe(self, module, key, ts, eager, inputs):
        try:
            return self.run(module, key, ts, eager, inputs)
        except Exception as e:  # noqa: BLE001  (a traced graph that cannot run a shape)
            self.results.append(dict(module=module, **key, max_abs_diff=math.inf, ok=False, error=str(e).split("\n")[0][:200]))
            return None


def summarize_checks(results: list[dict]) -> dict:
    per = {}
    for r in results:
        m = r["module"] + (" (batch consistency)" if "batch_consistency" in r else "")
        s = per.setdefault(m, dict(cases=0, failed=0, max_abs_diff=0.0))
        s["cases"] += 1
        s["failed"] += 0 if r["ok"] else 1
        s["max_abs_diff"] = max(s["max_abs_diff"], r["max_abs_diff"])
    return per


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def file_digests(folder: Path) -> dict:
    """Size and sha256 of every file under folder (model.json "files": --verify-model checks them)."""
    return {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted(folder.rglob("*")) if p.is_file()}


def publish(tmp: Path, out: Path) -> None:
    """Replace out by tmp atomically: readers see the old folder or the new one, never a mix."""
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)

