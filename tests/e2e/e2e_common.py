"""What the e2e scripts (tests/e2e/test_*.py) share: their command line, running the
sdxl-batch binary, the asserts on its exit code and output, and the unittest entry point.
What they share with the parity scripts (running commands, pixels, PNG parameters,
manifest lines, the report) is tests/testkit.py, re-exported here.

ctest runs every e2e script with tests/ on PYTHONPATH, as it runs the parity scripts:
    PYTHONPATH=tests python tests/e2e/test_cli.py --binary B --model TINY --work DIR --source REPO
A script calls main() with the options it needs:
    sys.exit(main(__doc__, "--binary", "--model", "--work", "--source"))
and reads them from ARGS (filled in place, so `from e2e_common import ARGS` sees them)."""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import unittest
from pathlib import Path

from testkit import (ENV, meta_of, parameters, pixels, png_settings, read_manifest, read_report, run,  # noqa: F401
                     run_ok)

ARGS = argparse.Namespace()

OPTIONS = {
    "--binary": "the sdxl-batch executable",
    "--model": "the tiny model directory (fixture_tiny_model)",
    "--work": "scratch directory",
    "--source": "the repository (configs/, scripts/)",
    "--diffusers": "the tiny model's diffusers copy",
    "--python": "the Python with torch and diffusers (for exports and fixtures)",
    "--loras": "the test LoRAs (reference.make_test_loras)",
    "--example-ip-adapter": "the example batch's tiny IP-Adapter (fixture_example_adapters)",
    "--example-controlnet": "the example batch's tiny ControlNet (fixture_example_adapters)",
}


def main(doc: str, *common: str, extra=None) -> int:
    """Parses the `common` options (names of OPTIONS, all required) and extra(ap)'s into ARGS,
    makes --work, resolves --loras, and runs the script's tests verbosely (other arguments go to
    unittest, e.g. a test's name). Returns the exit code."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in common:
        ap.add_argument(name, required=True, help=OPTIONS[name])
    if extra:
        extra(ap)
    parsed, rest = ap.parse_known_args()
    ARGS.__dict__.update(vars(parsed))
    if getattr(ARGS, "loras", None):
        ARGS.loras = str(Path(ARGS.loras).resolve())
    if getattr(ARGS, "work", None):
        ARGS.work = str(Path(ARGS.work).resolve())  # links made in it get absolute targets
        Path(ARGS.work).mkdir(parents=True, exist_ok=True)
    program = unittest.main(module="__main__", argv=[sys.argv[0], "-v", *rest], exit=False)
    return 0 if program.result.wasSuccessful() else 1


def side_modules_option(ap) -> None:
    """--side-modules DIR, optional: the ctest fixture side_modules' folder (a ControlNet and the IP-Adapters
    exported once for several tests); without it a script makes its own."""
    ap.add_argument("--side-modules", help="the ctest fixture side_modules' folder (default: export under --work)")


def sdxl(*args, timeout: float = 600, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """The binary with these arguments, output captured, one intra-op thread."""
    return run([ARGS.binary, *args], timeout=timeout, env_extra=env_extra)


def python(*args, what: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """--python with these arguments and tests/ on PYTHONPATH; it must succeed (else SystemExit)."""
    return run_ok([ARGS.python, *args], what, timeout, env=dict(ENV, PYTHONPATH=str(Path(ARGS.source) / "tests")))


def export(*args, what: str) -> subprocess.CompletedProcess:
    """scripts/export_sdxl.py with these arguments (python())."""
    return python(Path(ARGS.source) / "scripts" / "export_sdxl.py", *args, what=what)


def fresh(name: str) -> Path:
    """An empty folder --work/name."""
    d = Path(ARGS.work) / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


class TestCase(unittest.TestCase):
    """unittest.TestCase with the asserts on a finished command."""

    def assertExit(self, r: subprocess.CompletedProcess, code: int, *needles: str) -> None:
        """r exited with `code` and its stdout + stderr contain every needle."""
        text = r.stdout + r.stderr
        self.assertEqual(r.returncode, code, f"stdout={r.stdout[-3000:]}\nstderr={r.stderr[-3000:]}")
        for n in needles:
            self.assertIn(n, text)

    def assertEachRefused(self, base: list, cases) -> None:
        """base + flags fails, its stderr naming `message`, for each (flags, message) of cases."""
        for flags, message in cases:
            r = run([*base, *flags])
            self.assertNotEqual(r.returncode, 0, flags)
            self.assertIn(message, r.stderr, flags)

    def assertOk(self, r: subprocess.CompletedProcess) -> None:
        """r exited 0 (else the end of its stderr is the message)."""
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
