#!/usr/bin/env python3
"""Self-test of check_links.py: a small tree of Markdown files with links that resolve (a file, a
folder, a heading with code and punctuation in it, a repeated heading's second anchor, a URL) and
text that only looks like links (a fenced block, inline code) passes; planted broken links (a
missing file, a missing heading, a missing folder) are each reported with their file and line,
and nothing else is.

Usage: test_check_links.py
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

CHECKER = Path(__file__).resolve().parent / "check_links.py"

GOOD = {
    "README.md": "# Top\n\nSee [the guide](docs/guide.md#the-detailer-key-in-run---dry-run) and [bench](bench/).\n",
    "docs/guide.md": (
        "# Guide\n\n## The `\"detailer\"` key in `run --dry-run`\n\n## Notes\n\n## Notes\n\n"
        "Back to [the top](../README.md#top), [notes again](#notes-1), [a site](https://example.org/x.md).\n\n"
        "```sh\n[not a link](missing.md)\n```\n\nInline `[not a link](missing.md)` either.\n"
    ),
    "bench/README.md": "# Bench\n\n[results](results/) and [the guide](../docs/guide.md).\n",
    "bench/results/2026-01-01-x-h200.md": "# X\n\n[up](../README.md)\n",
}

PLANTED = {
    "docs/guide.md": ("[gone](gone.md)\n", "gone.md: no such file or folder"),
    "bench/README.md": ("[anchor](../docs/guide.md#no-such-heading)\n", "no heading with anchor #no-such-heading"),
    "bench/results/2026-01-01-x-h200.md": ("![raw](2026-01-01-x-h200/)\n", "2026-01-01-x-h200/: no such file or folder"),
}


def write_tree(root: Path, extra: dict[str, str]) -> None:
    for rel, text in GOOD.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text + extra.get(rel, ""), encoding="utf-8")


def run_checker(root: Path) -> tuple[int, list[str]]:
    p = subprocess.run([sys.executable, str(CHECKER), "--root", str(root)], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout.splitlines()


class CheckLinks(unittest.TestCase):
    def test_good_tree_passes(self):
        with tempfile.TemporaryDirectory() as d:
            write_tree(Path(d), {})
            rc, lines = run_checker(Path(d))
            self.assertEqual((rc, lines), (0, []))

    def test_each_planted_link_is_reported(self):
        with tempfile.TemporaryDirectory() as d:
            write_tree(Path(d), {rel: text for rel, (text, _) in PLANTED.items()})
            rc, lines = run_checker(Path(d))
            self.assertEqual(rc, 1)
            self.assertEqual(len(lines), len(PLANTED), lines)
            for rel, (_, why) in PLANTED.items():
                line_no = len((GOOD[rel]).split("\n"))  # the planted line follows the good text
                want = f"{rel}:{line_no}: [broken-link] "
                self.assertTrue(any(x.startswith(want) and why in x for x in lines), (want, why, lines))


if __name__ == "__main__":
    unittest.main()
