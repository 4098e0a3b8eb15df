#!/usr/bin/env python3
"""The layer rules of docs/architecture.md that the compiler does not enforce.

The layers are read from CMakeLists.txt at run time (each sdxl_layer call, with
the keywords of cmake_parse_arguments in cmake/SdxlLayer.cmake; each
add_executable outside tests/ with its target_link_libraries and layer views),
so a new layer is checked as soon as it is declared. Rules:

  no-dotdot      no `..` in an #include path (src/, include/, tests/unit, bench/tools)
  torch-free     a layer not declared TORCH (and an executable) includes no torch,
                 ATen, c10 or caffe2 header, directly or through a repo header that does
  declared-deps  a layer's files include only its own headers and those of the layers
                 its sdxl_layer call names (PUBLIC or PRIVATE); an executable's, only
                 those of the layers it links and the views it adds
  function-size  no function in src/ or include/ longer than 100 lines, from the line
                 of its name to its closing brace (lizard)
  unowned        every file under src/ belongs to a layer or an executable of
                 CMakeLists.txt (else the rules above would skip it)

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

MAX_FUNCTION_LINES = 100  # .clang-tidy: readability-function-size.LineThreshold
TORCH_ROOTS = {"torch", "ATen", "c10", "caffe2"}
SOURCE_SUFFIXES = {".h", ".hpp", ".hh", ".inc", ".cpp", ".cc", ".cxx"}
# Folders whose includes the no-dotdot rule reads, and those whose functions are measured.
INCLUDE_SCAN_DIRS = ("src", "include", "tests/unit", "bench/tools")
FUNCTION_SCAN_DIRS = ("src", "include")
# Where quoted and angled includes of the repo are looked up (after the including
# file's own folder for quoted ones): the layer views point into src/, the public
# API lives in include/.
INCLUDE_ROOTS = ("src", "include")

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


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
                           sources=values.get("SOURCES", []), public=set(public))
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


# ---------------------------------------------------------------------------
# Files and their includes

@dataclasses.dataclass
class Include:
    line: int
    angled: bool
    path: str          # as written


class Tree:
    def __init__(self, root: Path):
        self.root = root
        self.units = read_units(root)
        self.layers = {n for n, u in self.units.items() if u.kind == "layer"}
        self._includes: dict[str, list[Include]] = {}
        self._taint: dict[str, Optional[list[str]]] = {}
        self.checked: set[str] = set()   # files whose includes a rule read
        self.functions = 0               # functions measured
        self._assign_files()

    # -- files -------------------------------------------------------------
    def files_under(self, *dirs: str) -> list[str]:
        out = []
        for d in dirs:
            base = self.root / d
            if base.is_dir():
                out += [p.relative_to(self.root).as_posix() for p in sorted(base.rglob("*"))
                        if p.is_file() and p.suffix in SOURCE_SUFFIXES]
        return out

    def exists(self, rel: str) -> bool:
        return (self.root / rel).is_file()

    def includes(self, rel: str) -> list[Include]:
        if rel not in self._includes:
            found = []
            text = (self.root / rel).read_text(errors="replace")
            for n, line in enumerate(text.splitlines(), 1):
                m = INCLUDE_RE.match(line)
                if m:
                    found.append(Include(n, m.group(1) == "<", m.group(2).strip()))
            self._includes[rel] = found
        return self._includes[rel]

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
                for inc in self.includes(f):
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
        for inc in self.includes(rel):
            if inc.path.split("/")[0] in TORCH_ROOTS:
                chain = [f"{rel}:{inc.line} <{inc.path}>"]
                break
        if chain is None:
            for inc in self.includes(rel):
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

    def run(self, tree: Tree) -> list[Violation]:
        out = []
        for rel, unit in self.scope(tree):
            tree.checked.add(rel)
            for inc in tree.includes(rel):
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


def no_torch(tree: Tree, rel: str, unit: Optional[Unit], inc: Include) -> Optional[str]:
    what = f"{unit.kind} {unit.name} is not TORCH ({unit.declared_at})" if unit else "torch-free file"
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
    IncludeRule("no-dotdot", files_in(*INCLUDE_SCAN_DIRS), no_dotdot),
    IncludeRule("torch-free", unit_files(lambda u: not u.torch), no_torch),
    IncludeRule("declared-deps", unit_files(), declared_layer),
    TreeRule("unowned", unowned),
    TreeRule("function-size", function_size),
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
    torch_free = sorted(u.name for u in tree.units.values() if not u.torch)
    summary = (f"{len(rules)} rules, {layers} layers and {len(tree.units) - layers} executables from "
               f"CMakeLists.txt (not TORCH: {' '.join(torch_free)}), includes of {len(tree.checked)} files, "
               f"{tree.functions} functions")
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
