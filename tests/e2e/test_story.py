#!/usr/bin/env python3
"""Story tools through the real binary (ctest label e2e): characters, styles and
wildcards of configs/story-wildcards.json on the tiny model, the
combinatorial order of `"expand": "all"` against the dynamicprompts package, and
regions: panels with 0, 2 and 3 regions sharing UNet calls, each within the batch
tolerance of the panel made alone (their formula against diffusers: parity_regions_cpu).

    test_story.py --binary BUILD/sdxl-batch --model TINY_MODEL_DIR --work DIR --source REPO
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import unittest
from pathlib import Path

from e2e_common import ARGS, main, parameters, pixels, read_manifest, read_report, sdxl

LINE = re.compile(r"^(?P<id>\S+) #(?P<index>\d+)(?: seed (?P<seed>\d+))?: (?P<prompt>.*)$")


def expansions(batch: Path, *extra: str) -> dict[tuple[str, int], dict]:
    """`validate --expand`: (task, index) -> {"seed", "prompt", "negative"}."""
    r = sdxl("validate", str(batch), "--expand", *extra)
    if r.returncode != 0:
        raise AssertionError(r.stdout + r.stderr)
    out: dict[tuple[str, int], dict] = {}
    last = None
    for line in r.stdout.splitlines():
        m = LINE.match(line)
        if m:
            last = out[(m["id"], int(m["index"]))] = {"seed": m["seed"], "prompt": m["prompt"], "negative": ""}
        elif line.startswith("    negative: ") and last is not None:
            last["negative"] = line[len("    negative: "):]
    return out


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


class DynamicpromptsOrder(unittest.TestCase):
    """`"expand": "all"` lists the combinations dynamicprompts' combinatorial generator makes, in its order."""

    TEMPLATES = [
        "{a|b} {c|d}",
        "x {a|{b|c}} y",
        "{2$$, $$a|b|c}",
        "{1-2$$ and $$a|b}",
        "{5$$, $$a|b}",
        "{3::heavy|light} {a|}",
        "__hair__ hair, {day|night}",
        "__places/inside__",
        r"\(smile\) a|b {c|d}",
    ]

    def test_combinatorial_order_matches_dynamicprompts(self):
        from dynamicprompts.generators import CombinatorialPromptGenerator
        from dynamicprompts.wildcards import WildcardManager

        work = Path(ARGS.work) / "dynamicprompts"
        shutil.rmtree(work, ignore_errors=True)
        (work / "wc" / "places").mkdir(parents=True)
        (work / "wc" / "hair.txt").write_text("red\nblack\n# a comment\n\nblond\n")
        (work / "wc" / "places" / "inside.txt").write_text("kitchen\nattic with __hair__ dust\n")
        tasks = [{"id": f"t{k}", "prompt": t, "expand": "all", "seed": 100 * k} for k, t in enumerate(self.TEMPLATES)]
        batch = work / "b.json"
        batch.write_text(json.dumps({"version": 1, "wildcards_dir": "wc", "tasks": tasks}))
        ours = expansions(batch)
        generator = CombinatorialPromptGenerator(WildcardManager(work / "wc"))
        for k, t in enumerate(self.TEMPLATES):
            want = [str(p) for p in generator.generate(t, max_prompts=1000)]
            got = [ours[(f"t{k}", i)]["prompt"] for i in range(len(want))]
            self.assertEqual(got, want, t)
            self.assertNotIn((f"t{k}", len(want)), ours, f"{t}: more images than combinations")


