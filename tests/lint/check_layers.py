#!/usr/bin/env python3
"""The layer rules of docs/architecture.md that the compiler does not enforce.

The layers are read from CMakeLists.txt at run time (each sdxl_layer call, with
the keywords of cmake_parse_arguments in cmake/SdxlLayer.cmake; each
add_executable outside tests/ with its target_link_libraries and layer views),
so a new layer is checked as soon as it is declared. Rules:

  layer-table    every layer and layer view of CMakeLists.txt is in LAYER_FLOORS below,
                 and every name there is declared in CMakeLists.txt
  layer-order    a layer depends (sdxl_layer's PUBLIC / PRIVATE, a target_link_libraries
                 of its target, a layer view added to it) only on layers of lower floors
                 of LAYER_FLOORS: no arrow sideways or up, so no cycle
  torch-layers   only the layers of TORCH_LAYERS say TORCH in their sdxl_layer call or
                 name torch in a call on their target
  no-dotdot      no `..` in an #include path (src/, include/, tests/, bench/)
  literal-include  every #include names a "file" or <file>, not a macro (which no rule could read)
  torch-free     a layer not in TORCH_LAYERS (and an executable) includes no torch,
                 ATen, c10 or caffe2 header, directly or through a repo header that does
  declared-deps  a layer's files include only its own headers and those of the layers
                 its sdxl_layer call names (PUBLIC or PRIVATE); an executable's, only
                 those of the layers it links and the views it adds
  function-size  no function in src/ or include/ longer than 100 lines, from the line
                 of its name to its closing brace (lizard)
  unowned        every file under src/ belongs to a layer or an executable of
                 CMakeLists.txt (else the rules above would skip it)
  import-cycle   no circle among the Python modules of scripts/ and tests/reference,
                 counting imports inside functions (lazy imports)
  module-list    every module of a package of PACKAGE_LISTS is named in its lists (the
                 package docstring, docs/architecture.md), each above the modules it imports

The layer order and the torch layers are held here, not read from CMakeLists.txt,
so that an edit of CMakeLists.txt cannot change the rules it is checked against.

Each violation is printed as `path:line: [rule] message`; the exit status is 1
when there is one, 2 when CMakeLists.txt cannot be read.

Usage: check_layers.py [--root DIR]   (default: the repository holding this file)
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

import python_imports  # beside this file: the Python rules (import-cycle, module-list)

MAX_FUNCTION_LINES = 100  # .clang-tidy: readability-function-size.LineThreshold
TORCH_ROOTS = {"torch", "ATen", "c10", "caffe2"}
SOURCE_SUFFIXES = {".h", ".hpp", ".hh", ".inc", ".cpp", ".cc", ".cxx"}
# The floors of docs/architecture.md#layers, bottom to top: a layer depends only on
# layers of lower floors. A new layer goes on the floor above the highest of its
# dependencies. The layer views that are no layer (cli) are here too, on top.
LAYER_FLOORS = (
    ("core",),
    ("batch", "device", "text"),
    ("model",),
    ("sampling", "image", "lora", "detect"),
    ("check", "control", "report", "video"),
    ("pipeline",),
    ("scheduler",),
    ("api",),
    ("cli",),
)
# The layers whose files may include torch (and whose sdxl_layer call says TORCH);
# every other layer, and every executable, is torch-free.
TORCH_LAYERS = frozenset({"device", "model", "sampling", "image", "control", "lora", "detect", "pipeline"})
# A word in a CMake call on a layer's target that names torch (a target, a variable, a path).
TORCH_CMAKE_RE = re.compile(r"torch|aten|c10|caffe2", re.IGNORECASE)
# Folders whose includes the no-dotdot and literal-include rules read (those that
# do not exist are skipped), and those whose functions are measured.
INCLUDE_SCAN_DIRS = ("src", "include", "tests", "bench")
FUNCTION_SCAN_DIRS = ("src", "include")
# Where quoted and angled includes of the repo are looked up (after the including
# file's own folder for quoted ones): the layer views point into src/, the public
# API lives in include/.
INCLUDE_ROOTS = ("src", "include")

DIRECTIVE_RE = re.compile(r"^\s*#\s*include(?:_next)?\b\s*(.*)")
INCLUDE_RE = re.compile(r'([<"])([^>"]+)[>"]')


# ---------------------------------------------------------------------------
# The build's declarations, from CMakeLists.txt

@dataclasses.dataclass
class Unit:
    """A layer (sdxl_layer) or an executable (add_executable): what is compiled together."""
    name: str
    kind: str                      # "layer" or "executable"
    torch: bool
    allowed: set[str]              # layers whose headers its files may include
    declared_at: str               # "CMakeLists.txt:LINE"
    declaration: str               # what it declares, for messages
    sources: list[str] = dataclasses.field(default_factory=list)
    public: set[str] = dataclasses.field(default_factory=set)  # layers: its PUBLIC dependencies
    views: set[str] = dataclasses.field(default_factory=set)   # executables: layer views it adds
    files: list[str] = dataclasses.field(default_factory=list) # repo-relative paths checked as its own
    # layers: each dependency the build declares, however (sdxl_layer, a call on its target)
    deps: list[Declared] = dataclasses.field(default_factory=list)
    torch_at: list[Declared] = dataclasses.field(default_factory=list)  # layers: where torch is named


@dataclasses.dataclass
class Declared:
    """One thing a CMake file says about a layer's target: a dependency or torch."""
    path: str       # the CMake file, repo-relative
    line: int       # the line of the call
    what: str       # the layer depended on, or the word naming torch
    how: str        # e.g. "sdxl_layer PRIVATE", "target_link_libraries"


