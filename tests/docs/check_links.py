#!/usr/bin/env python3
"""Checks that every relative link of the project's Markdown resolves: README.md and every `.md`
under docs/ and bench/ that git tracks. A link `[text](target)` or `![alt](target)` whose target
is not a URL (scheme:) must name a file or folder that exists, relative to the linking file; a
`#fragment` (alone, or after a `.md` target) must be a heading of that file, spelled as GitHub
spells its anchors (lower case, punctuation but `-` and `_` dropped, spaces to `-`, a repeated
heading's anchor with `-1`, `-2`, ...). Links inside code (fenced blocks, `inline`) are text, not
links, and are not checked.

Each broken link is one line `path:line: [broken-link] target: why`; any fails the check (exit 1).

Usage: check_links.py [--root DIR]   (default: the repository holding this file)
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

SCOPE = ("README.md", "docs", "bench")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def markdown_files(root: Path) -> list[Path]:
    """The tracked .md files in SCOPE (every .md on disk there when root is not a git checkout)."""
    p = subprocess.run(["git", "-C", str(root), "ls-files", "--", *SCOPE], capture_output=True, text=True)
    if p.returncode == 0 and p.stdout.strip():
        return [root / f for f in p.stdout.split("\n") if f.endswith(".md") and (root / f).is_file()]
    found = [root / "README.md"] if (root / "README.md").is_file() else []
    return found + sorted(f for d in SCOPE[1:] if (root / d).is_dir() for f in (root / d).rglob("*.md"))


def prose_lines(text: str):
    """(line number, line, line with its inline code blanked out) of the lines outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if m:
            fence = None if fence == m.group(1) else (fence or m.group(1))
            continue
        if fence is None:
            yield n, line, INLINE_CODE.sub(lambda c: " " * len(c.group(0)), line)


def slug(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path, cache: dict) -> set[str]:
    if path not in cache:
        seen: dict[str, int] = {}
        out = set()
        for _, line, _ in prose_lines(path.read_text(encoding="utf-8")):
            m = HEADING.match(line)
            if m:
                base = slug(m.group(2))
                k = seen.get(base, 0)
                seen[base] = k + 1
                out.add(base if k == 0 else f"{base}-{k}")
        cache[path] = out
    return cache[path]


def check_link(md: Path, target: str, cache: dict) -> str | None:
    """Why target, linked from md, does not resolve (None when it does)."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
        return None  # a URL
    path_part, _, fragment = target.partition("#")
    dest = (md.parent / path_part).resolve() if path_part else md
    if not dest.exists():
        return "no such file or folder"
    if fragment and dest.suffix == ".md" and dest.is_file() and fragment.lower() not in anchors(dest, cache):
        return f"no heading with anchor #{fragment} in {dest.name}"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2])
    root = ap.parse_args().root.resolve()
    cache: dict = {}
    problems = []
    files = markdown_files(root)
    for md in files:
        for n, _, line in prose_lines(md.read_text(encoding="utf-8")):
            for m in LINK.finditer(line):
                why = check_link(md, m.group(1), cache)
                if why:
                    problems.append(f"{md.relative_to(root)}:{n}: [broken-link] {m.group(1)}: {why}")
    for p in problems:
        print(p)
    print(f"check_links: {len(files)} Markdown files, {len(problems)} broken links", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