class StoryExample(unittest.TestCase):
    """configs/story-wildcards.json: expanded prompts in the PNGs and the manifest; resume, --force and shards agree."""

    def setUp(self):
        self.batch = Path(ARGS.source) / "configs" / "story-wildcards.json"
        self.expected = expansions(self.batch)
        self.fixed = {k: v for k, v in self.expected.items() if v["seed"] is not None}

    def run_into(self, out: Path, *extra: str) -> None:
        r = sdxl("run", str(self.batch), "--model", ARGS.model, "--out", str(out), *extra)
        self.assertEqual(r.returncode, 0, r.stderr)

    def fixed_files(self, out: Path) -> dict[tuple[str, int], str]:
        return {(t, i): sha(out / f"{t}-{i}-{v['seed']}.png") for (t, i), v in self.fixed.items()}

    def test_story_runs_records_and_repeats(self):
        out = Path(ARGS.work) / "story-a"
        shutil.rmtree(out, ignore_errors=True)
        self.run_into(out)
        self.assertEqual(len(self.fixed), 11, "3 + 2 random-mode images and 6 combinations")
        for (task, i), want in self.fixed.items():
            lines = parameters(out / f"{task}-{i}-{want['seed']}.png").split("\n")
            self.assertEqual(lines[0], want["prompt"])
            self.assertEqual(lines[1], f"Negative prompt: {want['negative']}")
        self.assertNotIn("{", "".join(v["prompt"] for v in self.fixed.values()))
        entries = read_manifest(out)
        self.assertEqual(len(entries), 12)
        harbour = [e for e in entries if e["task"] == "ch1-p01-harbour"]
        for e in harbour:
            self.assertEqual(e["characters"], ["mara", "pip"])
            self.assertEqual(e["style"], "ink")
            self.assertTrue(e["source_prompt"].startswith("the two arrive at __places/harbour__"))
            self.assertEqual(len(e["wildcards"]), 3, e["wildcards"])
            self.assertTrue(e["wildcards"][0].startswith("__places/harbour__="))
            self.assertIn(e["wildcards"][0].split("=", 1)[1], e["params"]["prompt"])
        market = sorted(e["params"]["prompt"] for e in entries if e["task"] == "ch1-p03-market")
        self.assertEqual(len(set(market)), 6, "expand all: every combination once")

        before = self.fixed_files(out)
        r = sdxl("run", str(self.batch), "--model", ARGS.model, "--out", str(out))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(read_report(out)["images_done"], 0, "a rerun resumes")
        self.run_into(out, "--force")
        self.assertEqual(self.fixed_files(out), before, "--force makes the same PNGs, byte for byte")

        sharded = Path(ARGS.work) / "story-shards"
        shutil.rmtree(sharded, ignore_errors=True)
        self.run_into(sharded, "--shard", "0/2")
        self.run_into(sharded, "--shard", "1/2")
        self.assertEqual(self.fixed_files(sharded), before, "two shards make what one run makes")


