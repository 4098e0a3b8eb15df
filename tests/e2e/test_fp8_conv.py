#!/usr/bin/env python3
"""export_sdxl.py --fp8 --fp8-conv on the tiny model (CPU), end to end: the Python steps of
bench/fp8_conv_e2e.sh that need no GPU, and sdxl-batch on the export.

- the export (--check none, two calibration prompts x 2 steps: the calibration's own test is
  parity_fp8_cpu) quantises the tiny UNet's 38 3x3 convolutions and records unet.fp8.conv;
  unet_fp8.ts holds each as an e4m3 weight in nn.Conv2d's layout, a per-output-channel
  weight_scale [Cout, 1, 1, 1] and an input_scale, and no call of the op (the TorchScript path);
- sdxl-batch --precision fp8 runs unet_fp8.ts as it is (no C++ change for the convolutions):
  two panels, and the first again with a LoCon LoRA that patches FP8 convolutions (the LoRA
  patcher requantises them per channel), which must change the image;
- bench/fp8_conv_summary.py on those runs and a --precision default run: speed rows, PSNR/SSIM
  against the model-dtype images (finite, above 25 dB), the export's conv layers.
"""
from __future__ import annotations

import json
import subprocess
import sys
import unittest
from pathlib import Path

from e2e_common import ARGS, main, read_manifest, sdxl

import torch


class Fp8ConvExport(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        work = Path(ARGS.work)
        cls.model = work / "tiny-fp8conv"
        prompts = work / "prompts.txt"
        prompts.write_text("a comic panel, a lighthouse in a storm\na comic panel, a robot reading\n")
        cmd = [sys.executable, str(Path(ARGS.source) / "scripts" / "export_sdxl.py"), "--tiny", "--fp8", "--fp8-conv",
               "--fp8-prompts", str(prompts), "--fp8-steps", "2", "--check", "none", "--out", str(cls.model), "--force"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        cls.export_log = p.stdout + p.stderr
        if p.returncode:
            raise AssertionError(f"export failed ({p.returncode}): {cls.export_log[-2000:]}")
        lora = Path(ARGS.loras) / "locon.safetensors"
        panels = [{"id": f"p{i}", "prompt": f"comic panel {i}, a robot in the rain", "seed": 500 + i} for i in range(2)]
        defaults = {"steps": 4, "cfg": 5.0, "width": 128, "height": 128, "negative": "blurry"}
        (work / "panels.json").write_text(json.dumps({"version": 1, "defaults": defaults, "tasks": panels}))
        (work / "panels-locon.json").write_text(json.dumps({
            "version": 1, "defaults": defaults, "loras": {"locon": {"path": str(lora)}},
            "tasks": panels + [{"id": "locon", "prompt": "comic panel 0, a robot in the rain <lora:locon:1.0>",
                                "seed": 500}]}))
        cls.runs = {}
        for name, batch, precision in (("fp8conv", "panels-locon.json", "fp8"), ("default", "panels.json", "default")):
            out = work / f"run-{name}"
            r = sdxl("run", str(work / batch), "--model", str(cls.model), "--device", "cpu", "--out", str(out),
                     "--precision", precision, "--no-progress", "--force")
            cls.runs[name] = (r, out)

    def test_export_records_the_convolutions(self):
        meta = json.loads((self.model / "model.json").read_text())["unet"]["fp8"]
        self.assertEqual(meta["conv"]["layers"], 38, meta)
        self.assertEqual(meta["conv"]["op"], "sdxl::fp8_conv3x3")
        self.assertIn("38 3x3 convolutions quantised", self.export_log)
        ts = torch.jit.load(str(self.model / "unet_fp8.ts"), map_location="cpu")
        bufs = dict(ts.named_buffers())
        params = dict(ts.named_parameters())
        conv_scales = {k: v for k, v in bufs.items() if k.endswith(".weight_scale") and v.dim() == 4}
        self.assertEqual(len(conv_scales), 38)
        for k, s in conv_scales.items():
            layer = k[: -len(".weight_scale")]
            w = params[layer + ".weight"]
            self.assertEqual((w.dtype, w.dim(), tuple(s.shape)), (torch.float8_e4m3fn, 4, (w.shape[0], 1, 1, 1)), k)
            self.assertEqual(bufs[layer + ".input_scale"].dim(), 0)
        graph = str(ts.inlined_graph)
        self.assertNotIn("fp8_conv3x3", graph)  # the TorchScript path: torch ops only

    def test_sdxl_batch_runs_it_with_and_without_a_locon(self):
        for name, (r, out) in self.runs.items():
            self.assertEqual(r.returncode, 0, f"{name}: {r.stderr[-1500:]}")
        man = {(l["task"], l["index"]): l for l in read_manifest(self.runs["fp8conv"][1])}
        self.assertEqual(len(man), 3)
        self.assertNotEqual(man[("p0", 0)]["sha256"], man[("locon", 0)]["sha256"], "the LoCon changed nothing")

    def test_summary_script(self):
        work = Path(ARGS.work)
        cmd = [sys.executable, str(Path(ARGS.source) / "bench" / "fp8_conv_summary.py"),
               "--run", f"fp8conv={self.runs['fp8conv'][1]}", "--run", f"default={self.runs['default'][1]}",
               "--pair", "fp8conv:default", "--export", f"fp8conv={self.model}", "--json", str(work / "summary.json"),
               "--md", str(work / "summary.md")]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr[-1500:])
        s = json.loads((work / "summary.json").read_text())
        pair = s["pairs"]["fp8conv vs default"]
        print(f"\nfp8conv vs default: {pair['images']} images, PSNR mean {pair['psnr_db_mean']} dB "
              f"(min {pair['psnr_db_min']}), SSIM mean {pair['ssim_mean']}")
        self.assertEqual(pair["images"], 2)
        self.assertGreater(pair["psnr_db_min"], 25.0)
        self.assertEqual(s["exports"]["fp8conv"]["conv_layers"], 38)
        self.assertEqual(s["runs"]["fp8conv"]["images"], 3)
        self.assertIn("### Fidelity", (work / "summary.md").read_text())


if __name__ == "__main__":
    sys.exit(main(__doc__, "--binary", "--work", "--source", "--loras"))
