#!/usr/bin/env python3
"""End-to-end tests of the real sdxl-batch binary on the tiny model (ctest label e2e).

    test_cli.py --binary BUILD/sdxl-batch --model TINY_MODEL_DIR --work DIR --source REPO
"""
from __future__ import annotations

import json
import re
import shutil
import sys
import unittest
from pathlib import Path

import numpy as np
from e2e_common import ARGS, TestCase, main, meta_of, parameters, pixels, png_settings, read_manifest, read_report, sdxl
from PIL import Image


class ExampleBatch(unittest.TestCase):
    """`run` on configs/example-batch.json makes every PNG with correct metadata. The file runs as
    shipped but for its two frame panels (768x1344, the rest is 256x256 on the tiny model), which
    sample FRAME_STEPS steps instead of the model's 8: those two were 86% of the run's sampling
    (27 s); their size, frame and metadata are checked as before, and the other tasks still
    take the model's default steps. Its dialogue panel's IP-Adapter and ControlNet are the ones
    scripts/run_example.sh exports (fixture_example_adapters); its pictures are the shipped ones."""

    FRAME_STEPS = 2

    def test_example_batch(self):
        out = Path(ARGS.work) / "example"
        shutil.rmtree(out, ignore_errors=True)
        shipped = Path(ARGS.source) / "configs" / "example-batch.json"
        batch = json.loads(shipped.read_text())
        frames = [task for task in batch["tasks"] if "upscale" in task]
        self.assertEqual(len(frames), 2, "the example's two frame panels")
        for task in frames:
            self.assertNotIn("steps", task)
            task["steps"] = self.FRAME_STEPS
        configs = shipped.parent.resolve()
        for character in batch["characters"].values():
            character["reference"]["image"] = str(configs / character["reference"]["image"])
        panels = [task for task in batch["tasks"] if "regions" in task]
        self.assertEqual(len(panels), 1, "the example's dialogue panel")
        panel = panels[0]
        self.assertEqual(sorted(r["character"] for r in panel["regions"]), sorted(batch["characters"]))
        self.assertEqual(panel["ip_adapter"]["model"], "../models/tiny-ip-adapter")  # what run_example.sh exports
        panel["ip_adapter"]["model"] = str(Path(ARGS.example_ip_adapter).resolve())
        (control,) = panel["controlnets"]
        self.assertEqual(control["model"], "../models/tiny-controlnet")
        control.update(model=str(Path(ARGS.example_controlnet).resolve()), image=str(configs / control["image"]))
        batch_path = Path(ARGS.work) / "example-batch.json"
        batch_path.write_text(json.dumps(batch))
        r = sdxl("run", str(batch_path), "--model", ARGS.model, "--out", str(out))
        self.assertEqual(r.returncode, 0, r.stderr)
        model = meta_of(ARGS.model)
        expected = 0
        for task in batch["tasks"]:
            for i in range(task.get("count", 1)):
                expected += 1
                seed = task["seed"] + i
                png = out / f"{task['id']}-{i}-{seed}.png"
                self.assertTrue(png.is_file(), f"missing {png}")
                size = (task.get("width", model["defaults"]["width"]), task.get("height", model["defaults"]["height"]))
                frame = task.get("upscale", {}).get("size")  # the two last panels are written as 1080x1920 frames
                with Image.open(png) as im:
                    self.assertEqual(im.size, tuple(int(v) for v in frame.split("x")) if frame else size)
                    params = im.info["parameters"]
                lines = params.split("\n")
                self.assertEqual(lines[0], task["prompt"])
                negative = task.get("negative", batch["defaults"]["negative"])
                self.assertEqual(lines[1], f"Negative prompt: {negative}")
                # A1111 quotes the values that hold ", " (ControlNet 0, IP-Adapter, Region N)
                settings = {k.strip(): v for k, v in re.findall(r'([^:,"]+): ("[^"]*"|[^,]*)', lines[2])}
                if "regions" in task:  # the dialogue panel: each character in its own box, one pose map
                    self.assertEqual(settings["RP Active"], "True")
                    self.assertEqual(settings["RP Base Ratios"], str(task["region_base"]))
                    for n, region in enumerate(task["regions"], 1):
                        self.assertIn(f"Character: {region['character']}, Reference: {region['character']}.png",
                                      settings[f"Region {n}"])
                    self.assertIn("Weight: 0.8", settings["ControlNet 0"])
                    self.assertIn("Model: ip-adapter-plain", settings["IP-Adapter"])
                self.assertEqual(settings["Steps"], str(task.get("steps", model["defaults"]["steps"])))
                self.assertEqual(settings["Sampler"], "Euler")
                self.assertEqual(settings["Schedule type"], "Automatic")
                self.assertEqual(float(settings["CFG scale"]), task.get("cfg", model["defaults"]["cfg"]))
                self.assertEqual(settings["Seed"], str(seed))
                self.assertEqual(settings["Size"], f"{size[0]}x{size[1]}")
                self.assertEqual(settings["Model"], model["name"])
                self.assertTrue(settings["Version"].startswith("sdxl-batch "))
                if frame:
                    self.assertIn(f"Postprocess upscale to: {frame}", lines[2])
                    self.assertIn("Postprocess upscaler: Lanczos", lines[2])
        report = read_report(out)
        self.assertEqual(report["images_done"], expected)
        self.assertEqual(report["images_failed"], 0)
        leftovers = [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
        self.assertEqual(leftovers, [], "temporary files left behind")


class Generate(unittest.TestCase):
    def test_same_seed_same_pixels_and_chinese_prompt_metadata(self):
        work = Path(ARGS.work)
        work.mkdir(parents=True, exist_ok=True)
        prompt = "一只戴红围巾的猫, comic style"
        files = []
        for name in ("a.png", "b.png"):
            r = sdxl("generate", "--model", ARGS.model, "--prompt", prompt, "--seed", "77", "--steps", "3",
                     "--width", "256", "--height", "320", "--out", str(work / name))
            self.assertEqual(r.returncode, 0, r.stderr)
            files.append(work / name)
        with Image.open(files[0]) as a, Image.open(files[1]) as b:
            self.assertEqual(a.size, (256, 320))
            self.assertEqual(a.tobytes(), b.tobytes())
            self.assertTrue(a.info["parameters"].startswith(prompt + "\nSteps: 3,"))

    def test_vae_dtype_bf16_is_close_to_fp32(self):
        work = Path(ARGS.work)
        work.mkdir(parents=True, exist_ok=True)
        px = {}
        for dt in ("fp32", "bf16"):
            out = work / f"vae-{dt}.png"
            r = sdxl("generate", "--model", ARGS.model, "--prompt", "a harbour", "--seed", "5", "--steps", "2",
                     "--vae-dtype", dt, "--out", str(out))
            self.assertEqual(r.returncode, 0, r.stderr)
            px[dt] = pixels(out)
        a, b = px["fp32"], px["bf16"]
        self.assertFalse(np.array_equal(a, b), "--vae-dtype bf16 decoded in fp32")
        mse = float(((a - b) ** 2).mean())
        self.assertLess(mse, 4.0, "bf16 decode far from fp32")  # about 50 dB measured

    def test_random_seed_is_recorded(self):
        out = Path(ARGS.work) / "random.png"
        r = sdxl("generate", "--model", ARGS.model, "--prompt", "x", "--steps", "2", "--out", str(out))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(parameters(out), r"Seed: \d+,")


class Fp8Precision(unittest.TestCase):
    """--precision fp8 runs the export's unet_fp8.ts (export_sdxl.py --fp8): deterministic, close to the
    default UNet but not equal, named in the PNG, the report and the manifest; a resume in the other
    precision makes the images again; a model without it, or with --dtype, is refused by name."""

    def gen(self, name: str, *extra: str) -> np.ndarray:
        out = Path(ARGS.work) / name
        r = sdxl("generate", "--model", ARGS.model, "--prompt", "a red kite over a beach", "--seed", "9",
                 "--steps", "3", "--out", str(out), *extra)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.params = parameters(out)
        return pixels(out)

    def test_generate_is_deterministic_close_and_labelled(self):
        Path(ARGS.work).mkdir(parents=True, exist_ok=True)
        default = self.gen("fp8-default.png")
        self.assertNotIn("UNet precision", self.params)
        a = self.gen("fp8-a.png", "--precision", "fp8")
        self.assertIn(", UNet precision: fp8 e4m3, Version: ", self.params)
        self.assertTrue(np.array_equal(a, self.gen("fp8-b.png", "--precision", "fp8")))
        self.assertFalse(np.array_equal(a, default), "--precision fp8 ran the default UNet")
        mse = float(((a - default) ** 2).mean())
        self.assertLess(mse, 100.0, "fp8 far from the default UNet")  # > 28 dB

    def test_run_records_precision_and_resumes_only_in_it(self):
        out = Path(ARGS.work) / "fp8-run"
        shutil.rmtree(out, ignore_errors=True)
        batch = Path(ARGS.work) / "fp8-batch.json"
        batch.write_text(json.dumps({"version": 1, "tasks": [{"id": "kite", "prompt": "a kite", "steps": 2, "count": 2}]}))

        def run(*extra):
            r = sdxl("run", str(batch), "--model", ARGS.model, "--out", str(out), "--no-progress", *extra)
            self.assertEqual(r.returncode, 0, r.stderr)
            return read_report(out)

        rep = run("--precision", "fp8")
        self.assertEqual((rep["unet_precision"], rep["images_done"]), ("fp8", 2))
        lines = [json.loads(l) for l in (out / "manifest.jsonl").read_text().splitlines() if '"task"' in l]
        self.assertEqual({l.get("unet_precision") for l in lines}, {"fp8"})
        self.assertEqual(run("--precision", "fp8")["images_skipped"], 2)
        rep = run()
        self.assertEqual((rep["unet_precision"], rep["images_skipped"], rep["images_done"]), ("default", 0, 2))

    def test_refusals_name_the_cause(self):
        no_fp8 = Path(ARGS.work) / "no-fp8-model"
        shutil.rmtree(no_fp8, ignore_errors=True)
        shutil.copytree(ARGS.model, no_fp8)
        meta = json.loads((no_fp8 / "model.json").read_text())
        del meta["unet"]["fp8"]
        (no_fp8 / "model.json").write_text(json.dumps(meta))
        r = sdxl("generate", "--model", str(no_fp8), "--prompt", "x", "--steps", "1", "--precision", "fp8",
                 "--out", str(no_fp8 / "x.png"))
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("no FP8 UNet", r.stderr)
        self.assertIn("--fp8", r.stderr)
        r = sdxl("generate", "--model", ARGS.model, "--prompt", "x", "--precision", "fp8", "--dtype", "bf16")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("drop --dtype bf16", r.stderr)
        r = sdxl("generate", "--model", ARGS.model, "--prompt", "x", "--precision", "int4")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--precision", r.stderr)


class BadInput(TestCase):
    """Bad flags/values exit 2 naming them; a bad model exits 1 naming the file."""

    def test_usage_errors(self):
        self.assertExit(sdxl("generate", "--model", ARGS.model, "--prompt", "x", "--bogus"), 2, "--bogus")
        self.assertExit(sdxl("generate", "--model", ARGS.model, "--prompt", "x", "--steps", "many"), 2, "--steps")
        self.assertExit(sdxl("generate", "--model", ARGS.model, "--prompt", "x", "--steps", "0"), 2, "--steps")
        self.assertExit(sdxl("generate", "--model", ARGS.model), 2, "--prompt")
        self.assertExit(sdxl("generate", "--prompt", "x"), 2, "--model")
        self.assertExit(sdxl("generate", "--model", ARGS.model, "--prompt", "x", "--device", "tpu"), 2, "tpu")
        self.assertExit(sdxl("generate", "--model", ARGS.model, "--prompt", "x", "--width", "100"), 2, "width 100")
        self.assertExit(sdxl("generate", "--model", ARGS.model, "--prompt", "x", "--vae-dtype", "fp8"), 2, "--vae-dtype", "fp8")
        self.assertExit(sdxl(), 2)
        self.assertExit(sdxl("frobnicate"), 2, "frobnicate")

    def test_bad_batch_file_lists_every_problem(self):
        bad = Path(ARGS.work) / "bad-batch.json"
        bad.parent.mkdir(parents=True, exist_ok=True)
        bad.write_text(json.dumps({"version": 1, "tasks": [
            {"id": "a", "prompt": "x", "steps": 9999},
            {"id": "a", "prompt": "y", "colour": "red"}]}))
        r = sdxl("run", str(bad), "--model", ARGS.model, "--out", str(Path(ARGS.work) / "bad-out"))
        self.assertExit(r, 2, "/tasks/0/steps", "/tasks/1/id", "/tasks/1/colour")

    def test_bad_embeddings_are_refused_with_the_file(self):
        from safetensors.torch import save_file
        import torch
        d = Path(ARGS.work) / "bad-embeddings"
        cases = {
            "sd15": ({"emb_params": torch.zeros(1, 768)}, "SD 1.x embedding"),
            "narrow": ({"clip_l": torch.zeros(2, 7), "clip_g": torch.zeros(2, 7)}, "has shape [2, 7], this model needs"),
            "cat": (None, "already a word of the tokenizer"),
        }
        for name, (tensors, why) in cases.items():
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            if tensors is None:  # a name that is a token already ("cat" is in CLIP's vocabulary)
                model = meta_of(ARGS.model)
                vocab = json.loads((Path(ARGS.model) / model["text_encoders"][0]["tokenizer"] / "vocab.json").read_text())
                self.assertIn("cat", vocab)
                tensors = {"clip_l": torch.zeros(1, model["text_encoders"][0]["hidden_dim"]),
                           "clip_g": torch.zeros(1, model["text_encoders"][1]["hidden_dim"])}
            save_file(tensors, str(d / f"{name}.safetensors"))
            r = sdxl("generate", "--model", ARGS.model, "--embedding-dir", str(d), "--prompt", "x", "--steps", "1",
                     "--out", str(d / "x.png"))
            self.assertEqual(r.returncode, 2, f"{name}: {r.stderr}")
            self.assertIn(why, r.stderr, name)
            self.assertIn(f"{name}.safetensors", r.stderr, name)
        shutil.rmtree(d, ignore_errors=True)  # a pickle is refused unopened, as LoRA pickles are
        d.mkdir(parents=True)
        (d / "badhands.pt").write_bytes(b"\x80\x02}q\x00.")
        r = sdxl("generate", "--model", ARGS.model, "--embedding-dir", str(d), "--prompt", "x", "--steps", "1",
                 "--out", str(d / "x.png"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("badhands.pt' is a pickle file", r.stderr)

    def test_batch_embeddings_dir_matches_the_flag(self):
        from safetensors.torch import save_file
        import torch
        d = Path(ARGS.work) / "batch-embeddings"
        shutil.rmtree(d, ignore_errors=True)
        (d / "emb").mkdir(parents=True)
        model = meta_of(ARGS.model)
        g = torch.Generator().manual_seed(1)
        save_file({"clip_l": 4 * torch.randn(2, model["text_encoders"][0]["hidden_dim"], generator=g),
                   "clip_g": 4 * torch.randn(2, model["text_encoders"][1]["hidden_dim"], generator=g)},
                  str(d / "emb" / "inkstyle.safetensors"))
        (d / "b.json").write_text(json.dumps({"version": 1, "embeddings_dir": "emb", "tasks": [
            {"id": "a", "prompt": "a lighthouse, inkstyle", "seed": 9, "steps": 3}]}))
        r = sdxl("run", str(d / "b.json"), "--model", ARGS.model, "--out", str(d / "out"))
        self.assertEqual(r.returncode, 0, r.stderr)
        r = sdxl("generate", "--model", ARGS.model, "--embedding-dir", str(d / "emb"), "--prompt", "a lighthouse, inkstyle",
                 "--seed", "9", "--steps", "3", "--out", str(d / "flag.png"))
        self.assertEqual(r.returncode, 0, r.stderr)
        r = sdxl("generate", "--model", ARGS.model, "--prompt", "a lighthouse, inkstyle", "--seed", "9", "--steps", "3",
                 "--out", str(d / "plain.png"))
        self.assertEqual(r.returncode, 0, r.stderr)
        px = {n: pixels(p) for n, p in
              (("batch", d / "out" / "a-0-9.png"), ("flag", d / "flag.png"), ("plain", d / "plain.png"))}
        self.assertTrue((px["batch"] == px["flag"]).all(), "the batch key and the flag load the same embedding")
        self.assertFalse((px["batch"] == px["plain"]).all(), "without it, 'inkstyle' is plain text")
        # Embedding vectors count in validate's prompt-length check and show in `tokens`.
        (d / "long").mkdir()
        save_file({"clip_l": torch.zeros(320, model["text_encoders"][0]["hidden_dim"]),
                   "clip_g": torch.zeros(320, model["text_encoders"][1]["hidden_dim"])}, str(d / "long" / "zzepicz.safetensors"))
        (d / "long.json").write_text(json.dumps({"version": 1, "tasks": [{"id": "a", "prompt": "a lighthouse, zzepicz", "seed": 1}]}))
        r = sdxl("validate", str(d / "long.json"), "--model", ARGS.model)
        self.assertEqual(r.returncode, 0, r.stdout)
        r = sdxl("validate", str(d / "long.json"), "--model", ARGS.model, "--embedding-dir", str(d / "long"))
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("/tasks/0/prompt: image 0's prompt needs 5 chunks", r.stdout)
        r = sdxl("tokens", "--model", ARGS.model, "--embedding-dir", str(d / "emb"), "--json", "a inkstyle")
        self.assertEqual(r.returncode, 0, r.stderr)
        texts = [t["text"] for t in json.loads(r.stdout)["encoders"][0]["chunks"][0]["tokens"]]
        self.assertEqual(texts, ["a</w>", "inkstyle", "inkstyle_1"])
        (d / "bad.json").write_text(json.dumps({"version": 1, "embeddings_dir": "nowhere",
                                                "tasks": [{"id": "a", "prompt": "x"}]}))
        r = sdxl("validate", str(d / "bad.json"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("/embeddings_dir", r.stdout)

    def test_model_errors_name_the_file(self):
        self.assertExit(sdxl("generate", "--model", "/nonexistent/m", "--prompt", "x"), 1, "/nonexistent/m")
        broken = Path(ARGS.work) / "broken-model"
        shutil.rmtree(broken, ignore_errors=True)
        shutil.copytree(ARGS.model, broken)
        (broken / "model.json").write_text('{"format_version": 1, "name": ')
        self.assertExit(sdxl("generate", "--model", str(broken), "--prompt", "x"), 1, str(broken / "model.json"))
        shutil.copy(Path(ARGS.model) / "model.json", broken / "model.json")
        with open(broken / "unet.ts", "r+b") as f:
            f.truncate(1000)
        self.assertExit(sdxl("generate", "--model", str(broken), "--prompt", "x"), 1, str(broken / "unet.ts"))

    def test_help(self):
        r = sdxl("--help")
        self.assertEqual(r.returncode, 0)
        for sub in ("generate", "run", "tokens"):
            self.assertIn(sub, r.stdout)
        r = sdxl("generate", "--help")
        self.assertEqual(r.returncode, 0)
        for flag in ("--prompt", "--negative", "--seed", "--steps", "--cfg", "--width", "--height", "--out",
                     "--device", "--dtype", "--model"):
            self.assertIn(flag, r.stdout)


class Configs(unittest.TestCase):
    def test_every_example_config_validates(self):
        configs = sorted(p for p in (Path(ARGS.source) / "configs").glob("*.json") if not p.name.endswith(".schema.json"))
        self.assertGreaterEqual(len(configs), 2)
        for cfg in configs:
            if "loras" in json.loads(cfg.read_text()):
                continue  # needs LoRA files made at test time: tests/e2e/test_lora.py validates and runs it
            if "upscale" in json.loads(cfg.read_text()).get("defaults", {}):
                continue  # needs an upscaler folder exported at test time: tests/parity/parity_frame.py validates it
            if cfg.name == "example-batch.json":
                continue  # names the IP-Adapter and ControlNet run_example.sh exports: ExampleBatch runs it with them
            r = sdxl("validate", str(cfg), "--model", ARGS.model)
            self.assertEqual(r.returncode, 0, f"{cfg}: {r.stdout}{r.stderr}")

    def test_json_schema_accepts_examples_and_rejects_bad_files(self):
        import jsonschema
        schema = json.loads((Path(ARGS.source) / "configs" / "batch.schema.json").read_text())
        validator = jsonschema.Draft202012Validator(schema)
        for cfg in (Path(ARGS.source) / "configs").glob("*.json"):
            if not cfg.name.endswith(".schema.json"):
                self.assertEqual(list(validator.iter_errors(json.loads(cfg.read_text()))), [], cfg)
        bad = {"version": 1, "output": {"template": "../x-{index}.png"},
               "tasks": [{"id": "a", "prompt": "x", "steps": 900, "colour": 1, "width": 100}]}
        self.assertEqual(len(list(validator.iter_errors(bad))), 4)

    def test_nightly_config_runs(self):
        out = Path(ARGS.work) / "nightly"
        shutil.rmtree(out, ignore_errors=True)
        r = sdxl("run", str(Path(ARGS.source) / "configs" / "nightly-story.json"), "--model", ARGS.model, "--out", str(out))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(read_report(out)["images_done"], 5)
        self.assertTrue((out / "report.html").is_file())
        dated = [p for p in out.iterdir() if p.is_dir()]
        self.assertEqual(len(dated), 1, "the {date}/ template makes one dated folder")
        self.assertEqual(len(list(dated[0].glob("*.png"))), 5)


class Runtime(unittest.TestCase):
    """The queue through the real binary: priorities, dry-run plans, budget flags."""

    def test_priorities_config_runs_in_priority_order(self):
        cfg = Path(ARGS.source) / "configs" / "priorities.json"
        out = Path(ARGS.work) / "priorities"
        shutil.rmtree(out, ignore_errors=True)
        r = sdxl("run", str(cfg), "--model", ARGS.model, "--out", str(out), "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("5 to make", r.stdout)
        self.assertIn("none measured yet", r.stdout)
        rows = [l.split() for l in r.stdout.splitlines() if len(l.split()) > 2 and l.split()[1] in ("high", "mid", "low")]
        self.assertEqual([row[1] for row in rows], ["high", "mid", "mid", "low", "low"], r.stdout)
        self.assertFalse(out.exists(), "a dry run writes nothing")
        r = sdxl("run", str(cfg), "--model", ARGS.model, "--out", str(out), "--vram-limit", "12GiB", "--retries", "2",
                 "--timeout", "10m", "--progress-interval", "0")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("progress", r.stderr, "plain progress lines when stderr is not a terminal")
        report = read_report(out)
        self.assertEqual(report["images_done"], 5)
        order = [im["task"] for im in sorted(report["images"], key=lambda im: im["start_s"])]
        self.assertEqual(order[0], "ep08-cover")
        self.assertEqual(order[1:3], ["ep08-p02", "ep08-p01"], "earliest deadline first within mid")
        self.assertEqual(order[3:], ["backlog-city", "backlog-city"])
        self.assertEqual(report["queue"]["deadlines_missed"], 0)
        self.assertTrue((out / "estimates.json").is_file(), "measured time is kept for the next plan")
        r = sdxl("run", str(cfg), "--model", ARGS.model, "--out", str(out), "--dry-run", "--force")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("measured by earlier runs", r.stdout)
        self.assertNotIn("unknown until", r.stdout)

    def test_estimates_file_carries_measured_figures_to_a_fresh_folder(self):
        """run --estimates FILE: a fresh output folder starts from figures measured into another one;
        a file that holds no estimates is refused and left as it is, one of another device is unused
        and left as it is."""
        work = Path(ARGS.work) / "estimates-file"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        batch = work / "b.json"
        batch.write_text(json.dumps({"version": 1, "defaults": {"steps": 1},
                                     "tasks": [{"id": "a", "prompt": "a lighthouse", "seed": 3}]}))
        shared = work / "sdxl-estimates.json"
        r = sdxl("run", str(batch), "--model", ARGS.model, "--out", str(work / "first"), "--estimates", str(shared))
        self.assertEqual(r.returncode, 0, r.stderr)
        est = json.loads(shared.read_text())
        self.assertEqual(est["model"], meta_of(ARGS.model)["name"])
        self.assertTrue(est["time"], "the run's measured time is written back")
        r = sdxl("run", str(batch), "--model", ARGS.model, "--out", str(work / "fresh"), "--dry-run")
        self.assertIn("none measured yet", r.stdout, "without the file a fresh folder knows nothing")
        r = sdxl("run", str(batch), "--model", ARGS.model, "--out", str(work / "fresh"), "--dry-run",
                 "--estimates", str(shared))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("measured by earlier runs", r.stdout)
        notes = work / "notes.txt"
        notes.write_text("shopping list\n")
        r = sdxl("run", str(batch), "--model", ARGS.model, "--out", str(work / "bad"), "--estimates", str(notes))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("notes.txt", r.stderr)
        self.assertEqual(notes.read_text(), "shopping list\n", "never overwritten")
        self.assertFalse((work / "bad").exists(), "refused before the output folder is made")
        r = sdxl("run", str(batch), "--model", ARGS.model, "--out", str(work / "bad"),
                 "--estimates", str(work / "no-such-folder" / "e.json"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("no-such-folder", r.stderr)
        other = dict(est, device="cuda:0/fp16")
        (work / "other.json").write_text(json.dumps(other))
        before = (work / "other.json").read_text()
        r = sdxl("run", str(batch), "--model", ARGS.model, "--out", str(work / "other"),
                 "--estimates", str(work / "other.json"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("not used, and left as it is", r.stderr)
        self.assertEqual((work / "other.json").read_text(), before)

    def test_batched_images_match_single_images_closely(self):
        batch = {"version": 1, "defaults": {"steps": 4},
                 "tasks": [{"id": "a", "prompt": "a red fox in the snow", "negative": "blurry", "seed": 5, "count": 2},
                           {"id": "b", "prompt": "a comic panel, hero on a rooftop", "seed": 9}]}
        work = Path(ARGS.work) / "batched"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        (work / "b.json").write_text(json.dumps(batch))
        shas = {}
        for n in (1, 3):
            out = work / f"o{n}"
            r = sdxl("run", str(work / "b.json"), "--model", ARGS.model, "--out", str(out), "--max-batch", str(n))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual([b["size"] for b in read_report(out)["batches"]], [1] * 3 if n == 1 else [3])
            shas[n] = {(l["task"], l["index"]): l["file"] for l in read_manifest(out)}
        for key, f in shas[1].items():
            a, b = pixels(work / "o1" / f), pixels(work / "o3" / shas[3][key])
            self.assertLessEqual(int(np.abs(a - b).max()), 1, key)
            self.assertLess(float((a != b).mean()), 0.001, key)

    def test_max_batch_above_the_models_batch_max_is_lowered_to_it(self):
        work = Path(ARGS.work) / "above-batch-max"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        batch = {"version": 1, "defaults": {"steps": 2}, "tasks": [{"id": "a", "prompt": "a fox", "seed": 1, "count": 10}]}
        (work / "b.json").write_text(json.dumps(batch))
        batch_max = meta_of(ARGS.model)["limits"]["batch_max"]
        self.assertLess(batch_max, 10)
        r = sdxl("run", str(work / "b.json"), "--model", ARGS.model, "--out", str(work / "o"), "--dry-run",
                 "--max-batch", "12")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"--max-batch 12 is above the batch_max {batch_max} of model", r.stderr)
        sizes = [int(line.split()[4]) for line in r.stdout.splitlines() if re.match(r"\s+\d+\s+mid\s", line)]
        self.assertEqual(sizes, [batch_max, 10 - batch_max], r.stdout)

    def test_bad_runtime_flags_are_named(self):
        cfg = Path(ARGS.source) / "configs" / "priorities.json"
        for flag, value in (("--vram-limit", "lots"), ("--timeout", "soon"), ("--aging", "x")):
            r = sdxl("run", str(cfg), "--model", ARGS.model, "--out", str(Path(ARGS.work) / "badflags"), flag, value)
            self.assertEqual(r.returncode, 2, (flag, r.stderr))
            self.assertIn(value, r.stderr)


class SamplersImg2ImgHires(unittest.TestCase):
    """A1111 sampler names, img2img and the hires fix through the real binary."""

    def test_samplers_hires_config_runs(self):
        out = Path(ARGS.work) / "samplers-hires"
        shutil.rmtree(out, ignore_errors=True)
        batch = Path(ARGS.source) / "configs" / "samplers-hires.json"
        r = sdxl("run", str(batch), "--model", ARGS.model, "--out", str(out))
        self.assertEqual(r.returncode, 0, r.stderr)
        model = meta_of(ARGS.model)
        w, h = model["defaults"]["width"], model["defaults"]["height"]
        size, s = png_settings(out / "storm-wide-0-2101.png")
        self.assertEqual(size, (int(w * 1.5) // 8 * 8, int(h * 1.5) // 8 * 8))
        self.assertEqual((s["Sampler"], s["Schedule type"]), ("DPM++ 2M", "Karras"))
        self.assertEqual((s["Hires upscale"], s["Hires steps"], s["Hires upscaler"], s["Denoising strength"]),
                         ("1.5", "10", "Latent", "0.5"))
        self.assertEqual(s["Size"], f"{w}x{h}")
        size, s = png_settings(out / "keeper-portrait-0-2102.png")
        self.assertEqual(size, (w, h))
        self.assertEqual((s["Sampler"], s["Schedule type"], s["Guidance rescale"]), ("Euler a", "Automatic", "0.7"))
        size, s = png_settings(out / "boat-closeup-0-2103.png")
        self.assertEqual(size, (w * 2, h * 2))
        self.assertEqual((s["Sampler"], s["Schedule type"], s["Hires upscaler"]), ("UniPC", "SGM Uniform", "Nearest"))

    def test_img2img_and_name_errors(self):
        work = Path(ARGS.work)
        work.mkdir(parents=True, exist_ok=True)
        init = work / "init-256x320.png"
        r = sdxl("generate", "--model", ARGS.model, "--prompt", "a teapot", "--seed", "5", "--steps", "3",
                 "--width", "256", "--height", "320", "--out", str(init))
        self.assertEqual(r.returncode, 0, r.stderr)
        out = work / "img2img.png"
        r = sdxl("generate", "--model", ARGS.model, "--prompt", "a teapot, ink", "--seed", "5", "--steps", "6",
                 "--init-image", str(init), "--strength", "0.5", "--sampler", "Euler a", "--out", str(out))
        self.assertEqual(r.returncode, 0, r.stderr)
        size, s = png_settings(out)
        self.assertEqual(size, (256, 320))
        self.assertEqual((s["Denoising strength"], s["Init image"], s["Sampler"]), ("0.5", init.name, "Euler a"))
        for args, needle in [(["--init-image", str(init), "--width", "320"], "resize the image"),
                             (["--init-image", str(work / "missing.png")], "does not exist"),
                             (["--init-image", str(init), "--strength", "0.1", "--steps", "5"], "--strength leaves no step"),
                             (["--hires-scale", "2", "--hires-denoise", "0.1", "--steps", "5"], "--hires-denoise leaves no step"),
                             (["--sampler", "Euler b"], "\"DPM++ 2M SDE\""),
                             (["--sampler", "DDIM Karras"], "valid: \"Automatic\", \"SGM Uniform\""),
                             (["--hires-scale", "2", "--hires-upscaler", "ESRGAN"], "\"Latent (bicubic)\"")]:
            r = sdxl("generate", "--model", ARGS.model, "--prompt", "x", "--out", str(work / "bad.png"), *args)
            self.assertEqual(r.returncode, 2, f"{args}: {r.stderr}")
            self.assertIn(needle, r.stderr, args)
            self.assertNotIn("loaded", r.stderr, f"{args}: refused after the model loaded")


class ClipSkip(unittest.TestCase):
    """clip_skip in batch files and --clip-skip: PNG parameters, manifest, report, resume, the model's limit."""

    def test_run_records_clip_skip_and_resumes_with_it(self):
        d = Path(ARGS.work) / "clip-skip"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        batch = d / "batch.json"
        batch.write_text(json.dumps({"version": 1, "defaults": {"steps": 2}, "tasks": [
            {"id": "a", "prompt": "a lighthouse", "seed": 1, "clip_skip": 3},
            {"id": "b", "prompt": "a lighthouse", "seed": 1}]}))
        out = d / "out"
        run = ("run", str(batch), "--model", ARGS.model, "--out", str(out))
        r = sdxl(*run, "--clip-skip", "4")  # for the tasks that set none
        self.assertEqual(r.returncode, 0, r.stderr)
        for task, n in (("a", 3), ("b", 4)):
            self.assertIn(f", Clip skip: {n},", parameters(out / f"{task}-0-1.png"))
        lines = read_manifest(out)
        self.assertEqual({line["task"]: line["params"]["clip_skip"] for line in lines}, {"a": 3, "b": 4})
        self.assertEqual(sorted(i["clip_skip"] for i in read_report(out)["images"]), [3, 4])
        r = sdxl(*run, "--clip-skip", "4")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(read_report(out)["images_skipped"], 2)
        r = sdxl(*run)  # task b's clip skip changed: only b is made again
        self.assertEqual(r.returncode, 0, r.stderr)
        report = read_report(out)
        self.assertEqual((report["images_done"], report["images_skipped"]), (1, 1))
        self.assertNotIn("Clip skip", parameters(out / "b-0-1.png"))

    def test_clip_skip_beyond_the_model_is_refused(self):
        model = meta_of(ARGS.model)
        limit = min(te["hidden_states"] for te in model["text_encoders"])
        d = Path(ARGS.work) / "clip-skip-bad"
        d.mkdir(parents=True, exist_ok=True)
        batch = d / "batch.json"
        batch.write_text(json.dumps({"version": 1, "tasks": [
            {"id": "a", "prompt": "x", "clip_skip": limit},
            {"id": "b", "prompt": "x", "clip_skip": limit + 1}]}))
        r = sdxl("validate", str(batch), "--model", ARGS.model)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("/tasks/1/clip_skip", r.stdout + r.stderr)
        self.assertNotIn("/tasks/0/clip_skip", r.stdout + r.stderr)
        self.assertIn(f"1..{limit}", r.stdout + r.stderr)
        r = sdxl("run", str(batch), "--model", ARGS.model, "--out", str(d / "out"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("/tasks/1", r.stderr)
        r = sdxl("generate", "--model", ARGS.model, "--prompt", "x", "--clip-skip", str(limit + 1), "--out",
                 str(d / "x.png"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(f"1..{limit}", r.stderr)
        self.assertFalse((d / "x.png").exists())
        # A model exported before clip skip (no hidden_states recorded) allows only the default layer.
        old = d / "old-model"
        shutil.rmtree(old, ignore_errors=True)
        shutil.copytree(ARGS.model, old)
        for te in model["text_encoders"]:
            del te["hidden_states"]
        (old / "model.json").write_text(json.dumps(model))
        r = sdxl("run", str(batch), "--model", str(old), "--out", str(d / "out-old"), "--clip-skip", "3")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--clip-skip: clip skip 3 needs the text encoders' hidden states", r.stderr)


class Tokens(unittest.TestCase):
    def test_tokens_json(self):
        long_prompt = ", ".join(["a knight in shining armour"] * 30)
        r = sdxl("tokens", "--model", ARGS.model, "--json", f"(a cat:1.5)!! [dog] BREAK {long_prompt} (oops")
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout)
        self.assertEqual(len(out["encoders"]), 2)
        enc = out["encoders"][0]
        self.assertGreaterEqual(enc["chunk_count"], 3)
        first = enc["chunks"][0]
        self.assertEqual(first["ids"][0], 49406)
        self.assertEqual(len(first["ids"]), 77)
        self.assertEqual(first["tokens"][0]["text"], "a</w>")
        self.assertAlmostEqual(first["tokens"][0]["weight"], 1.5, places=5)
        self.assertTrue(any(abs(t["weight"] - 1 / 1.1) < 1e-5 for t in first["tokens"]))
        self.assertTrue(out["warnings"], "the unclosed '(' gives a warning")
        r = sdxl("tokens", "--model", ARGS.model, "a (cat:1.2) BREAK dog")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("cat</w>(1.2)", r.stdout)
        self.assertIn("2 chunk(s)", r.stdout)

    def test_tokens_schedule(self):
        # A1111 prompt editing: the steps of each text (step k uses the first entry with k <= its end,
        # counted from 0), each text's tokens with its own emphasis; a bad `when` is refused (exit 2).
        r = sdxl("tokens", "--model", ARGS.model, "--json", "--steps", "4", "a [(cat:1.2):dog:0.5] [red|blue]")
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout)
        self.assertEqual(out["schedule"], {"steps": 4, "spans": [
            {"first_step": 1, "last_step": 2, "text": "a (cat:1.2) red"},
            {"first_step": 3, "last_step": 3, "text": "a (cat:1.2) blue"},
            {"first_step": 4, "last_step": 4, "text": "a dog red"}]})
        cat = out["texts"][0]["encoders"][0]["chunks"][0]["tokens"][1]
        self.assertEqual((cat["text"], round(cat["weight"], 5)), ("cat</w>", 1.2))
        r = sdxl("tokens", "--model", ARGS.model, "a [cat:dog:soon]")
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("when 'soon' is not a number", r.stderr)


if __name__ == "__main__":
    sys.exit(main(__doc__, "--binary", "--model", "--work", "--source", "--example-ip-adapter", "--example-controlnet"))
