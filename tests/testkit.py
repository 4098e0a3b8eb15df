"""What the e2e and the parity scripts share: running sdxl-batch (or any command) with its
output captured, reading a PNG's pixels and A1111 parameters, a run's manifest lines and
report.

ctest runs both kinds with tests/ on PYTHONPATH (`import testkit`, `from reference import
...`); run a script by hand the same way: PYTHONPATH=tests python tests/e2e/test_cli.py ...
numpy + pillow only."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
from PIL import Image

# One intra-op thread for everything a test starts: the tiny model is faster so, and ctest
# runs tests side by side on a 2-core machine.
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def run(cmd: list, timeout: float | None = 600, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """cmd (its parts made str) with stdout and stderr captured as text (bytes that are not
    UTF-8 replaced, so hostile output cannot break the test), ENV plus env_extra."""
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, errors="replace", timeout=timeout,
                          env=dict(ENV, **(env_extra or {})))


def run_ok(cmd: list, what: str, timeout: float | None = 1800, env: dict | None = None) -> subprocess.CompletedProcess:
    """cmd, which must succeed: else SystemExit naming `what` with the ends of its output.
    env: the whole environment (default: this process's)."""
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise SystemExit(f"{what} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return r


def pixels(png: Path) -> np.ndarray:
    """A PNG's RGB pixels as int32 (height, width, 3): differences of two images do not wrap."""
    with Image.open(png) as im:
        return np.asarray(im.convert("RGB")).astype(np.int32)


def parameters(png: Path) -> str:
    """The PNG's A1111 "parameters" text ("" when it has none)."""
    with Image.open(png) as im:
        return str(im.info.get("parameters", ""))


def png_settings(png: Path) -> tuple[tuple[int, int], dict]:
    """(size, the settings line of its parameters as a dict: "Steps" -> "3", ...)."""
    with Image.open(png) as im:
        lines = im.info["parameters"].split("\n")
        return im.size, dict(kv.split(": ", 1) for kv in lines[-1].split(", "))


def read_manifest(folder: Path, name: str = "manifest.jsonl") -> list[dict]:
    """The lines of a run's manifest, parsed (a torn line fails)."""
    return [json.loads(line) for line in (Path(folder) / name).read_text().splitlines()]


def read_report(folder: Path) -> dict:
    """A run's report.json."""
    return json.loads((Path(folder) / "report.json").read_text())


def meta_of(folder: Path) -> dict:
    """A model or side-module folder's model.json."""
    return json.loads((Path(folder) / "model.json").read_text())
