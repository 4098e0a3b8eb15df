"""The Python rules of check_layers.py: the import graph of the project's Python
modules, read with ast from every import statement (those inside functions too:
a lazy import closes a circle as surely as one at the top), and the module lists
that name a package's modules top to bottom.

  import-cycle  no circle in the graph; the message walks the circle, file and line
                of each import, and marks the lazy ones
  module-list   each list of PACKAGE_LISTS names every module of its package, each
                above the modules it imports (so the list is the package's real order)
"""
from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import Iterator, Optional

# (folder whose .py files are read, the folder on sys.path they are imported from):
# scripts/export/cli.py is `export.cli`, tests/reference/architecture.py `reference.architecture`.
PY_ROOTS = (("scripts", "scripts"), ("tests/reference", "tests"))
# (package folder, file holding a list of its modules, heading of the list's section):
# without a heading, the list is the package docstring's lines that start with a module
# name; with one, the `module` names in the table rows of that section of a Markdown file.
PACKAGE_LISTS = (
    ("scripts/export", "scripts/export/__init__.py", None),
    ("scripts/export", "docs/architecture.md", "## The export scripts"),
)

Violation = tuple[str, int, str, str]  # path, line, rule, message


@dataclasses.dataclass
class Edge:
    source: str     # the importing module
    target: str     # the module imported
    path: str       # the importing file, repo-relative
    line: int
    lazy: bool      # inside a function: runs when it is called, not when the module is imported


class ImportGraph:
    def __init__(self, root: Path):
        self.root = root
        self.modules: dict[str, str] = {}      # module name -> repo-relative file
        self.errors: list[Violation] = []      # files that do not parse
        for scan, base in PY_ROOTS:
            if (root / scan).is_dir():
                for p in sorted((root / scan).rglob("*.py")):
                    if "__pycache__" not in p.parts:
                        rel = p.relative_to(root).as_posix()
                        self.modules[module_name(p.relative_to(root / base))] = rel
        self.edges: dict[str, list[Edge]] = {m: self._imports(m) for m in self.modules}

    def _imports(self, module: str) -> list[Edge]:
        rel = self.modules[module]
        try:
            tree = ast.parse((self.root / rel).read_text(), filename=rel)
        except (SyntaxError, ValueError) as e:
            self.errors.append((rel, getattr(e, "lineno", None) or 1, "import-cycle",
                                f"cannot parse: {e}; its imports are not read"))
            return []
        package = module if rel.endswith("/__init__.py") else module.rpartition(".")[0]
        out = []
        for node, lazy in _import_nodes(tree, False):
            for target in self._targets(node, package):
                if target != module:
                    out.append(Edge(module, target, rel, node.lineno, lazy))
        return out

    def _targets(self, node: ast.stmt, package: str) -> Iterator[str]:
        """The project modules an import statement loads (others, the standard library's
        and third parties', are left out)."""
        if isinstance(node, ast.Import):
            for alias in node.names:
                known = self._known_prefix(alias.name)
                if known:
                    yield known
            return
        assert isinstance(node, ast.ImportFrom)
        base = node.module or ""
        if node.level:
            parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            base = f"{parent}.{base}" if base else parent
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            known = sub if sub in self.modules else self._known_prefix(base)
            if known:
                yield known

    def _known_prefix(self, dotted: str) -> Optional[str]:
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in self.modules:
                return ".".join(parts[:n])
        return None

    def cycles(self) -> list[list[Edge]]:
        """One circle of each strongly connected part of the graph larger than one module:
        the shortest one through its first module by name, as the edges walked."""
        out = []
        for part in _strong_parts(self.modules, self.edges):
            if len(part) > 1:
                out.append(self._shortest_circle(min(part), part))
        return out

    def _shortest_circle(self, start: str, part: set[str]) -> list[Edge]:
        todo: list[tuple[str, list[Edge]]] = [(start, [])]
        seen = {start}
        while todo:
            module, path = todo.pop(0)
            for e in sorted(self.edges[module], key=lambda e: (e.target, e.line)):
                if e.target == start:
                    return path + [e]
                if e.target in part and e.target not in seen:
                    seen.add(e.target)
                    todo.append((e.target, path + [e]))
        raise AssertionError(f"{start}: no circle in its strongly connected part")


