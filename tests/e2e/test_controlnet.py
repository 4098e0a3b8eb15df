#!/usr/bin/env python3
"""End-to-end tests of ControlNets in batch runs on the tiny model (ctest label e2e): a batch
mixing tasks with and without a ControlNet (the same pixels as `generate` with the same
settings at --max-batch 1, at most 1 level off when batched; the PNG and report.json name it;
a rerun skips everything), a
ControlNet folder that loads at validation but not at run time (its tasks fail, the rest are
made), the hires fix's second pass with the ControlNet, `validate`'s errors, and the CLI's flag
grouping errors.

    test_controlnet.py --binary B --model TINY --diffusers TINY_DIFFUSERS --python PY --source REPO --work DIR
        [--side-modules DIR]   (ctest's fixture side_modules: the ControlNet's export, made once)
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from e2e_common import (ARGS, ENV, TestCase, export, main, parameters, pixels, python, read_report, run,
                        side_modules_option)
from e2e_common import run_ok as sh
from PIL import Image, ImageDraw

PROMPT = "comic panel, a lighthouse keeper"


class ControlNetRuns(TestCase):
    work: Path
    cn: Path

    @classmethod
    def setUpClass(cls):
        cls.work = Path(ARGS.work)
        shutil.rmtree(cls.work, ignore_errors=True)
        (cls.work / "poses").mkdir(parents=True)
        cls.cn = cls.work / "cn" / "pose"
        if ARGS.side_modules:  # the same ControlNet (controlnet_fixture's seed 21) exported once for several tests
            shutil.copytree(Path(ARGS.side_modules) / "controlnet-export", cls.cn)
        else:
            python("-m", "reference.controlnet_fixture", "--diffusers", ARGS.diffusers, "--out", cls.work / "cn-src",
                   "--diffusers-only", what="controlnet_fixture")
            export("--controlnet", cls.work / "cn-src" / "diffusers", "--dtype", "fp32", "--device", "cpu", "--check",
                   "none", "--out", cls.cn, what="export --controlnet")
        for i in range(3):  # stick figures, the last one of another aspect ratio
            size = (256, 256) if i < 2 else (192, 320)
            im = Image.new("RGB", size)
            d = ImageDraw.Draw(im)
            d.line([(20 + 30 * i, 30), (128, 200 - 20 * i), (230, 40 + 25 * i)], fill=(255, 255, 255), width=9)
            im.save(cls.work / "poses" / f"p{i}.png")

    def batch(self, name: str, tasks: list[dict]) -> Path:
        path = self.work / f"{name}.json"
        path.write_text(json.dumps({"version": 1, "defaults": {"steps": 4, "negative": "blurry"}, "tasks": tasks}))
        return path

    def run_batch(self, batch: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
        return run([ARGS.binary, "--log-level", "info", "run", str(batch), "--model", ARGS.model, "--out", str(out),
                    "--threads", "1", "--no-progress", *extra])

    def test_batch_equals_generate_and_resumes(self):
        cn = {"model": "cn/pose", "strength": 0.8}
        tasks = [{"id": "a", "prompt": PROMPT, "seed": 5, "controlnets": [dict(cn, image="poses/p0.png")]},
                 {"id": "b", "prompt": PROMPT, "seed": 6, "controlnets": [dict(cn, image="poses/p1.png", end=0.5)]},
                 {"id": "c", "prompt": PROMPT, "seed": 7, "controlnets": [dict(cn, image="poses/p2.png")]},
                 {"id": "plain", "prompt": PROMPT, "seed": 5}]
        out = self.work / "out-mixed"
        r = self.run_batch(self.batch("mixed", tasks), out, "--max-batch", "4")
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertIn("another aspect ratio", r.stderr, "the stretched control image is reported")
        self.assertEqual(r.stderr.count("ControlNet '"), 1, "one load for three tasks:\n" + r.stderr[-2000:])
        report = read_report(out)
        self.assertEqual(report["images_done"], 4)
        by_task = {i["task"]: i for i in report["images"]}
        self.assertEqual(by_task["a"]["controlnets"][0]["strength"], 0.8)
        self.assertEqual(by_task["b"]["controlnets"][0]["end"], 0.5)
        self.assertNotIn("controlnets", by_task["plain"])
        engine = report["devices"][0]["engine"]
        self.assertEqual(engine["controlnet_cache_loads"], 1)
        files = {i["task"]: out / i["file"] for i in report["images"]}
        params = parameters(files["a"])
        self.assertIn('ControlNet 0: "Module: none, Model: ', params)
        self.assertIn("Weight: 0.8, Resize Mode: Just Resize, Guidance Start: 0, Guidance End: 1", params)
        # A task's image is generate's with the same settings, whatever batch it ran in.
        one = self.work / "generate-a.png"
        sh([ARGS.binary, "generate", "--model", ARGS.model, "--prompt", PROMPT, "--negative", "blurry", "--seed", "5",
            "--steps", "4", "--threads", "1", "--controlnet", str(self.cn), "--control-image",
            str(self.work / "poses" / "p0.png"), "--control-strength", "0.8", "--out", str(one)], "generate", env=ENV)
        diff = np.abs(pixels(one) - pixels(files["a"])).max()
        self.assertLessEqual(diff, 1, "batched: at most the batching's 1-level rounding (docs/scheduling-and-memory.md)")
        alone = self.work / "out-alone"
        r = self.run_batch(self.batch("mixed", tasks), alone, "--max-batch", "1")
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        a_alone = alone / next(i["file"] for i in read_report(alone)["images"] if i["task"] == "a")
        self.assertTrue((pixels(one) == pixels(a_alone)).all(), "at --max-batch 1: bit-identical to generate")
        self.assertFalse((pixels(files["plain"]) == pixels(files["a"])).all(), "the ControlNet changes the image")
        again = self.run_batch(self.batch("mixed", tasks), out)
        self.assertEqual(again.returncode, 0, again.stderr[-2000:])
        self.assertEqual(read_report(out)["images_skipped"], 4)
        tasks[0]["controlnets"][0]["strength"] = 0.7  # another setting: made again
        again = self.run_batch(self.batch("mixed", tasks), out)
        report = read_report(out)
        self.assertEqual((report["images_done"], report["images_skipped"]), (1, 3))

    def test_a_controlnet_that_fails_to_load_fails_only_its_tasks(self):
        broken = self.work / "cn" / "broken"
        shutil.copytree(self.cn, broken, dirs_exist_ok=True)
        ts = broken / "controlnet.ts"
        ts.write_bytes(b"\0" * ts.stat().st_size)  # the size model.json records, not a module
        tasks = [{"id": "bad", "prompt": PROMPT, "seed": 1,
                  "controlnets": [{"model": "cn/broken", "image": "poses/p0.png"}]},
                 {"id": "good", "prompt": PROMPT, "seed": 2,
                  "controlnets": [{"model": "cn/pose", "image": "poses/p1.png"}]}]
        out = self.work / "out-broken"
        r = self.run_batch(self.batch("broken", tasks), out)
        report = read_report(out)
        self.assertEqual(report["images_done"], 1, r.stderr[-3000:])
        self.assertEqual(report["images_failed"], 1)
        failure = json.dumps(report["failures"])
        self.assertIn("bad", failure)
        self.assertIn("controlnet.ts", failure)
        self.assertEqual(r.returncode, 3, "finished, but an image failed")

    def test_validate_names_each_problem(self):
        tasks = [{"id": "a", "prompt": PROMPT, "controlnets": [{"model": "cn/none", "image": "poses/p0.png"}]},
                 {"id": "b", "prompt": PROMPT, "controlnets": [{"model": "cn/pose", "image": "poses/none.png"}]},
                 {"id": "c", "prompt": PROMPT, "controlnets": [{"model": "cn/pose", "image": "poses/p0.png",
                                                                 "start": 0.6, "end": 0.4}]},
                 {"id": "d", "prompt": PROMPT, "controlnets": [{"model": "poses", "image": "poses/p0.png"}]}]
        r = run([ARGS.binary, "validate", str(self.batch("invalid", tasks)), "--model", ARGS.model])
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        for pointer in ("/tasks/0/controlnets/0/model", "/tasks/1/controlnets/0/image",
                        "/tasks/2/controlnets/0/start", "/tasks/3/controlnets/0/model"):
            self.assertIn(pointer, r.stdout)
        self.assertIn("poses/none.png", r.stdout)

    def test_hires_pass_takes_the_control_image_at_its_size(self):
        outs = {}
        for name, extra in (("with", ["--controlnet", str(self.cn), "--control-image",
                                      str(self.work / "poses" / "p0.png")]), ("without", [])):
            outs[name] = self.work / f"hires-{name}.png"
            sh([ARGS.binary, "generate", "--model", ARGS.model, "--prompt", PROMPT, "--seed", "3", "--steps", "3",
                "--threads", "1", "--hires-scale", "1.5", "--hires-steps", "2", *extra, "--out", str(outs[name])],
               f"generate hires {name}", env=ENV)
        self.assertEqual(pixels(outs["with"]).shape, (384, 384, 3))
        self.assertFalse((pixels(outs["with"]) == pixels(outs["without"])).all())
        self.assertIn("ControlNet 0:", parameters(outs["with"]))

    def test_cli_flags_are_grouped_in_order(self):
        base = [ARGS.binary, "generate", "--model", ARGS.model, "--prompt", PROMPT, "--steps", "2", "--threads", "1",
                "--out", str(self.work / "flags.png")]
        self.assertEachRefused(base, (
            (["--control-image", str(self.work / "poses" / "p0.png"), "--controlnet", str(self.cn)],
             "comes before any --controlnet"),
            (["--controlnet", str(self.cn)], "has no --control-image"),
            (["--controlnet", str(self.cn), "--control-image", str(self.work / "poses" / "p0.png"),
              "--control-strength", "0.5", "--control-strength", "0.6"], "--control-strength twice"),
            (["--controlnet", str(self.work / "poses"), "--control-image", str(self.work / "poses" / "p0.png")],
             "not an sdxl-batch ControlNet folder")))


if __name__ == "__main__":
    sys.exit(main(__doc__, "--binary", "--model", "--diffusers", "--python", "--source", "--work",
                  extra=side_modules_option))