class RegionsShareCalls(unittest.TestCase):
    """Panels with 0, 2 and 3 regions in one UNet call: counted in the report, each within 1 level of itself
    made alone; recorded in the PNG and the manifest; a moved box remakes only its panel."""

    def batch(self, folder: Path, box_end: float = 0.5) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        two = [{"box": [0, 0, box_end, 1], "prompt": "a girl with a red scarf", "negative": "hat"},
               {"box": [0.5, 0, 1, 1], "prompt": "an old keeper", "weight": 2}]
        three = [{"box": [0, 0, 0.4, 1], "prompt": "a girl"}, {"box": [0.3, 0.2, 0.7, 0.8], "prompt": "a fox"},
                 {"box": [0.6, 0, 1, 1], "prompt": "a keeper"}]
        tasks = [{"id": "plain", "prompt": "two people on a pier", "seed": 11},
                 {"id": "two", "prompt": "two people on a pier", "seed": 12, "regions": two, "region_base": 0.3},
                 {"id": "three", "prompt": "three on a pier", "seed": 13, "regions": three}]
        b = folder / "regions.json"
        b.write_text(json.dumps({"version": 1, "defaults": {"steps": 3, "width": 64, "height": 64,
                                                            "negative": "blurry"}, "tasks": tasks}))
        return b

    def test_panels_with_regions_share_calls_and_resume(self):
        root = Path(ARGS.work) / "regions"
        shutil.rmtree(root, ignore_errors=True)
        b = self.batch(root)
        shared, alone = root / "shared", root / "alone"
        for out, n in ((shared, "3"), (alone, "1")):
            r = sdxl("run", str(b), "--model", ARGS.model, "--out", str(out), "--max-batch", n, "--order", "file")
            self.assertEqual(r.returncode, 0, r.stderr)
        rep = read_report(shared)
        self.assertEqual(rep["regions"], {"panels": 2, "batches": 1}, rep["regions"])
        self.assertEqual([x["size"] for x in rep["batches"]], [3])
        for name in ("plain-0-11.png", "two-0-12.png", "three-0-13.png"):
            d = abs(pixels(shared / name).astype(int) - pixels(alone / name).astype(int))
            self.assertLessEqual(d.max(), 1, f"{name}: {d.max()} levels from the panel made alone")
        text = parameters(shared / "two-0-12.png")
        self.assertIn("RP Active: True, RP Divide mode: Mask", text)
        self.assertIn("RP Base Ratios: 0.3", text)
        self.assertIn('Region 2: "Box: 0.5 0 1 1, Weight: 2, Prompt: an old keeper"', text)
        self.assertNotIn("RP Active", parameters(shared / "plain-0-11.png"))
        entry = [e for e in read_manifest(shared) if e["task"] == "two"][0]
        self.assertEqual(entry["params"]["regions"][0]["box"], [0, 0, 0.5, 1])
        # A moved box remakes that panel only.
        b = self.batch(root, box_end=0.6)
        r = sdxl("run", str(b), "--model", ARGS.model, "--out", str(shared), "--max-batch", "3")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(read_report(shared)["images_done"], 1)


class StoryErrors(unittest.TestCase):
    def write(self, name: str, batch: dict) -> Path:
        p = Path(ARGS.work) / "story-errors" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(batch, indent=1))
        return p

    def test_problems_name_task_key_and_line(self):
        p = self.write("bad.json", {
            "version": 1,
            "characters": {"mara": {"prompt": "Mara"}},
            "tasks": [
                {"id": "a", "prompt": "x", "characters": ["mara", "ghost"]},
                {"id": "b", "prompt": "__nowhere__"},
                {"id": "c", "prompt": "{a|b|c|d}{a|b|c|d}{a|b|c|d}{a|b|c|d}{a|b|c|d}", "expand": "all"},
                {"id": "d", "prompt": "x {a|b", "seed": 1},
            ]})
        r = sdxl("validate", str(p))
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("/tasks/0/characters/1: unknown character 'ghost'", r.stdout)
        self.assertIn("/tasks/1/prompt: wildcard __nowhere__: no nowhere.txt", r.stdout)
        self.assertIn("/tasks/2/expand: \"all\" makes more than 1000 images", r.stdout)
        self.assertIn("/tasks/3/prompt:", r.stdout)
        self.assertIn("never closed", r.stdout)
        self.assertRegex(r.stdout, r"bad\.json:\d+: /tasks/1/prompt")
        r = sdxl("run", str(p), "--model", ARGS.model, "--out", str(p.parent / "out"))
        self.assertEqual(r.returncode, 2, "run refuses what validate refuses")

    def test_wildcards_dir_flag_is_searched_first(self):
        root = Path(ARGS.work) / "story-errors"
        (root / "mine").mkdir(parents=True, exist_ok=True)
        (root / "theirs").mkdir(parents=True, exist_ok=True)
        (root / "mine" / "mood.txt").write_text("calm\n")
        (root / "theirs" / "mood.txt").write_text("angry\n")
        p = self.write("flag.json", {"version": 1, "wildcards_dir": "theirs",
                                     "tasks": [{"id": "a", "prompt": "a __mood__ sea", "seed": 3}]})
        self.assertEqual(expansions(p)[("a", 0)]["prompt"], "a angry sea")
        self.assertEqual(expansions(p, "--wildcards-dir", str(root / "mine"))[("a", 0)]["prompt"], "a calm sea")


if __name__ == "__main__":
    sys.exit(main(__doc__, "--binary", "--model", "--work", "--source"))
