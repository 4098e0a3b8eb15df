#!/usr/bin/env python3
"""Self-test of check_layers.py: it passes on a copy of the tree and, with one
violation of each rule planted in the copy, fails naming each file, line and
rule and nothing else. The files planted in are picked from the layers that
CMakeLists.txt declares, so moving files between layers does not break this test;
the layers of the CMake plants are the issue's (batch, scheduler, text, ...),
asserted to be in the lint's table first.

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
COPIED = ["CMakeLists.txt", "cmake", "src", "include", "tests", "bench", "scripts", "docs/architecture.md"]


def copy_tree(dest: Path) -> None:
    for rel in COPIED:
        src = ROOT / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__", "results"))
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


def line_of(path: Path, text: str) -> int:
    """The first line of `path` that holds `text` (a plant's expected line)."""
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def this_line(text: str) -> int:
    return line_of(HERE / "check_layers.py", text)


def add_to_call(text: str, opening: str, before_close: str, after_name: str = "",
                blank: bool = False) -> tuple[str, int]:
    """Edits the CMake call that starts with `opening` (e.g. "sdxl_layer(batch"), its line
    numbers kept: adds `after_name` after the opening and `before_close` before its closing
    parenthesis, or with `blank`, replaces the call by blanks and newlines. Returns the new
    text and the call's line."""
    start = text.index(opening)
    end = text.index(")", start)
    call = text[start:end + 1]
    if blank:
        new = "\n" * call.count("\n")
    else:
        new = opening + after_name + call[len(opening):-1] + before_close + ")"
    return text[:start] + new + text[end + 1:], text.count("\n", 0, start) + 1


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
        self.fuzz_file = tree.files_under("tests/fuzz")[0]
        # An include of a macro, in the public header's folder.
        self.macro_file = tree.files_under("include")[0]
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
        # "path:line: [rule]" -> a part of each message reported there (one each)
        expected: dict[str, list[str]] = {}
        self.plant_includes(p, expected)
        self.plant_cmake(p, expected)
        self.plant_python(expected)

        rc, out = run_checker(self.root)
        print("\n".join(out))
        self.assertEqual(rc, 1, out)
        found = [line for line in out if not line.startswith("check_layers:")]
        for prefix, parts in expected.items():
            hits = [line for line in found if line.startswith(prefix + " ")]
            self.assertEqual(len(hits), len(parts), f"{prefix} not reported {len(parts)}x in:\n" + "\n".join(out))
            for part in parts:
                self.assertTrue(any(part in hit for hit in hits), f"{prefix}: no {part!r} in {hits}")
        count = sum(len(parts) for parts in expected.values())
        self.assertEqual(len(found), count, "unexpected violations:\n" + "\n".join(out))
        self.assertTrue(out[-1].startswith(f"check_layers: {count} violation(s);"), out[-1])

    def plant_includes(self, p: Picks, expected: dict[str, list[str]]) -> None:
        """The include rules, function-size and unowned, in files picked from the layers."""
        r = self.root
        n = append_line(r / p.dotdot_file, f'#include "{p.dotdot_include}"')
        expected[f"{p.dotdot_file}:{n}: [no-dotdot]"] = [p.dotdot_include]
        n = append_line(r / p.dotdot_test_file, '#include "batch/../top/t.h"')
        expected[f"{p.dotdot_test_file}:{n}: [no-dotdot]"] = ["batch/../top/t.h"]
        # The issue's: a `..` in tests/fuzz, which the scan of tests/unit alone missed.
        n = append_line(r / p.fuzz_file, '#include "../../src/core/error.h"')
        expected[f"{p.fuzz_file}:{n}: [no-dotdot]"] = ["../../src/core/error.h"]
        n = append_line(r / p.macro_file, "#include SDXL_PLANTED_HEADER")
        expected[f"{p.macro_file}:{n}: [literal-include]"] = ["#include SDXL_PLANTED_HEADER names no"]
        n = append_line(r / p.torch_file, "#include <torch/types.h>")
        expected[f"{p.torch_file}:{n}: [torch-free]"] = ["<torch/types.h>"]
        n = append_line(r / p.taint_file, f'#include "{p.taint_include}"')
        expected[f"{p.taint_file}:{n}: [torch-free]"] = ["which reaches torch: src/" + p.taint_include]
        n = append_line(r / p.undeclared_file, f'#include "{p.undeclared_include}"')
        expected[f"{p.undeclared_file}:{n}: [declared-deps]"] = [f"does not declare {p.undeclared_layer}"]
        n = append_line(r / p.exe_file, f'#include "{p.exe_include}"')
        expected[f"{p.exe_file}:{n}: [declared-deps]"] = [f"does not link sdxl_{p.exe_layer}"]
        # 101 lines fails; 100 lines (the limit) passes.
        n = append_function(r / p.core_cpp, "planted_101_lines", 101)
        expected[f"{p.core_cpp}:{n}: [function-size]"] = ["planted_101_lines has 101 lines"]
        append_function(r / p.core_cpp, "planted_100_lines", 100)
        (r / "src/stray").mkdir()
        (r / "src/stray/b.cpp").write_text("int b() { return 0; }\n")
        expected["src/stray/b.cpp:1: [unowned]"] = ["stray/ is no sdxl_layer"]

    def plant_cmake(self, p: Picks, expected: dict[str, list[str]]) -> None:
        """What CMakeLists.txt could say against the lint's table: the issue's upward
        dependency (batch PRIVATE scheduler) and TORCH on text, a dependency on the same
        floor and torch through target_link_libraries, a layer the table lacks, and a
        table entry CMakeLists.txt lacks."""
        for name in ("batch", "scheduler", "text", "device", "report", "cli"):
            self.assertIn(name, cl.FLOOR, "the plants of this test name layers of LAYER_FLOORS")
        self.assertEqual(cl.FLOOR["text"], cl.FLOOR["device"], "text and device share a floor")
        cmake = self.root / "CMakeLists.txt"
        text = cmake.read_text()
        text, n = add_to_call(text, "sdxl_layer(batch", " PRIVATE scheduler")
        floor = cl.FLOOR
        expected[f"CMakeLists.txt:{n}: [layer-order]"] = [
            f"layer batch (floor {floor['batch']}) depends on scheduler (sdxl_layer PRIVATE), "
            f"on floor {floor['scheduler']}, above it"]
        text, n = add_to_call(text, "sdxl_layer(text", "", after_name=" TORCH")
        expected[f"CMakeLists.txt:{n}: [torch-layers]"] = ["but its sdxl_layer names TORCH"]
        # sdxl_layer_view(cli) blanked (its line kept, so the lines below stay where they were).
        text, n = add_to_call(text, "sdxl_layer_view(cli", "", blank=True)
        expected[f"tests/lint/check_layers.py:{this_line('LAYER_FLOORS = (')}: [layer-table]"] = [
            "LAYER_FLOORS names cli, which CMakeLists.txt declares neither"]
        n = text.count("\n") + 2
        text += ("\ntarget_link_libraries(sdxl_text PRIVATE sdxl_device)\n"
                 "target_link_libraries(sdxl_report PRIVATE torch_iface)\n")
        expected[f"CMakeLists.txt:{n}: [layer-order]"] = [
            f"layer text (floor {floor['text']}) depends on device (target_link_libraries), on its own floor"]
        expected[f"CMakeLists.txt:{n + 1}: [torch-layers]"] = [
            "layer report is torch-free (not in TORCH_LAYERS of tests/lint/check_layers.py: control detect device "
            "image lora model pipeline sampling) but its target_link_libraries names torch_iface"]
        # A layer declared later is read from CMakeLists.txt, and must be put into the table.
        n = text.count("\n") + 2
        text += "\nsdxl_layer(planted\n  SOURCES src/planted/a.cpp\n  PUBLIC core)\n"
        cmake.write_text(text)
        expected[f"CMakeLists.txt:{n}: [layer-table]"] = [
            "layer planted is not in LAYER_FLOORS of tests/lint/check_layers.py: add it there"]
        (self.root / "src/planted").mkdir()
        (self.root / "src/planted/a.cpp").write_text(
            f'#include "core/error.h"\n#include "{p.undeclared_include}"\n')
        expected["src/planted/a.cpp:2: [declared-deps]"] = [f"layer planted includes \"{p.undeclared_include}\""]

    def plant_python(self, expected: dict[str, list[str]]) -> None:
        """An import circle through a lazy import, twice: two new top-level scripts, and the
        issue's fp8_quant -> fp8_conv again (which also breaks the order of both module
        lists); and a module of scripts/export that no list names."""
        s = self.root / "scripts"
        (s / "planted_a.py").write_text("import planted_b\n\nx = planted_b\n")
        (s / "planted_b.py").write_text("def f():\n    from planted_a import x\n    return x\n")
        expected["scripts/planted_a.py:1: [import-cycle]"] = [
            "import circle: planted_a (scripts/planted_a.py:1) -> planted_b (scripts/planted_b.py:2, lazy) "
            "-> planted_a"]
        append_line(s / "export/fp8_quant.py", "\n\ndef planted():\n    from .fp8_conv import Fp8Conv2d\n"
                    "    return Fp8Conv2d")
        n = line_of(s / "export/fp8_conv.py", "from .fp8_quant import")
        lazy = line_of(s / "export/fp8_quant.py", "from .fp8_conv import Fp8Conv2d")
        expected[f"scripts/export/fp8_conv.py:{n}: [import-cycle]"] = [
            f"import circle: export.fp8_conv (scripts/export/fp8_conv.py:{n}) -> export.fp8_quant "
            f"(scripts/export/fp8_quant.py:{lazy}, lazy) -> export.fp8_conv"]
        n = line_of(s / "export/__init__.py", "  fp8_conv ")
        expected[f"scripts/export/__init__.py:{n}: [module-list]"] = ["names fp8_conv above fp8_quant, but "
                                                                      "fp8_quant imports fp8_conv"]
        n = line_of(self.root / "docs/architecture.md", "`fp8_conv`")
        expected[f"docs/architecture.md:{n}: [module-list]"] = ["names fp8_conv above fp8_quant"]
        (s / "export/planted_kind.py").write_text("from .inputs import ExportError\n")
        expected["scripts/export/planted_kind.py:1: [module-list]"] = [
            "scripts/export/__init__.py's docstring does not name the module planted_kind",
            "docs/architecture.md (## The export scripts) does not name the module planted_kind"]

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
