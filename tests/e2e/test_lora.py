#!/usr/bin/env python3
"""End-to-end LoRA tests of the real binary on the tiny model (ctest label e2e):
--lora, prompt tags, unknown names, refused files, --strict-lora, the example
config configs/lora-story.json, and that switching back to no LoRA inside one
run gives the base image bit for bit.

    test_lora.py --binary B --lora-bench TOOL --model TINY --loras DIR(reference.make_test_loras) --work DIR --source REPO
"""
from __future__ import annotations

import json
import shutil
import sys
import unittest
from pathlib import Path

import numpy as np
from e2e_common import ARGS, main, parameters, pixels, read_report, run, sdxl

COMMON = ["--seed", "7", "--steps", "3", "--cfg", "5", "--width", "256", "--height", "256", "--threads", "1"]


def lora(name: str) -> str:
    return str(Path(ARGS.loras) / f"{name}.safetensors")


class Generate(unittest.TestCase):
    def setUp(self):
        self.work = Path(ARGS.work) / self._testMethodName
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)

    def gen(self, out: str, prompt: str, *extra: str):
        return sdxl("generate", "--model", ARGS.model, "--prompt", prompt, *COMMON, "--out", str(self.work / out), *extra)

    def test_lora_flag_changes_image_and_is_recorded(self):
        r = self.gen("base.png", "a lighthouse")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.gen("lora.png", "a lighthouse", "--lora", lora("kohya_unet") + ":0.8", "--lora", lora("kohya_te"),
                     "--timings-json", str(self.work / "t.json"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(np.array_equal(pixels(self.work / "base.png"), pixels(self.work / "lora.png")))
        params = parameters(self.work / "lora.png")
        self.assertRegex(params, r'Lora hashes: "kohya_unet: [0-9a-f]{12}, kohya_te: [0-9a-f]{12}"')
        t = json.loads((self.work / "t.json").read_text())
        self.assertEqual(t["lora"]["misses"], 2)

    def test_prompt_tag_equals_flag_and_stays_in_metadata(self):
        r = self.gen("tag.png", "a lighthouse <lora:locon:0.9>", "--lora-dir", ARGS.loras)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.gen("flag.png", "a lighthouse ", "--lora", lora("locon") + ":0.9")
        self.assertEqual(r.returncode, 0, r.stderr)
        # The tag leaves the text before encoding: same image as the flag with the cleaned prompt.
        self.assertTrue(np.array_equal(pixels(self.work / "tag.png"), pixels(self.work / "flag.png")))
        params = parameters(self.work / "tag.png")
        self.assertTrue(params.startswith("a lighthouse <lora:locon:0.9>\n"), params)
        self.assertIn('Lora hashes: "locon: ', params)

    def test_unknown_tag_names_the_directories(self):
        r = self.gen("x.png", "a cat <lora:villain:1>", "--lora-dir", ARGS.loras, "--lora-dir", str(self.work))
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown LoRA 'villain'", r.stderr)
        self.assertIn(ARGS.loras, r.stderr)
        self.assertIn(str(self.work), r.stderr)

    def test_refused_files(self):
        (self.work / "old.ckpt").write_bytes(b"PK\x03\x04")
        r = self.gen("x.png", "a cat", "--lora", str(self.work / "old.ckpt"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("pickle", r.stderr)
        r = self.gen("x.png", "a cat", "--lora", lora("sd15"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("another base model", r.stderr)
        r = self.gen("x.png", "a cat", "--lora", lora("nan"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("NaN", r.stderr)
        trunc = self.work / "trunc.safetensors"
        trunc.write_bytes(Path(lora("kohya_te")).read_bytes()[:-10])
        r = self.gen("x.png", "a cat", "--lora", str(trunc))
        self.assertEqual(r.returncode, 2)
        self.assertIn(str(trunc), r.stderr)

    def test_strict_turns_unmatched_keys_into_an_error(self):
        import torch
        from safetensors.torch import load_file, save_file
        sd = load_file(lora("kohya_te"))
        sd["lora_unet_no_such_layer.lora_down.weight"] = torch.zeros(4, 4)
        extra = self.work / "extra.safetensors"
        save_file(sd, str(extra))
        r = self.gen("ok.png", "a cat", "--lora", str(extra))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("lora_unet_no_such_layer", r.stderr)
        r = self.gen("strict.png", "a cat", "--lora", str(extra), "--strict-lora")
        self.assertEqual(r.returncode, 2)
        self.assertIn("lora_unet_no_such_layer", r.stderr)


class Bench(unittest.TestCase):
    def test_lora_bench_reports_load_and_switch_times(self):
        out = Path(ARGS.work) / "bench.json"
        r = run([ARGS.lora_bench, "--model", ARGS.model, "--lora", lora("kohya_unet"), "--lora", lora("peft") + ":0.5",
                 "--switches", "6", "--threads", "1", "--json", str(out)])
        self.assertEqual(r.returncode, 0, r.stderr)
        j = json.loads(out.read_text())
        self.assertEqual((j["misses"], j["hits"], j["switches"]), (2, 6, 6))
        for k in ("first_apply_a_s", "load_a_s", "merge_a_s", "switch_median_s", "restore_s"):
            self.assertGreater(j[k], 0.0, k)


class Batch(unittest.TestCase):
    def setUp(self):
        self.work = Path(ARGS.work) / self._testMethodName
        shutil.rmtree(self.work, ignore_errors=True)
        (self.work / "loras").mkdir(parents=True)
        shutil.copy(lora("kohya_unet"), self.work / "loras" / "hero.safetensors")
        shutil.copy(lora("kohya_te"), self.work / "loras" / "ink.safetensors")

    def test_example_config_runs_with_its_loras(self):
        cfg = self.work / "lora-story.json"
        shutil.copy(Path(ARGS.source) / "configs" / "lora-story.json", cfg)
        r = sdxl("validate", str(cfg), "--model", ARGS.model)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        out = self.work / "out"
        r = sdxl("run", str(cfg), "--model", ARGS.model, "--out", str(out), "--threads", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        report = read_report(out)
        self.assertEqual(report["images_done"], 3)
        self.assertEqual(report["lora"]["misses"], 2)
        self.assertGreaterEqual(report["lora"]["hits"], 1)
        self.assertIn("bytes_held", report["lora"])
        params = parameters(out / "keeper-02-lamp-0-2102.png")
        self.assertIn("<lora:ink:0.6>", params.split("\n")[0])
        self.assertRegex(params, r'Lora hashes: "hero: [0-9a-f]{12}, ink: [0-9a-f]{12}"')

    def test_switching_back_restores_the_base_image_bit_for_bit(self):
        prompt = "a red door"
        batch = {"version": 1, "defaults": {"steps": 3, "width": 256, "height": 256},
                 "loras": {"hero": {"path": "loras/hero.safetensors"}},
                 "tasks": [{"id": "a-base", "prompt": prompt, "seed": 5},
                           {"id": "b-lora", "prompt": prompt + " <lora:ink:1.0>", "seed": 5,
                            "loras": [{"name": "hero", "weight": 1.0}]},
                           {"id": "c-base", "prompt": prompt, "seed": 5}]}
        cfg = self.work / "switch.json"
        cfg.write_text(json.dumps(batch))
        out = self.work / "out"
        r = sdxl("run", str(cfg), "--model", ARGS.model, "--out", str(out), "--threads", "1",
                 "--lora-dir", str(self.work / "loras"))
        self.assertEqual(r.returncode, 0, r.stderr)
        a, b, c = (pixels(out / f"{t}-0-5.png") for t in ("a-base", "b-lora", "c-base"))
        self.assertFalse(np.array_equal(a, b))
        self.assertTrue(np.array_equal(a, c), "the base image after a LoRA differs: weights drifted")

    def test_unknown_names_and_missing_files_are_reported_with_pointers(self):
        batch = {"version": 1, "loras": {"hero": {"path": "loras/missing.safetensors", "pin": True}},
                 "tasks": [{"id": "a", "prompt": "x", "loras": [{"name": "villain"}]},
                           {"id": "b", "prompt": "x", "loras": [{"path": "nowhere.safetensors", "weight": 2}]}]}
        cfg = self.work / "bad.json"
        cfg.write_text(json.dumps(batch, indent=1))
        r = sdxl("validate", str(cfg), "--model", ARGS.model)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        text = r.stdout + r.stderr
        self.assertIn("/loras/hero/path", text)
        self.assertIn("/tasks/0/loras/0/name", text)
        self.assertIn("villain", text)
        self.assertIn("/tasks/1/loras/0/path", text)


if __name__ == "__main__":
    sys.exit(main(__doc__, "--binary", "--model", "--loras", "--work", "--source",
                  extra=lambda ap: ap.add_argument("--lora-bench", required=True, help="the sdxl-lora-bench tool")))