def module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_nodes(node: ast.AST, lazy: bool) -> Iterator[tuple[ast.stmt, bool]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, lazy
        yield from _import_nodes(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))


def _strong_parts(nodes: dict[str, str], edges: dict[str, list[Edge]]) -> list[set[str]]:
    """Tarjan's strongly connected components, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    parts = []
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted({e.target for e in edges[root]})))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted({e.target for e in edges[w]}))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                part = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    part.add(w)
                    if w == v:
                        break
                parts.append(part)
    return parts


def import_cycles(graph: ImportGraph, rule: str) -> list[Violation]:
    out = list(graph.errors)
    for circle in graph.cycles():
        walk = " -> ".join(f"{e.source} ({e.path}:{e.line}{', lazy' if e.lazy else ''})" for e in circle)
        first = circle[0]
        out.append((first.path, first.line, rule,
                    f"import circle: {walk} -> {circle[-1].target}: move what both need into a module "
                    f"below both (an import inside a function counts: it runs when called)"))
    return out


# ---------------------------------------------------------------------------
# Module lists

def listed_modules(root: Path, list_file: str, heading: Optional[str],
                   names: set[str]) -> Optional[dict[str, tuple[int, int]]]:
    """Each module of `names` the list names -> (line, column) of its entry; None when
    the list is not there (no file, no docstring, no section)."""
    if not (root / list_file).is_file():
        return None
    text = (root / list_file).read_text()
    found: dict[str, tuple[int, int]] = {}
    if heading is None:
        tree = ast.parse(text)
        doc = ast.get_docstring(tree, clean=False)
        if doc is None:
            return None
        first = tree.body[0].lineno
        for n, line in enumerate(doc.splitlines()):
            m = re.match(r"\s+(\w+)(\s{2,}|$)", line)
            if m and m.group(1) in names:
                found.setdefault(m.group(1), (first + n, m.start(1)))
        return found
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == heading), None)
    if start is None:
        return None
    for n in range(start + 1, len(lines)):
        if lines[n].startswith("## "):
            break
        if lines[n].startswith("|"):
            for m in re.finditer(r"`(\w+)`", lines[n]):
                if m.group(1) in names:
                    found.setdefault(m.group(1), (n + 1, m.start()))
    return found


def module_lists(graph: ImportGraph, rule: str) -> list[Violation]:
    out: list[Violation] = []
    for package, list_file, heading in PACKAGE_LISTS:
        if not (graph.root / package).is_dir():
            continue
        init = next((m for m, rel in graph.modules.items() if rel == f"{package}/__init__.py"), None)
        if init is None:
            out.append((package, 1, rule, f"{package} is no package read by the import rules (no "
                        f"__init__.py under a folder of PY_ROOTS), so its lists cannot be checked"))
            continue
        prefix = init + "."
        names = {m[len(prefix):] for m in graph.modules if m.startswith(prefix) and "." not in m[len(prefix):]}
        where = f"{list_file}" + (f" ({heading})" if heading else "'s docstring")
        listed = listed_modules(graph.root, list_file, heading, names)
        if listed is None:
            out.append((list_file, 1, rule, f"{where}: no list of {package}'s modules found"))
            continue
        out += [(f"{package}/{name}.py", 1, rule,
                 f"{where} does not name the module {name} ({package}/{name}.py): add it, above the "
                 f"modules it imports and below those that import it")
                for name in sorted(names - set(listed))]
        for name, pos in sorted(listed.items(), key=lambda kv: kv[1]):
            for e in graph.edges[prefix + name]:
                dep = e.target[len(prefix):] if e.target.startswith(prefix) else None
                if dep in listed and listed[dep] < pos:
                    out.append((list_file, listed[dep][0], rule,
                                f"{where} names {dep} above {name}, but {name} imports {dep} "
                                f"({e.path}:{e.line}): list each module above the modules it imports"))
    return out
