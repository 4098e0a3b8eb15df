#!/usr/bin/env python3
"""The AOTInductor UNet backend end to end (ctest labels e2e, slow): export the tiny-aoti
model (export_sdxl.py --tiny-aoti: the tiny model with one resnet and one transformer layer
per UNet block) with --aoti (torch.export + aoti_compile_and_package, C++ compiled for the
CPU; the export records its check of the package), then generate with
--unet-backend aoti and torchscript and compare; the
same with a LoRA (its change to the aoti image must be the change it makes to the
torchscript image); switching a LoRA on and off inside one aoti run; clear errors
for a model without unet.pt2 and for a dtype it was not compiled for. The VAE
decoder's package (vae_decoder.pt2, one image size): its export check, its image
against vae_decoder.ts's, an image of another size decoded by vae_decoder.ts in the
same run, VAE folders decoded on it with their own weights, and its errors; a package compiled
without always_keep_tensor_constants (as before 2026-12-05, exported here for that: about 30 s),
which holds some tensors in its code: a VAE folder differing in one decodes on its own trace.

Tolerance: both backends run the same fp32 weights, but AOTInductor's generated
C++ kernels fuse the UNet's ops, so sums are taken in another order
(about 1e-6 relative per call). After 3 sampler steps and the VAE this moves at
most a few 8-bit pixel levels: the images must agree within MAX_LEVELS levels
and PSNR >= MIN_PSNR dB (identical images: inf); measured: max 1 level, 90 dB.
The test LoRA (kohya_unet at 0.8) moves the model's image by about 7 levels on
average and up to 98, far more than the backends differ; its change on aoti
must equal its change on torchscript within that tolerance. The test LoRAs are made
for the tiny-aoti architecture (reference.make_test_loras --arch tiny-aoti, in --work).

The package is compiled with the Inductor configs of AOTI_CONFIGS, which cut the CPU
compile (measured in docs/developing.md#test-times) and change nothing the test checks:
the C++ kernels scalar (cpp.simdlen=1: no vectorised loops, whose tiling analysis took
about a quarter of Inductor's time, in sympy), the wrapper compiled at -O0 (as the GPU
benchmarks export it). model.json records them (unet.aoti.inductor_configs). What the
package runs on the GPU is Triton code, which neither config touches.

    test_aoti.py --export DIR --python PY --source REPO     (the ctest fixture tiny_aoti: the export alone)
    test_aoti.py --binary B --python PY --source REPO --plain-model DIR --work DIR [--model-dir DIR]

The export (torch.export and AOTInductor's C++ compile: minutes on a 2-core machine) is a
fixture of its own, so that ctest starts it at once, beside the tiny model's export, and not
after the fixtures the image tests need; without --model-dir the test makes its own.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import unittest
from pathlib import Path

import numpy as np
from e2e_common import ARGS, main, pixels, python, read_report, sdxl

from reference.compare_images import psnr

COMMON = ["--seed", "11", "--steps", "3", "--cfg", "5", "--width", "256", "--height", "256", "--threads", "1"]
MAX_LEVELS = 3
MIN_PSNR = 45.0


# The tiny export's images per UNet call: not the default 8, so the package's row range must follow it.
TINY_BATCH_MAX = 3
# Inductor configs of the test's packages (the module docstring says why).
AOTI_CONFIGS = ["cpp.simdlen=1", "aot_inductor.compile_wrapper_opt_level=O0"]


def diffusers_copy(model: Path) -> Path:
    """Where export_tiny_aoti saves the model's diffusers copy (its VAE is the folder VAE's source)."""
    return model.parent / f"{model.name}-diffusers"


def tensor_count(ts: Path) -> int:
    """The parameters and buffers of a TorchScript file."""
    count = ("import sys, torch; m = torch.jit.load(sys.argv[1]); "
             "print(len(dict(m.named_parameters())) + len(dict(m.named_buffers())))")
    return int(python("-c", count, str(ts), what=f"count {ts.name}'s tensors").stdout.split()[-1])


def vae_folder_batch(vaes: Path) -> dict:
    """Three 256x256 images of one prompt and seed: the model's VAE, then Aoti.vae_folders's two folders."""
    return {"version": 1, "defaults": {"steps": 2, "width": 256, "height": 256},
            "tasks": [{"id": "own", "prompt": "a red door", "seed": 5},
                      {"id": "folder", "prompt": "a red door", "seed": 5, "vae": str(vaes / "vae")},
                      {"id": "bias", "prompt": "a red door", "seed": 5, "vae": str(vaes / "vae-bias")}]}


def export_tiny_aoti(out: Path) -> float:
    """The tiny-aoti model with unet.pt2 and vae_decoder.pt2, and its diffusers copy beside it;
    returns the seconds of the AOTI part (export + compile + check)."""
    cmd = [ARGS.python, str(Path(ARGS.source) / "scripts" / "export_sdxl.py"), "--tiny-aoti", "--out", str(out),
           "--check", "none", "--aoti", "--batch-max", str(TINY_BATCH_MAX), "--force",
           "--save-diffusers", str(diffusers_copy(out))]
    cmd += [arg for kv in AOTI_CONFIGS for arg in ("--aoti-config", kv)]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3000)
    if r.returncode != 0:
        raise RuntimeError(f"export failed ({time.time() - t0:.0f}s): {r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    for line in r.stdout.splitlines():
        if "torch.export unet" in line or "aoti_compile_and_package" in line or "check unet.pt2" in line \
                or line.strip().startswith("build "):
            print(line, flush=True)
    meta = json.loads((out / "model.json").read_text())
    print(f"tiny-aoti export with --aoti: {time.time() - t0:.1f}s wall; unet.aoti = {json.dumps(meta['unet']['aoti'])}",
          flush=True)
    return sum(meta["unet"]["aoti"]["seconds"].values())


class Aoti(unittest.TestCase):
    model: Path

    @classmethod
    def setUpClass(cls):
        cls.work = Path(ARGS.work)
        if ARGS.model_dir:  # made by --export, i.e. by export_tiny_aoti
            cls.model = Path(ARGS.model_dir)
        else:
            cls.model = cls.work / "tiny-aoti"
            export_tiny_aoti(cls.model)
        cls.out = cls.work / "images"
        shutil.rmtree(cls.out, ignore_errors=True)
        cls.out.mkdir(parents=True)
        cls.loras = cls.work / "loras"  # LoRA files that fit the tiny-aoti UNet (seconds)
        python("-m", "reference.make_test_loras", "--arch", "tiny-aoti", "--out", cls.loras,
               what="make_test_loras --arch tiny-aoti")

    def gen(self, name: str, backend: str, *extra: str) -> np.ndarray:
        png = self.out / f"{name}-{backend}.png"
        if not png.exists():
            t0 = time.time()
            r = sdxl("generate", "--model", str(self.model), "--prompt", "a lighthouse in a storm", *COMMON,
                     "--unet-backend", backend, "--out", str(png), *extra)
            self.assertEqual(r.returncode, 0, r.stderr)
            if backend == "aoti":
                self.assertIn("UNet backend aoti", r.stderr)
                self.assertNotIn("run on unet.ts", r.stderr)  # 256x256 is inside the compiled ranges
            print(f"  {png.name}: {time.time() - t0:.1f}s", flush=True)
        return pixels(png)

    def assertClose(self, a: np.ndarray, b: np.ndarray, what: str):
        diff = int(np.abs(a - b).max())
        p = psnr(a, b)
        print(f"  {what}: max |diff| {diff} levels, PSNR {p:.1f} dB", flush=True)
        self.assertLessEqual(diff, MAX_LEVELS, what)
        self.assertGreaterEqual(p, MIN_PSNR, what)

    def test_export_records_the_package_check_at_the_corners_of_its_range(self):
        checks = json.loads((self.model / "model.json").read_text())["unet"]["aoti"].get("checks")
        self.assertTrue(checks, "model.json unet.aoti.checks is missing")
        corners = {(c["rows"], c["latent_h"], c["latent_w"], c["tokens"]) for c in checks}
        self.assertEqual(len(corners), 4, checks)
        meta = json.loads((self.model / "model.json").read_text())  # exported with --batch-max TINY_BATCH_MAX
        self.assertEqual(meta["limits"]["batch_max"], TINY_BATCH_MAX)
        self.assertEqual(meta["unet"]["aoti"]["rows"], [1, 2 * TINY_BATCH_MAX], "CFG doubles the rows")
        self.assertEqual(max(c["rows"] for c in checks), 2 * TINY_BATCH_MAX)
        for c in checks:  # fp32 on the CPU: the package equals the eager UNet up to summation order
            self.assertTrue(c["ok"], c)
            self.assertLess(c["rel_l2"], 1e-4, c)

    def test_aoti_image_matches_torchscript(self):
        self.assertClose(self.gen("base", "aoti"), self.gen("base", "torchscript"), "aoti vs torchscript")

    def test_lora_changes_aoti_image_as_it_changes_torchscript_image(self):
        lora = ["--lora", str(self.loras / "kohya_unet.safetensors") + ":0.8"]
        ts_base, ts_lora = self.gen("base", "torchscript"), self.gen("lora", "torchscript", *lora)
        ao_base, ao_lora = self.gen("base", "aoti"), self.gen("lora", "aoti", *lora)
        ts_change = ts_lora - ts_base
        ao_change = ao_lora - ao_base
        moved, moved_max = float(np.abs(ts_change).mean()), int(np.abs(ts_change).max())
        off = float(np.abs(ao_change - ts_change).mean())
        print(f"  the LoRA moves the torchscript image by {moved:.2f} levels on average (max {moved_max}); "
              f"its change on aoti differs by {off:.4f} levels on average "
              f"(max {int(np.abs(ao_change - ts_change).max())})", flush=True)
        # The LoRA must move the image well beyond the backends' tolerance, or the comparison says nothing.
        self.assertGreater(moved_max, 5 * MAX_LEVELS, "the test LoRA barely changes the image")
        self.assertGreater(moved, 1.0, "the test LoRA barely changes the image")
        self.assertClose(ao_lora, ts_lora, "aoti+LoRA vs torchscript+LoRA")
        self.assertFalse(np.array_equal(ao_lora, ao_base), "the LoRA did not reach the aoti UNet")
        self.assertLessEqual(int(np.abs(ao_change - ts_change).max()), 2 * MAX_LEVELS, "LoRA change differs")
        self.assertLess(off, 0.05 * moved, "the LoRA changes the aoti image otherwise than the torchscript one")

    def test_switching_lora_off_in_one_aoti_run_restores_the_base_image(self):
        work = self.work / "switch"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        prompt = "a red door"
        batch = {"version": 1, "defaults": {"steps": 3, "width": 256, "height": 256},
                 "tasks": [{"id": "a-base", "prompt": prompt, "seed": 5},
                           {"id": "b-lora", "prompt": prompt, "seed": 5,
                            "loras": [{"path": str(self.loras / "locon.safetensors"), "weight": 1.0}]},
                           {"id": "c-base", "prompt": prompt, "seed": 5}]}
        cfg = work / "switch.json"
        cfg.write_text(json.dumps(batch))
        out = work / "out"
        r = sdxl("run", str(cfg), "--model", str(self.model), "--out", str(out), "--threads", "1",
                 "--order", "file", "--unet-backend", "aoti")
        self.assertEqual(r.returncode, 0, r.stderr)
        a, b, c = (pixels(out / f"{t}-0-5.png") for t in ("a-base", "b-lora", "c-base"))
        self.assertFalse(np.array_equal(a, b), "the LoRA did not reach the aoti UNet")
        self.assertTrue(np.array_equal(a, c), "the base image after a LoRA differs: the aoti constants drifted")

    def test_default_backend_runs_the_package_when_it_fits(self):
        # --unet-backend auto (the default): the package where it was compiled for
        # this device and dtype, the TorchScript UNet otherwise (no error).
        png = self.out / "auto.png"
        r = sdxl("generate", "--model", str(self.model), "--prompt", "a lighthouse in a storm", *COMMON,
                 "--out", str(png))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--unet-backend auto: aoti", r.stderr)
        self.assertTrue(np.array_equal(pixels(png), self.gen("base", "aoti")), "auto made another image than aoti")
        r = sdxl("generate", "--model", str(self.model), "--prompt", "x", *COMMON, "--dtype", "bf16",
                 "--out", str(self.out / "auto-bf16.png"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--unet-backend auto: torchscript (unet.pt2 was compiled for fp32, the model runs in bf16", r.stderr)

    def test_model_without_package_is_a_clear_error(self):
        r = sdxl("generate", "--model", ARGS.plain_model, "--prompt", "x", *COMMON, "--unet-backend", "aoti",
                 "--out", str(self.out / "never.png"))
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("has no unet.pt2", r.stderr)
        self.assertIn("export_sdxl.py --aoti", r.stderr)

    def test_other_dtype_than_compiled_is_a_clear_error(self):
        r = sdxl("generate", "--model", str(self.model), "--prompt", "x", *COMMON, "--unet-backend", "aoti",
                 "--dtype", "bf16", "--out", str(self.out / "never.png"))
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("was compiled for fp32, the model runs in bf16", r.stderr)

    def test_export_records_the_vae_package_and_its_check(self):
        vae = json.loads((self.model / "model.json").read_text())["vae_decoder"].get("aoti")
        self.assertTrue(vae, "model.json has no vae_decoder.aoti")
        self.assertEqual((vae["file"], vae["rows"], vae["latent_height"], vae["latent_width"]),
                         ("vae_decoder.pt2", [1, 1], [32, 32], [32, 32]))  # the tiny model's default 256x256
        self.assertTrue((self.model / "vae_decoder.pt2").is_file())
        self.assertEqual(len(vae["checks"]), 1, vae)
        self.assertTrue(vae["checks"][0]["ok"], vae)
        self.assertLess(vae["checks"][0]["rel_l2"], 1e-4, vae)

    def test_packages_take_every_tensor_as_a_constant(self):
        # No parameter or buffer compiled into a package's code: LoRAs reach every UNet tensor, and a
        # VAE folder's every tensor reaches the model's decoder package.
        meta = json.loads((self.model / "model.json").read_text())
        for key, ts in (("unet", "unet.ts"), ("vae_decoder", "vae_decoder.ts")):
            self.assertEqual(meta[key]["aoti"]["constants"], tensor_count(self.model / ts),
                             f"{key}: tensors compiled into the package")
            self.assertTrue(meta[key]["aoti"]["inductor_configs"].get("always_keep_tensor_constants"), meta[key]["aoti"])

    def test_vae_package_image_matches_vae_torchscript(self):
        ts = self.gen("vae-ts", "torchscript", "--vae-backend", "torchscript")
        png = self.out / "vae-aoti.png"
        r = sdxl("generate", "--model", str(self.model), "--prompt", "a lighthouse in a storm", *COMMON,
                 "--unet-backend", "torchscript", "--vae-backend", "aoti", "--out", str(png))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("VAE decoder backend aoti: vae_decoder.pt2", r.stderr)
        self.assertClose(pixels(png), ts, "vae_decoder.pt2 vs vae_decoder.ts")

    def test_vae_package_decodes_its_size_and_the_trace_decodes_others(self):
        work = self.work / "vae-sizes"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        batch = {"version": 1, "defaults": {"steps": 2},
                 "tasks": [{"id": "square", "prompt": "a red door", "seed": 5, "width": 256, "height": 256},
                           {"id": "wide", "prompt": "a red door", "seed": 5, "width": 320, "height": 256}]}
        cfg = work / "sizes.json"
        cfg.write_text(json.dumps(batch))
        r = sdxl("run", str(cfg), "--model", str(self.model), "--out", str(work / "out"), "--threads", "1",
                 "--vae-backend", "aoti")
        self.assertEqual(r.returncode, 0, r.stderr)
        report = read_report(work / "out")
        self.assertEqual(report["images_done"], 2, report)
        self.assertEqual(report["devices"][0]["engine"]["vae_aoti_decodes"], 1, report["devices"][0]["engine"])
        self.assertEqual(pixels(work / "out" / "wide-0-5.png").shape, (256, 320, 3))

    @classmethod
    def vae_folders(cls) -> Path:
        """Two VAE folders of the tiny-aoti architecture with other weights than the model's, made once a test run:
        vae/ (the model's own VAE, its last convolution's weight scaled; export_sdxl.py --vae-only from a
        diffusers VAE folder) and vae-bias/ (the same with conv_out.bias moved too: a tensor that a
        package compiled without always_keep_tensor_constants holds in its code). Returns their folder."""
        work = (cls.work / "vae-folders").resolve()
        if getattr(cls, "_vae_folders_made", False):
            return work
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        src = diffusers_copy(cls.model) / "vae"
        make = ("import sys, torch; from diffusers import AutoencoderKL; v = AutoencoderKL.from_pretrained(sys.argv[1]); "
                "v.decoder.conv_out.weight.data.mul_(1.5); v.save_pretrained(sys.argv[2]); "
                "v.decoder.conv_out.bias.data.add_(0.2); v.save_pretrained(sys.argv[3])")
        r = subprocess.run([ARGS.python, "-c", make, str(src), str(work / "vae-src"), str(work / "vae-bias-src")],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        for name in ("vae", "vae-bias"):
            r = subprocess.run([ARGS.python, str(Path(ARGS.source) / "scripts" / "export_sdxl.py"), "--vae-only",
                                "--vae", str(work / f"{name}-src"), "--dtype", "fp32", "--out", str(work / name),
                                "--force"], capture_output=True, text=True, timeout=900)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        cls._vae_folders_made = True
        return work

    def test_vae_folder_decodes_on_the_models_package_with_its_own_weights(self):
        # Both folders decode on the package with their own weights, as their traces do.
        vaes = self.vae_folders()
        work = (self.work / "vae-folder").resolve()
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        batch = vae_folder_batch(vaes)
        cfg = work / "folder.json"
        cfg.write_text(json.dumps(batch))
        images = {}
        for backend in ("aoti", "torchscript"):
            out = work / backend
            r = sdxl("run", str(cfg), "--model", str(self.model), "--out", str(out), "--threads", "1",
                     "--order", "file", "--vae-backend", backend)
            self.assertEqual(r.returncode, 0, r.stderr)
            engine = read_report(out)["devices"][0].get("engine", {})
            if backend == "aoti":
                for name in ("vae", "vae-bias"):
                    self.assertIn(f"VAE '{vaes / name}' decodes on the model's vae_decoder.pt2 with its own weights",
                                  r.stderr)
                self.assertEqual((engine.get("vae_aoti_decodes"), engine.get("vae_folder_aoti_decodes")), (1, 2), engine)
            else:
                self.assertNotIn("vae_folder_aoti_decodes", engine)
            images[backend] = {t: pixels(out / f"{t}-0-5.png") for t in ("own", "folder", "bias")}
        self.assertClose(images["aoti"]["folder"], images["torchscript"]["folder"], "folder VAE: package vs trace")
        self.assertClose(images["aoti"]["bias"], images["torchscript"]["bias"], "bias-moved VAE: package vs trace")
        moved = int(np.abs(images["aoti"]["folder"] - images["aoti"]["own"]).max())
        self.assertGreater(moved, 5 * MAX_LEVELS, "the folder's weights did not reach the package")
        moved = int(np.abs(images["aoti"]["bias"] - images["aoti"]["folder"]).max())
        self.assertGreater(moved, 5 * MAX_LEVELS, "the moved bias did not change the image")

    def test_older_vae_package_leaves_a_folder_differing_in_its_compiled_in_tensors_to_the_trace(self):
        # A model whose vae_decoder.pt2 was compiled without always_keep_tensor_constants, as packages were
        # before 2026-12-05 (made here with --aoti-config always_keep_tensor_constants=False): Inductor holds
        # 15 of the tiny decoder's 106 tensors in the package's code, conv_out.bias among them. A folder that
        # differs from the model only in tensors the package takes decodes on the package; one that differs
        # in a tensor held in the code decodes on its own trace, and the log names the tensor.
        vaes = self.vae_folders()
        work = (self.work / "older-vae-package").resolve()
        model = work / "model"
        shutil.rmtree(work, ignore_errors=True)
        cmd = [ARGS.python, str(Path(ARGS.source) / "scripts" / "export_sdxl.py"), "--tiny-aoti", "--out", str(model),
               "--check", "none", "--aoti", "--aoti-variants", "vae", "--batch-max", str(TINY_BATCH_MAX), "--force"]
        cmd += [arg for kv in AOTI_CONFIGS + ["always_keep_tensor_constants=False"] for arg in ("--aoti-config", kv)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-2000:])
        constants = json.loads((model / "model.json").read_text())["vae_decoder"]["aoti"]["constants"]
        self.assertLess(constants, tensor_count(model / "vae_decoder.ts"),
                        "the package holds no tensor in its code: nothing to test")
        batch = vae_folder_batch(vaes)
        cfg = work / "folder.json"
        cfg.write_text(json.dumps(batch))
        r = sdxl("run", str(cfg), "--model", str(model), "--out", str(work / "aoti"), "--threads", "1",
                 "--order", "file", "--vae-backend", "aoti", "--force")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"VAE '{vaes / 'vae'}' decodes on the model's vae_decoder.pt2 with its own weights", r.stderr)
        self.assertIn(f"VAE '{vaes / 'vae-bias'}' decodes on its vae_decoder.ts, not on the model's vae_decoder.pt2: "
                      "its 'decoder.conv_out.bias' differs from the model's, which vae_decoder.pt2 holds compiled in",
                      r.stderr)
        engine = read_report(work / "aoti")["devices"][0].get("engine", {})
        self.assertEqual((engine.get("vae_aoti_decodes"), engine.get("vae_folder_aoti_decodes")), (1, 1), engine)
        batch["tasks"] = batch["tasks"][2:]
        cfg.write_text(json.dumps(batch))
        r = sdxl("run", str(cfg), "--model", str(model), "--out", str(work / "trace"), "--threads", "1",
                 "--vae-backend", "torchscript", "--force")
        self.assertEqual(r.returncode, 0, r.stderr)
        same = np.array_equal(pixels(work / "aoti" / "bias-0-5.png"), pixels(work / "trace" / "bias-0-5.png"))
        self.assertTrue(same, "the bias-moved folder's image is not its trace's")

    def test_vae_backend_errors_name_the_cause(self):
        r = sdxl("generate", "--model", ARGS.plain_model, "--prompt", "x", *COMMON, "--vae-backend", "aoti",
                 "--out", str(self.out / "never.png"))
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("has no vae_decoder.pt2", r.stderr)
        r = sdxl("generate", "--model", str(self.model), "--prompt", "x", *COMMON, "--vae-backend", "aoti",
                 "--vae-dtype", "bf16", "--out", str(self.out / "never.png"))
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("vae_decoder.pt2 was compiled to decode in fp32, the VAE decodes in bf16", r.stderr)
        r = sdxl("generate", "--model", str(self.model), "--prompt", "x", *COMMON, "--vae-dtype", "bf16",
                 "--out", str(self.out / "auto-vae-bf16.png"))  # auto: falls back, says why
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("VAE decoder backend torchscript (vae_decoder.ts): vae_decoder.pt2 was compiled to decode in fp32",
                      r.stderr)

    def test_unknown_backend_is_refused(self):
        r = sdxl("generate", "--model", str(self.model), "--prompt", "x", "--unet-backend", "tensorrt")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--unet-backend", r.stderr)


def options(ap) -> None:
    ap.add_argument("--plain-model", required=True, help="a model directory without unet.pt2")
    ap.add_argument("--model-dir", help="the export of --export (the fixture tiny_aoti) instead of making one")


def export_only() -> int:
    """--export DIR: the fixture's part, export_tiny_aoti into DIR."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--export", required=True, metavar="DIR", help="export the tiny model with --aoti here and exit")
    ap.add_argument("--python", required=True)
    ap.add_argument("--source", required=True)
    ARGS.__dict__.update(vars(ap.parse_args()))
    export_tiny_aoti(Path(ARGS.export))
    return 0


if __name__ == "__main__":
    if "--export" in sys.argv:
        sys.exit(export_only())
    sys.exit(main(__doc__, "--binary", "--python", "--source", "--work", extra=options))