def _strip_cmake_comments(text: str) -> str:
    # A `#` outside a quoted string starts a comment; bracket comments are not used here.
    out = []
    for line in text.splitlines():
        in_str = False
        cut = len(line)
        for i, ch in enumerate(line):
            if ch == '"' and (i == 0 or line[i - 1] != "\\"):
                in_str = not in_str
            elif ch == "#" and not in_str:
                cut = i
                break
        out.append(line[:cut])
    return "\n".join(out)


def cmake_calls(text: str, command: str) -> Iterable[tuple[int, list[str]]]:
    """(line, arguments) of each call of `command` (arguments split on blanks, quotes removed)."""
    text = _strip_cmake_comments(text)
    for m in re.finditer(r"(?im)^[ \t]*" + re.escape(command) + r"[ \t]*\(", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        args = [a.strip('"') for a in text[m.end():i - 1].split()]
        yield text.count("\n", 0, m.start()) + 1, args


def layer_keywords(root: Path) -> tuple[set[str], set[str], set[str]]:
    """sdxl_layer's option, one-value and multi-value keywords (cmake/SdxlLayer.cmake)."""
    text = (root / "cmake/SdxlLayer.cmake").read_text()
    m = re.search(r'cmake_parse_arguments\(\s*\w+\s+"([^"]*)"\s+"([^"]*)"\s+"([^"]*)"', text)
    if not m:
        raise ValueError("cmake/SdxlLayer.cmake: no cmake_parse_arguments in sdxl_layer")
    return tuple(set(filter(None, g.split(";"))) for g in m.groups())  # type: ignore[return-value]


def read_units(root: Path) -> dict[str, Unit]:
    text = (root / "CMakeLists.txt").read_text()
    options, one_value, multi_value = layer_keywords(root)
    units: dict[str, Unit] = {}
    for line, args in cmake_calls(text, "sdxl_layer"):
        name, values, key = args[0], {}, None
        flags = set()
        for a in args[1:]:
            if a in options:
                flags.add(a)
                key = None
            elif a in one_value or a in multi_value:
                key = a
                values.setdefault(a, [])
            elif key:
                values[key].append(a)
        public, private = values.get("PUBLIC", []), values.get("PRIVATE", [])
        decl = ("TORCH, " if "TORCH" in flags else "") + \
            f"PUBLIC {' '.join(public) or '-'}, PRIVATE {' '.join(private) or '-'}"
        units[name] = Unit(name, "layer", "TORCH" in flags, {name, *public, *private},
                           f"CMakeLists.txt:{line}", decl,
                           sources=values.get("SOURCES", []), public=set(public),
                           deps=[Declared("CMakeLists.txt", line, d, f"sdxl_layer {k}")
                                 for k in ("PUBLIC", "PRIVATE") for d in values.get(k, [])],
                           torch_at=[Declared("CMakeLists.txt", line, "TORCH", "sdxl_layer")]
                           if "TORCH" in flags else [])
    layers = set(units)
    links: dict[str, set[str]] = {}
    for _, args in cmake_calls(text, "target_link_libraries"):
        links.setdefault(args[0], set()).update(
            a[len("sdxl_"):] for a in args[1:] if a.startswith("sdxl_") and a[len("sdxl_"):] in layers)
    views: dict[str, set[str]] = {}
    for _, args in cmake_calls(text, "target_include_directories"):
        for a in args[1:]:
            m = re.fullmatch(r"\$\{SDXL_LAYER_VIEWS\}/(\w+)", a)
            if m:
                views.setdefault(args[0], set()).add(m.group(1))
    targets = list(cmake_calls(text, "add_executable"))
    targets += [(line, [args[0]] + args[2:]) for line, args in cmake_calls(text, "add_library")
                if len(args) > 1 and args[1] == "OBJECT"]  # a part of an executable compiled apart
    for line, args in targets:
        name, sources = args[0], [a for a in args[1:] if "$" not in a and "/" in a]
        if not sources or any(s.startswith("tests/") for s in sources):
            continue
        linked, seen = links.get(name, set()), views.get(name, set())
        units[name] = Unit(name, "executable", False, linked | seen, f"CMakeLists.txt:{line}",
                           f"links {' '.join(sorted(linked)) or '-'}; views {' '.join(sorted(seen)) or '-'}",
                           sources=sources, views=seen)
    return units


# CMake commands whose first argument is a target: how a dependency or torch could
# reach a layer's target outside its sdxl_layer call.
TARGET_COMMANDS = ("target_link_libraries", "target_include_directories", "target_precompile_headers",
                   "target_compile_options", "target_compile_definitions", "target_link_options",
                   "target_sources")
# Folders that hold no file of the project's, only what runs make (the build trees, outputs,
# models and bench/tmp of .gitignore): no scan enters them, nor a hidden folder (.venv, .deps).
SKIPPED_DIRS = {"build", "out", "models", "tmp"}


def cmake_files(root: Path) -> list[str]:
    """The repository's CMakeLists.txt and *.cmake files (hidden and build folders skipped)."""
    found = []
    for d, subdirs, files in os.walk(root):
        subdirs[:] = sorted(s for s in subdirs if not s.startswith(".") and s not in SKIPPED_DIRS)
        found += [os.path.relpath(os.path.join(d, f), root) for f in sorted(files)
                  if f == "CMakeLists.txt" or f.endswith(".cmake")]
    return found


def read_target_calls(root: Path, units: dict[str, Unit], views: set[str]) -> None:
    """Adds to each layer the dependencies and torch that calls on its target sdxl_NAME
    declare in any CMake file: another layer linked or its view added, or a word naming torch."""
    for rel in cmake_files(root):
        text = (root / rel).read_text(errors="replace")
        for command in TARGET_COMMANDS:
            for line, args in cmake_calls(text, command):
                layer = units.get(args[0][len("sdxl_"):]) if args and args[0].startswith("sdxl_") else None
                if layer is None or layer.kind != "layer":
                    continue
                for a in args[1:]:
                    dep = a[len("sdxl_"):] if a.startswith("sdxl_") else None
                    m = re.fullmatch(r"\$\{SDXL_LAYER_VIEWS\}/(\w+)", a)
                    if dep in units and units[dep].kind == "layer":
                        layer.deps.append(Declared(rel, line, dep, command))
                    elif m and m.group(1) in views:
                        layer.deps.append(Declared(rel, line, m.group(1), f"{command} (its view)"))
                    elif TORCH_CMAKE_RE.search(a):
                        layer.torch_at.append(Declared(rel, line, a, command))


def layer_views(root: Path) -> dict[str, int]:
    """Each layer view of CMakeLists.txt (sdxl_layer_view calls and sdxl_layer calls), with its line."""
    text = (root / "CMakeLists.txt").read_text()
    found: dict[str, int] = {}
    for command in ("sdxl_layer", "sdxl_layer_view"):
        for line, args in cmake_calls(text, command):
            if args:
                found.setdefault(args[0], line)
    return found


# ---------------------------------------------------------------------------
# Files and their includes

@dataclasses.dataclass
class Include:
    line: int
    angled: bool
    path: str          # as written (for a non-literal include: the text after `#include`)
    literal: bool = True  # "file" or <file>; False for `#include MACRO`


class Tree:
    def __init__(self, root: Path):
        self.root = root
        self.units = read_units(root)
        self.layers = {n for n, u in self.units.items() if u.kind == "layer"}
        self.views = layer_views(root)   # every layer view, layers included -> its line
        read_target_calls(root, self.units, set(self.views))
        self._includes: dict[str, list[Include]] = {}
        self._taint: dict[str, Optional[list[str]]] = {}
        self.checked: set[str] = set()   # files whose includes a rule read
        self.functions = 0               # functions measured
        self._python: Optional[python_imports.ImportGraph] = None  # read when a Python rule runs
        self._assign_files()

    def python_graph(self) -> python_imports.ImportGraph:
        if self._python is None:
            self._python = python_imports.ImportGraph(self.root)
        return self._python

    # -- files -------------------------------------------------------------
    def files_under(self, *dirs: str) -> list[str]:
        out = []
        for d in dirs:
            base = self.root / d
            for folder, subdirs, files in os.walk(base):
                subdirs[:] = sorted(s for s in subdirs if not s.startswith(".") and s not in SKIPPED_DIRS)
                out += [(Path(folder) / f).relative_to(self.root).as_posix() for f in sorted(files)
                        if Path(f).suffix in SOURCE_SUFFIXES]
        return out

    def exists(self, rel: str) -> bool:
        return (self.root / rel).is_file()

    def includes(self, rel: str) -> list[Include]:
        if rel not in self._includes:
            found = []
            text = (self.root / rel).read_text(errors="replace")
            for n, line in enumerate(text.splitlines(), 1):
                d = DIRECTIVE_RE.match(line)
                m = INCLUDE_RE.match(d.group(1)) if d else None
                if m:
                    found.append(Include(n, m.group(1) == "<", m.group(2).strip()))
                elif d:
                    found.append(Include(n, False, d.group(1).strip(), literal=False))
            self._includes[rel] = found
        return self._includes[rel]

    def literal_includes(self, rel: str) -> list[Include]:
        return [inc for inc in self.includes(rel) if inc.literal]

    def resolve(self, rel: str, inc: Include) -> Optional[str]:
        """The repo file an include names (the including file's folder first for quoted
        includes, then src/ and include/), or None for a system or third-party header."""
        bases = ([os.path.dirname(rel)] if not inc.angled else []) + list(INCLUDE_ROOTS)
        for base in bases:
            cand = os.path.normpath(os.path.join(base, inc.path))
            if not cand.startswith("..") and self.exists(cand):
                return cand
        return None

    def folder_of(self, rel: Optional[str], inc: Include) -> Optional[str]:
        """The src/ folder (a layer, or an executable's view) of an included file; for an
        include that names no file, the first folder of its normalised path if that is a layer."""
        if rel is not None:
            parts = rel.split("/")
            return parts[1] if parts[0] == "src" and len(parts) > 2 else None
        first = os.path.normpath(inc.path).split("/")[0]
        return first if first in self.layers else None

    def _assign_files(self) -> None:
        for u in self.units.values():
            if u.kind == "layer":
                u.files = self.files_under(f"src/{u.name}")
        # An executable's files: its sources and the headers they reach inside its
        # views that are no layer (src/cli/*.h for the CLI and for sdxl-lora-bench).
        for u in self.units.values():
            if u.kind != "executable":
                continue
            own_dirs = {f"src/{v}/" for v in u.views if v not in self.layers}
            todo, seen = [s for s in u.sources if self.exists(s)], set()
            while todo:
                f = todo.pop()
                if f in seen:
                    continue
                seen.add(f)
                for inc in self.literal_includes(f):
                    r = self.resolve(f, inc)
                    if r and any(r.startswith(d) for d in own_dirs):
                        todo.append(r)
            u.files = sorted(seen)

    def public_path(self, starts: Iterable[str], target: str) -> Optional[list[str]]:
        """The shortest chain of PUBLIC dependencies from one of `starts` to `target`."""
        todo = [[s] for s in sorted(starts) if s in self.layers]
        seen = {p[0] for p in todo}
        while todo:
            path = todo.pop(0)
            if path[-1] == target:
                return path
            for nxt in sorted(self.units[path[-1]].public - seen):
                seen.add(nxt)
                todo.append(path + [nxt])
        return None

    # -- torch, through repo headers ---------------------------------------
    def torch_chain(self, rel: str) -> Optional[list[str]]:
        """How `rel` reaches torch: [`file:line <header>`, ...], or None when it does not."""
        if rel in self._taint:
            return self._taint[rel]
        self._taint[rel] = None  # include cycles: not (yet) tainted
        chain = None
        for inc in self.literal_includes(rel):
            if inc.path.split("/")[0] in TORCH_ROOTS:
                chain = [f"{rel}:{inc.line} <{inc.path}>"]
                break
        if chain is None:
            for inc in self.literal_includes(rel):
                r = self.resolve(rel, inc)
                sub = self.torch_chain(r) if r else None
                if sub:
                    chain = [f"{rel}:{inc.line} \"{inc.path}\""] + sub
                    break
        self._taint[rel] = chain
        return chain


# ---------------------------------------------------------------------------
# Rules: one row of RULES each. An include rule reads the includes of the files
# its scope picks (with the unit each belongs to) and returns a message for each
# one that breaks it; a tree rule looks at the whole tree. A new rule is one
# row; e.g. "the CLI includes only the public API" would be
#   IncludeRule("cli-public-api", files_of("sdxl-batch"), only_from("include/sdxl_batch/", "src/cli/")),

Violation = tuple[str, int, str, str]  # path, line, rule, message
Scope = Callable[[Tree], Iterable[tuple[str, Optional[Unit]]]]
Check = Callable[[Tree, str, Optional[Unit], Include], Optional[str]]


@dataclasses.dataclass
class IncludeRule:
    name: str
    scope: Scope
    check: Check
    reads_macros: bool = False  # whether `#include MACRO` lines reach the check

    def run(self, tree: Tree) -> list[Violation]:
        out = []
        for rel, unit in self.scope(tree):
            tree.checked.add(rel)
            for inc in tree.includes(rel):
                if not inc.literal and not self.reads_macros:
                    continue
                msg = self.check(tree, rel, unit, inc)
                if msg:
                    out.append((rel, inc.line, self.name, msg))
        return out


@dataclasses.dataclass
class TreeRule:
    name: str
    check: Callable[[Tree, str], list[Violation]]

    def run(self, tree: Tree) -> list[Violation]:
        return self.check(tree, self.name)


# Scopes
def files_in(*dirs: str) -> Scope:
    return lambda tree: ((f, None) for f in tree.files_under(*dirs))


def unit_files(pick: Callable[[Unit], bool] = lambda u: True) -> Scope:
    return lambda tree: ((f, u) for u in tree.units.values() if pick(u) for f in u.files)


def files_of(*names: str) -> Scope:
    return unit_files(lambda u: u.name in names)


# Include checks
def no_dotdot(tree: Tree, rel: str, unit: Optional[Unit], inc: Include) -> Optional[str]:
    if ".." in inc.path.replace("\\", "/").split("/"):
        return f'"{inc.path}" has a `..`: include other layers\' headers as "layer/file.h"'
    return None


def literal_include(tree: Tree, rel: str, unit: Optional[Unit], inc: Include) -> Optional[str]:
    if inc.literal:
        return None
    return (f"#include {inc.path} names no \"file\" or <file>: write the header's path, so that "
            f"the layer rules can read it")


def no_torch(tree: Tree, rel: str, unit: Optional[Unit], inc: Include) -> Optional[str]:
    what = (f"{unit.kind} {unit.name} is torch-free (not in TORCH_LAYERS of tests/lint/check_layers.py)"
            if unit else "torch-free file")
    if inc.path.split("/")[0] in TORCH_ROOTS:
        return f"{what} but includes <{inc.path}>"
    r = tree.resolve(rel, inc)
    chain = tree.torch_chain(r) if r else None
    if chain:
        return f'{what} but includes "{inc.path}", which reaches torch: ' + " -> ".join(chain)
    return None


def declared_layer(tree: Tree, rel: str, unit: Optional[Unit], inc: Include) -> Optional[str]:
    assert unit is not None
    folder = tree.folder_of(tree.resolve(rel, inc), inc)
    if folder is None or folder in unit.allowed:
        return None
    via = tree.public_path(unit.allowed - {unit.name}, folder)
    how = f"; it compiles only through the PUBLIC links {' -> '.join(via)}" if via else ""
    if unit.kind == "layer":
        return (f'layer {unit.name} includes "{inc.path}" but does not declare {folder} '
                f"(sdxl_layer({unit.name} ...) at {unit.declared_at}: {unit.declaration}{how})")
    return (f'executable {unit.name} includes "{inc.path}" but does not link sdxl_{folder} '
            f"({unit.declared_at}: {unit.declaration}{how})")


def only_from(*prefixes: str) -> Check:
    """Repo headers only from these path prefixes (system and third-party headers pass)."""
    def check(tree: Tree, rel: str, unit: Optional[Unit], inc: Include) -> Optional[str]:
        r = tree.resolve(rel, inc)
        if r is None or any(r.startswith(p) for p in prefixes):
            return None
        return f'includes "{inc.path}" ({r}); allowed: {", ".join(prefixes)}'
    return check


# Tree checks
def unowned(tree: Tree, rule: str) -> list[Violation]:
    owned = {f for u in tree.units.values() for f in u.files}
    return [(f, 1, rule, f"{f.split('/')[1]}/ is no sdxl_layer of CMakeLists.txt and no executable's "
             "source or view header reaches this file, so no layer rule reads it")
            for f in tree.files_under("src") if f not in owned]


FLOOR = {name: i for i, floor in enumerate(LAYER_FLOORS) for name in floor}


def _this_file_line(text: str) -> int:
    """The line of check_layers.py that holds `text` (for a violation of its own tables)."""
    lines = Path(__file__).read_text().splitlines()
    return next((n for n, line in enumerate(lines, 1) if text in line), 1)


def layer_table(tree: Tree, rule: str) -> list[Violation]:
    out = [("CMakeLists.txt", line, rule,
            f"layer {name} is not in LAYER_FLOORS of tests/lint/check_layers.py: add it there, on the "
            f"floor above the highest layer it depends on (and to TORCH_LAYERS if its files include torch)")
           for name, line in sorted(tree.views.items()) if name not in FLOOR]
    out += [("tests/lint/check_layers.py", _this_file_line("LAYER_FLOORS = ("), rule,
             f"LAYER_FLOORS names {name}, which CMakeLists.txt declares neither as sdxl_layer "
             f"nor as sdxl_layer_view: remove it there")
            for name in sorted(FLOOR) if name not in tree.views]
    return out


def layer_order(tree: Tree, rule: str) -> list[Violation]:
    out = []
    for u in tree.units.values():
        if u.kind != "layer" or u.name not in FLOOR:
            continue  # a layer missing from the table is layer-table's
        for d in u.deps:
            if FLOOR.get(d.what, -1) < FLOOR[u.name]:
                continue
            where = ("on its own floor" if FLOOR[d.what] == FLOOR[u.name]
                     else f"on floor {FLOOR[d.what]}, above it")
            out.append((d.path, d.line, rule,
                        f"layer {u.name} (floor {FLOOR[u.name]}) depends on {d.what} ({d.how}), {where}: "
                        f"a layer depends only on layers of lower floors (LAYER_FLOORS in "
                        f"tests/lint/check_layers.py, docs/architecture.md#layers); an arrow sideways or up "
                        f"closes a cycle, which static libraries link without a word"))
    return out


def torch_layers(tree: Tree, rule: str) -> list[Violation]:
    allowed = " ".join(sorted(TORCH_LAYERS))
    return [(t.path, t.line, rule,
             f"layer {u.name} is torch-free (not in TORCH_LAYERS of tests/lint/check_layers.py: {allowed}) "
             f"but its {t.how} names {t.what}")
            for u in tree.units.values() if u.kind == "layer" and u.name not in TORCH_LAYERS
            for t in u.torch_at]


def function_size(tree: Tree, rule: str) -> list[Violation]:
    try:
        import lizard  # requirements.txt pins it
    except ImportError:
        return [("requirements.txt", 1, rule,
                 f"lizard is not installed in {sys.executable} (pip install -r requirements.txt)")]
    out = []
    for rel in tree.files_under(*FUNCTION_SCAN_DIRS):
        for fn in lizard.analyze_file(str(tree.root / rel)).function_list:
            tree.functions += 1
            lines = fn.end_line - fn.start_line + 1
            if lines > MAX_FUNCTION_LINES:
                out.append((rel, fn.start_line, rule, f"{fn.name} has {lines} lines ({fn.start_line}-"
                            f"{fn.end_line}, blanks and comments included); at most {MAX_FUNCTION_LINES}"))
    return out


RULES: list = [
    TreeRule("layer-table", layer_table),
    TreeRule("layer-order", layer_order),
    TreeRule("torch-layers", torch_layers),
    IncludeRule("no-dotdot", files_in(*INCLUDE_SCAN_DIRS), no_dotdot),
    IncludeRule("literal-include", files_in(*INCLUDE_SCAN_DIRS), literal_include, reads_macros=True),
    IncludeRule("torch-free", unit_files(lambda u: u.name not in TORCH_LAYERS), no_torch),
    IncludeRule("declared-deps", unit_files(), declared_layer),
    TreeRule("unowned", unowned),
    TreeRule("function-size", function_size),
    TreeRule("import-cycle", lambda tree, rule: python_imports.import_cycles(tree.python_graph(), rule)),
    TreeRule("module-list", lambda tree, rule: python_imports.module_lists(tree.python_graph(), rule)),
]


def run(root: Path, rules: Optional[list] = None) -> tuple[list[str], str]:
    """The violations (`path:line: [rule] message`, sorted) and a summary line."""
    rules = RULES if rules is None else rules
    tree = Tree(root)
    violations: set[Violation] = set()
    for rule in rules:
        violations.update(rule.run(tree))
    lines = [f"{f}:{n}: [{rule}] {msg}" for f, n, rule, msg in sorted(violations)]
    layers = sum(u.kind == "layer" for u in tree.units.values())
    summary = (f"{len(rules)} rules, {layers} layers and {len(tree.units) - layers} executables from "
               f"CMakeLists.txt ({len(LAYER_FLOORS)} floors; torch: {' '.join(sorted(TORCH_LAYERS))}), "
               f"includes of {len(tree.checked)} files, {tree.functions} functions"
               + (f", {len(tree.python_graph().modules)} Python modules" if tree._python else ""))
    return lines, summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2],
                    help="repository root (default: the one holding this script)")
    args = ap.parse_args()
    start = time.monotonic()
    try:
        lines, summary = run(args.root.resolve())
    except (OSError, ValueError, IndexError) as e:
        print(f"check_layers: cannot read the build's declarations: {e}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    took = time.monotonic() - start
    if lines:
        print(f"check_layers: {len(lines)} violation(s); {summary}; {took:.1f} s")
        return 1
    print(f"check_layers: ok; {summary}; {took:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
