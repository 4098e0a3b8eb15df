#!/usr/bin/env python3
"""End-to-end tests of IP-Adapters in batch runs on the tiny model (ctest label e2e): 50 panels
sharing 3 reference images encode each reference once (report.json's ip_image_cache_loads); a
batch mixing tasks with and without an adapter equals `generate` at --max-batch 1 and resumes; the
PNG and report.json name the adapter, its scale and each reference's hash; a reference that cannot
be decoded at run time, or an adapter folder that does not load, fails only its tasks; `validate`'s
errors; the hires fix and img2img with an adapter; a model exported before IP-Adapter support is
refused; the CLI's flag errors.

    test_ip_adapter.py --binary B --model TINY --diffusers TINY_DIFFUSERS --python PY --source REPO --work DIR
        [--side-modules DIR]   (ctest's fixture side_modules: the plus adapter's export, made once)
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from e2e_common import (ARGS, ENV, TestCase, export, main, parameters, pixels, python, read_report, run,
                        side_modules_option)
from e2e_common import run_ok as sh
from PIL import Image

PROMPT = "comic panel, a lighthouse keeper"


def reference_image(path: Path, seed: int, size=(96, 64)) -> None:
    rng = np.random.default_rng(seed)
    px = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    px[: size[1] // 2] = np.linspace(0, 255, size[0], dtype=np.uint8)[None, :, None]
    Image.fromarray(px, "RGB").save(path)


class IpAdapterRuns(TestCase):
    work: Path
    ip: Path

    @classmethod
    def setUpClass(cls):
        cls.work = Path(ARGS.work)
        shutil.rmtree(cls.work, ignore_errors=True)
        (cls.work / "refs").mkdir(parents=True)
        cls.ip = cls.work / "ip" / "plus"
        if ARGS.side_modules:  # the same plus adapter (ip_adapter_fixture's seed 31) exported once for several tests
            shutil.copytree(Path(ARGS.side_modules) / "ip-plus", cls.ip)
        else:
            src = cls.work / "ip-src"
            python("-m", "reference.ip_adapter_fixture", "--diffusers", ARGS.diffusers, "--out", src,
                   what="ip_adapter_fixture")
            export("--ip-adapter", next((src / "plus").glob("*.safetensors")), "--image-encoder",
                   src / "plus" / "image_encoder", "--dtype", "fp32", "--device", "cpu", "--out", cls.ip,
                   what="export --ip-adapter")
        for i in range(3):
            reference_image(cls.work / "refs" / f"r{i}.png", 40 + i, (96, 64) if i != 2 else (64, 80))

    def batch(self, name: str, tasks: list[dict], **defaults) -> Path:
        path = self.work / f"{name}.json"
        d = {"steps": 2, "negative": "blurry", **defaults}
        path.write_text(json.dumps({"version": 1, "defaults": d, "tasks": tasks}))
        return path

    def run_batch(self, batch: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
        return run([ARGS.binary, "--log-level", "info", "run", str(batch), "--model", ARGS.model,
                    "--out", str(out), "--threads", "1", "--no-progress", *extra])

    def generate(self, out: Path, *extra: str) -> None:
        sh([ARGS.binary, "generate", "--model", ARGS.model, "--prompt", PROMPT, "--negative", "blurry", "--steps", "2",
            "--threads", "1", *extra, "--out", str(out)], "generate", env=ENV)

    def test_fifty_panels_sharing_three_references_encode_three(self):
        tasks = [{"id": f"p{k:02d}", "prompt": f"{PROMPT}, panel {k}", "seed": k,
                  "ip_adapter": {"model": "ip/plus", "images": [f"refs/r{k % 3}.png"], "scale": 0.6}}
                 for k in range(50)]
        out = self.work / "out-fifty"
        r = self.run_batch(self.batch("fifty", tasks, width=64 * 4, height=64 * 4), out, "--max-batch", "8")
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        report = read_report(out)
        self.assertEqual(report["images_done"], 50)
        engine = report["devices"][0]["engine"]
        self.assertEqual(engine["ip_image_cache_loads"], 3, "each reference encoded once")
        self.assertEqual(engine["ip_image_cache_hits"], 47)
        self.assertEqual(engine["ip_adapter_cache_loads"], 1)
        (self.work / "fifty-engine.json").write_text(json.dumps(engine, indent=1))
        first = report["images"][0]
        sha = hashlib.sha256((self.work / "refs" / "r0.png").read_bytes()).hexdigest()
        by_task = {i["task"]: i for i in report["images"]}
        self.assertEqual(by_task["p00"]["ip_adapter"]["images"][0]["hash"], sha[:10])
        self.assertEqual(by_task["p00"]["ip_adapter"]["scale"], 0.6)
        params = parameters(out / first["file"])
        self.assertIn("IP-Adapter: \"Model: ", params)
        self.assertIn(f"Weight: 0.6, Images: r{int(first['task'][1:]) % 3}.png [", params)

    def test_batch_equals_generate_and_resumes(self):
        tasks = [{"id": "a", "prompt": PROMPT, "seed": 5,
                  "ip_adapter": {"model": "ip/plus", "images": ["refs/r0.png", "refs/r1.png"], "scale": 0.7}},
                 {"id": "b", "prompt": PROMPT, "seed": 6, "ip_adapter": {"model": "ip/plus", "images": ["refs/r2.png"]}},
                 {"id": "plain", "prompt": PROMPT, "seed": 5}]
        out = self.work / "out-mixed"
        r = self.run_batch(self.batch("mixed", tasks), out, "--max-batch", "1")
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        report = read_report(out)
        files = {i["task"]: out / i["file"] for i in report["images"]}
        one = self.work / "generate-a.png"
        self.generate(one, "--seed", "5", "--ip-adapter", str(self.ip), "--ip-image", str(self.work / "refs" / "r0.png"),
                      "--ip-image", str(self.work / "refs" / "r1.png"), "--ip-scale", "0.7")
        self.assertTrue((pixels(one) == pixels(files["a"])).all(), "at --max-batch 1: bit-identical to generate")
        self.assertFalse((pixels(files["plain"]) == pixels(files["a"])).all(), "the adapter changes the image")
        self.assertNotIn("ip_adapter", {i["task"]: i for i in report["images"]}["plain"])
        again = self.run_batch(self.batch("mixed", tasks), out)
        self.assertEqual(again.returncode, 0, again.stderr[-2000:])
        self.assertEqual(read_report(out)["images_skipped"], 3)
        tasks[0]["ip_adapter"]["scale"] = 0.5  # another setting: made again
        self.run_batch(self.batch("mixed", tasks), out)
        report = read_report(out)
        self.assertEqual((report["images_done"], report["images_skipped"]), (1, 2))

    def test_bad_inputs_at_run_time_fail_only_their_tasks(self):
        broken = self.work / "ip" / "broken"
        shutil.copytree(self.ip, broken, dirs_exist_ok=True)
        ts = broken / "ip_adapter.ts"
        ts.write_bytes(b"\0" * ts.stat().st_size)  # the size model.json records, not a module
        tasks = [{"id": "bad-adapter", "prompt": PROMPT, "seed": 1,
                  "ip_adapter": {"model": "ip/broken", "images": ["refs/r0.png"]}},
                 {"id": "good", "prompt": PROMPT, "seed": 3, "ip_adapter": {"model": "ip/plus", "images": ["refs/r1.png"]}}]
        out = self.work / "out-broken"
        r = self.run_batch(self.batch("broken", tasks), out)
        report = read_report(out)
        self.assertEqual((report["images_done"], report["images_failed"]), (1, 1), r.stderr[-3000:])
        failures = {f["task"]: f["error"] for f in report["failures"]}
        self.assertIn("ip_adapter.ts", failures["bad-adapter"])
        self.assertEqual(r.returncode, 3, "finished, but images failed")

    def test_a_truncated_reference_image_is_refused_before_the_run(self):
        cut = self.work / "refs" / "cut.png"
        data = (self.work / "refs" / "r0.png").read_bytes()
        cut.write_bytes(data[: len(data) // 2])  # a readable PNG header, no image
        tasks = [{"id": "good", "prompt": PROMPT, "seed": 3, "ip_adapter": {"model": "ip/plus", "images": ["refs/r1.png"]}},
                 {"id": "bad-image", "prompt": PROMPT, "seed": 2,
                  "ip_adapter": {"model": "ip/plus", "images": ["refs/cut.png"]}}]
        b, out = self.batch("cut", tasks), self.work / "out-cut"
        checked = run([ARGS.binary, "validate", str(b), "--model", ARGS.model])
        r = self.run_batch(b, out)
        for name, result in (("validate", checked), ("run", r)):
            self.assertEqual(result.returncode, 2, name + ": " + result.stdout + result.stderr[-3000:])
            self.assertIn("/tasks/1/ip_adapter/images/0", result.stdout + result.stderr, name)
            self.assertIn("cut.png", result.stdout + result.stderr, name)
        self.assertFalse(list(out.glob("*.png")) if out.exists() else [], "nothing is made from a refused batch")

    def test_validate_names_each_problem(self):
        tasks = [{"id": "a", "prompt": PROMPT, "ip_adapter": {"model": "ip/none", "images": ["refs/r0.png"]}},
                 {"id": "b", "prompt": PROMPT, "ip_adapter": {"model": "ip/plus", "images": ["refs/none.png"]}},
                 {"id": "c", "prompt": PROMPT, "ip_adapter": {"model": "ip/plus", "images": ["refs/r0.png"], "scale": 11}},
                 {"id": "d", "prompt": PROMPT, "ip_adapter": {"model": "refs", "images": ["refs/r0.png"]}}]
        r = run([ARGS.binary, "validate", str(self.batch("invalid", tasks)), "--model", ARGS.model])
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        for pointer in ("/tasks/0/ip_adapter/model", "/tasks/1/ip_adapter/images/0", "/tasks/2/ip_adapter/scale",
                        "/tasks/3/ip_adapter/model"):
            self.assertIn(pointer, r.stdout)
        self.assertIn("refs/none.png", r.stdout)

    def test_hires_and_img2img_take_the_adapter(self):
        ip = ["--ip-adapter", str(self.ip), "--ip-image", str(self.work / "refs" / "r0.png")]
        init = self.work / "init.png"
        reference_image(init, 7, (256, 256))
        for name, extra in (("hires", ["--hires-scale", "1.5", "--hires-steps", "2"]),
                            ("img2img", ["--init-image", str(init), "--strength", "0.7"])):
            with_ip, without = self.work / f"{name}-ip.png", self.work / f"{name}-plain.png"
            self.generate(with_ip, "--seed", "3", *extra, *ip)
            self.generate(without, "--seed", "3", *extra)
            self.assertFalse((pixels(with_ip) == pixels(without)).all(), name)
            self.assertIn("IP-Adapter:", parameters(with_ip))

    def test_a_model_exported_before_ip_adapters_is_refused(self):
        old = self.work / "old-model"
        shutil.copytree(ARGS.model, old, dirs_exist_ok=True)
        meta = json.loads((old / "model.json").read_text())
        meta["unet"].pop("ip_adapter")
        (old / "model.json").write_text(json.dumps(meta))
        r = run([ARGS.binary, "generate", "--model", str(old), "--prompt", PROMPT, "--steps", "2",
                 "--ip-adapter", str(self.ip), "--ip-image", str(self.work / "refs" / "r0.png"),
                 "--out", str(self.work / "old.png")])
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("exported before IP-Adapter support", r.stderr)
        self.generate(self.work / "old-plain.png", "--seed", "1")  # and it still runs without one

    def test_cli_flag_errors(self):
        base = [ARGS.binary, "generate", "--model", ARGS.model, "--prompt", PROMPT, "--steps", "2", "--threads", "1",
                "--out", str(self.work / "flags.png")]
        self.assertEachRefused(base, (
            (["--ip-image", str(self.work / "refs" / "r0.png")], "--ip-image needs --ip-adapter"),
            (["--ip-adapter", str(self.ip)], "needs at least one --ip-image"),
            (["--ip-adapter", str(self.ip), "--ip-image", str(self.work / "refs" / "none.png")], "none.png"),
            (["--ip-adapter", str(self.work / "refs"), "--ip-image", str(self.work / "refs" / "r0.png")],
             "IP-Adapter folder")))


if __name__ == "__main__":
    sys.exit(main(__doc__, "--binary", "--model", "--diffusers", "--python", "--source", "--work",
                  extra=side_modules_option))
