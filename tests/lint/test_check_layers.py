#!/usr/bin/env python3
"""Self-test of check_layers.py: it passes on a copy of the tree and, with one
violation of each rule planted in the copy, fails naming each file, line and
rule and nothing else. The files planted in are picked from the layers that
CMakeLists.txt declares, so moving files between layers does not break this test.

Usage: test_check_layers.py [--root DIR]   (default: the repository holding this file)
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import check_layers as cl  # noqa: E402

ROOT = HERE.parents[1]
COPIED = ["CMakeLists.txt", "cmake/SdxlLayer.cmake", "src", "include", "tests/unit", "bench/tools"]


def copy_tree(dest: Path) -> None:
    for rel in COPIED:
        src = ROOT / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def run_checker(root: Path) -> tuple[int, list[str]]:
    p = subprocess.run([sys.executable, str(HERE / "check_layers.py"), "--root", str(root)],
                       capture_output=True, text=True, timeout=120)
    return p.returncode, (p.stdout + p.stderr).splitlines()


def append_line(path: Path, text: str) -> int:
    """Appends `text` as the last line of `path` (so that plants in one file do not
    move each other); returns its line number."""
    old = path.read_text()
    if old and not old.endswith("\n"):
        old += "\n"
    path.write_text(old + text + "\n")
    return old.count("\n") + 1


def append_function(path: Path, name: str, total_lines: int) -> int:
    """Appends a function spanning `total_lines` lines (signature to closing brace);
    returns the line of its signature."""
    text = path.read_text()
    if not text.endswith("\n"):
        text += "\n"
    start = text.count("\n") + 2  # after one blank line
    body = ["  x += 1;"] * (total_lines - 3) + ["  return x;"]
    text += "\n" + "\n".join([f"int {name}(int x) {{", *body, "}"]) + "\n"
    path.write_text(text)
    return start


class Picks:
    """Files and headers to plant violations with, chosen from the declared layers."""

    def __init__(self, tree: cl.Tree):
        units = tree.units
        layers = [u for u in units.values() if u.kind == "layer"]
        free = [u for u in layers if not u.torch]
        headers = {u.name: [f for f in u.files if f.endswith(".h")] for u in layers}

        def cpp(u: cl.Unit) -> str:
            return next(f for f in u.files if f.endswith(".cpp"))

        def include_of(rel: str) -> str:
            return rel.split("/", 1)[1]  # "src/x/y.h" -> "x/y.h"

        # A `..` include of a header the layer may include: only no-dotdot fires.
        self.dotdot_file = cpp(free[0])
        self.dotdot_include = "../" + include_of(headers[free[0].name][0])
        # The issue's other form, in tests/unit (read by no-dotdot only).
        self.dotdot_test_file = tree.files_under("tests/unit")[0]
        # A torch header written in a layer that is not TORCH.
        self.torch_file = cpp(free[-1])
        # A header of a declared TORCH layer that reaches torch through repo headers.
        # (the longest way round there is, so that it is torch through another header).
        self.taint_file, self.taint_include = max(
            ((cpp(u), include_of(h)) for u in free for dep in sorted(u.allowed - {u.name})
             for h in headers.get(dep, []) if tree.torch_chain(h)),
            key=lambda pick: len(tree.torch_chain("src/" + pick[1]) or []))
        # A torch-free header of a layer the layer does not declare, one that it reaches
        # through PUBLIC links if there is one (the case that compiles).
        self.undeclared_file, self.undeclared_include, self.undeclared_layer = max(
            ((cpp(u), include_of(h), other.name) for u in free for other in free
             if other.name not in u.allowed for h in headers[other.name] if not tree.torch_chain(h)),
            key=lambda pick: tree.public_path(units[pick[0].split("/")[1]].allowed, pick[2]) is not None)
        # The same for an executable and the layers it links.
        exe = next(u for u in units.values() if u.kind == "executable")
        shared = {f for u in units.values() if u is not exe for f in u.files}
        self.exe_file = next(f for f in exe.files if f.endswith(".cpp") and f not in shared)
        self.exe_include, self.exe_layer = next(
            (include_of(h), other.name) for other in free if other.name not in exe.allowed
            for h in headers[other.name] if not tree.torch_chain(h))
        self.core_cpp = cpp(layers[0])


class CheckLayersTest(unittest.TestCase):
    def setUp(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="check_layers_")
        self.root = Path(self._tmp.name)
        copy_tree(self.root)

    def tearDown(self) -> None:
        self._tmp.cleanup()

    def test_clean_copy_passes(self) -> None:
        rc, out = run_checker(self.root)
        print("\n".join(out))
        self.assertEqual(rc, 0, out)
        self.assertTrue(out[-1].startswith("check_layers: ok;"), out)

    def test_each_planted_violation_is_named(self) -> None:
        p = Picks(cl.Tree(self.root))
        r = self.root
        expected = {}  # "path:line: [rule]" -> a part of the message it must have
        n = append_line(r / p.dotdot_file, f'#include "{p.dotdot_include}"')
        expected[f"{p.dotdot_file}:{n}: [no-dotdot]"] = p.dotdot_include
        n = append_line(r / p.dotdot_test_file, '#include "batch/../top/t.h"')
        expected[f"{p.dotdot_test_file}:{n}: [no-dotdot]"] = "batch/../top/t.h"
        n = append_line(r / p.torch_file, "#include <torch/types.h>")
        expected[f"{p.torch_file}:{n}: [torch-free]"] = "<torch/types.h>"
        n = append_line(r / p.taint_file, f'#include "{p.taint_include}"')
        expected[f"{p.taint_file}:{n}: [torch-free]"] = "which reaches torch: src/" + p.taint_include
        n = append_line(r / p.undeclared_file, f'#include "{p.undeclared_include}"')
        expected[f"{p.undeclared_file}:{n}: [declared-deps]"] = f"does not declare {p.undeclared_layer}"
        n = append_line(r / p.exe_file, f'#include "{p.exe_include}"')
        expected[f"{p.exe_file}:{n}: [declared-deps]"] = f"does not link sdxl_{p.exe_layer}"
        # 101 lines fails; 100 lines (the limit) passes.
        n = append_function(r / p.core_cpp, "planted_101_lines", 101)
        expected[f"{p.core_cpp}:{n}: [function-size]"] = "planted_101_lines has 101 lines"
        append_function(r / p.core_cpp, "planted_100_lines", 100)
        # A layer declared later is read from CMakeLists.txt; an undeclared folder is reported.
        with open(r / "CMakeLists.txt", "a") as f:
            f.write("\nsdxl_layer(planted\n  SOURCES src/planted/a.cpp\n  PUBLIC core)\n")
        (r / "src/planted").mkdir()
        (r / "src/planted/a.cpp").write_text(f'#include "core/error.h"\n#include "{p.undeclared_include}"\n')
        expected["src/planted/a.cpp:2: [declared-deps]"] = f"layer planted includes \"{p.undeclared_include}\""
        (r / "src/stray").mkdir()
        (r / "src/stray/b.cpp").write_text("int b() { return 0; }\n")
        expected["src/stray/b.cpp:1: [unowned]"] = "stray/ is no sdxl_layer"

        rc, out = run_checker(r)
        print("\n".join(out))
        self.assertEqual(rc, 1, out)
        found = [line for line in out if not line.startswith("check_layers:")]
        for prefix, part in expected.items():
            hits = [line for line in found if line.startswith(prefix + " ")]
            self.assertEqual(len(hits), 1, f"{prefix} not reported once in:\n" + "\n".join(out))
            self.assertIn(part, hits[0])
        self.assertEqual(len(found), len(expected), "unexpected violations:\n" + "\n".join(out))
        self.assertTrue(out[-1].startswith(f"check_layers: {len(expected)} violation(s);"), out[-1])

    def test_a_new_include_rule_is_one_row(self) -> None:
        # What the lead's "cli includes only include/sdxl_batch/" rule would look like.
        exe = next(u for u in cl.Tree(self.root).units.values() if u.kind == "executable")
        rule = cl.IncludeRule("public-api-only", cl.files_of(exe.name), cl.only_from("include/sdxl_batch/"))
        lines, _ = cl.run(self.root, [rule])
        self.assertTrue(lines, "an executable that includes layer headers passes only_from(include/)")
        self.assertTrue(all("[public-api-only] includes" in line for line in lines), lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT)
    args, rest = ap.parse_known_args()
    ROOT = args.root.resolve()
    unittest.main(argv=[sys.argv[0], "-v", *rest])
