#!/usr/bin/env python3
"""export_sdxl.py --fp8 --fp8-conv --fp8-geglu on the tiny model (CPU), end to end: the Python steps
of bench/fp8_conv_e2e.sh that need no GPU, and sdxl-batch on the export. One export for both flags.

- the export (--check none, two calibration prompts x 2 steps: the calibration's own test is
  parity_fp8_cpu) quantises the tiny UNet's 38 3x3 convolutions and records unet.fp8.conv;
  unet_fp8.ts holds each as an e4m3 weight in nn.Conv2d's layout, a per-output-channel
  weight_scale [Cout, 1, 1, 1] and an input_scale, and no call of the op (the TorchScript path);
- --fp8-geglu fuses every transformer feed-forward (the tiny UNet's 17) and records unet.fp8.geglu:
  unet_fp8.ts's feed-forwards are the fused module (traced from fp8_geglu's Fp8GegluFeedForward, no
  call of the op), its FP8 layers are exactly the contract's (reference.fp8_reference: the same
  names as without the fusion, so LoRAs and the AOTI package's constants find them), and it computes
  the unfused contract: unet_fp8.ts == diffusers' UNet with reference.fp8_reference's emulation of
  the FP8 linear layers and convolutions, forward and forward_control, max |diff| <= 1e-4 x max |ref|
  as parity_fp8's (measured: 0; the traced fused module runs the unfused layers, fp8_geglu's
  docstring says why, so a LoRA patches the same math there as in an unfused export);
- --fp8-geglu without --fp8 is refused (exit 2, naming both) before torch is imported;
- sdxl-batch --precision fp8 runs unet_fp8.ts as it is (no C++ change for the convolutions or
  the fused feed-forwards): two panels, the first again with a LoCon LoRA that patches FP8
  convolutions (the LoRA patcher requantises them per channel), and again with a LoRA of the
  feed-forwards alone (kohya_unet_dn's ff.net.0.proj / ff.net.2 keys, --strict-lora: every key
  finds its weight in the fused module); each LoRA must change the image;
- bench/fp8_conv_summary.py on those runs and a --precision default run: speed rows, PSNR/SSIM
  against the model-dtype images (finite, above 25 dB), the export's conv layers.
"""
from __future__ import annotations

import json
import subprocess
import sys
import unittest
from pathlib import Path

from e2e_common import ARGS, main, meta_of, read_manifest, sdxl

import torch
from safetensors.torch import load_file, save_file


class Fp8ConvExport(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        work = Path(ARGS.work)
        cls.model = work / "tiny-fp8conv"
        prompts = work / "prompts.txt"
        prompts.write_text("a comic panel, a lighthouse in a storm\na comic panel, a robot reading\n")
        cmd = [sys.executable, str(Path(ARGS.source) / "scripts" / "export_sdxl.py"), "--tiny", "--fp8", "--fp8-conv",
               "--fp8-geglu", "--fp8-prompts", str(prompts), "--fp8-steps", "2", "--check", "none",
               "--out", str(cls.model), "--force"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        cls.export_log = p.stdout + p.stderr
        if p.returncode:
            raise AssertionError(f"export failed ({p.returncode}): {cls.export_log[-2000:]}")
        lora = Path(ARGS.loras) / "locon.safetensors"
        dn = load_file(str(Path(ARGS.loras) / "kohya_unet_dn.safetensors"))
        ff = {k: v for k, v in dn.items() if "_ff_net_" in k}
        save_file(ff, str(work / "ff.safetensors"))
        cls.ff_keys = len(ff)
        panels = [{"id": f"p{i}", "prompt": f"comic panel {i}, a robot in the rain", "seed": 500 + i} for i in range(2)]
        defaults = {"steps": 4, "cfg": 5.0, "width": 128, "height": 128, "negative": "blurry"}
        (work / "panels.json").write_text(json.dumps({"version": 1, "defaults": defaults, "tasks": panels}))
        (work / "panels-locon.json").write_text(json.dumps({
            "version": 1, "defaults": defaults,
            "loras": {"locon": {"path": str(lora)}, "ff": {"path": str(work / "ff.safetensors")}},
            "tasks": panels + [{"id": "locon", "prompt": "comic panel 0, a robot in the rain <lora:locon:1.0>",
                                "seed": 500},
                               {"id": "ff", "prompt": "comic panel 0, a robot in the rain <lora:ff:1.0>",
                                "seed": 500}]}))
        cls.ts = torch.jit.load(str(cls.model / "unet_fp8.ts"), map_location="cpu")  # loaded once (1.5 s)
        cls.graph = str(cls.ts.inlined_graph)
        cls.tensors = {n: t.detach() for n, t in list(cls.ts.named_parameters()) + list(cls.ts.named_buffers())}
        cls.runs = {}
        for name, batch, precision in (("fp8conv", "panels-locon.json", "fp8"), ("default", "panels.json", "default")):
            out = work / f"run-{name}"
            r = sdxl("run", str(work / batch), "--model", str(cls.model), "--device", "cpu", "--out", str(out),
                     "--precision", precision, "--no-progress", "--force", "--strict-lora")
            cls.runs[name] = (r, out)

    def test_export_records_the_convolutions(self):
        meta = json.loads((self.model / "model.json").read_text())["unet"]["fp8"]
        self.assertEqual(meta["conv"]["layers"], 38, meta)
        self.assertEqual(meta["conv"]["op"], "sdxl::fp8_conv3x3")
        self.assertIn("38 3x3 convolutions quantised", self.export_log)
        ts = self.ts
        bufs = dict(ts.named_buffers())
        params = dict(ts.named_parameters())
        conv_scales = {k: v for k, v in bufs.items() if k.endswith(".weight_scale") and v.dim() == 4}
        self.assertEqual(len(conv_scales), 38)
        for k, s in conv_scales.items():
            layer = k[: -len(".weight_scale")]
            w = params[layer + ".weight"]
            self.assertEqual((w.dtype, w.dim(), tuple(s.shape)), (torch.float8_e4m3fn, 4, (w.shape[0], 1, 1, 1)), k)
            self.assertEqual(bufs[layer + ".input_scale"].dim(), 0)
        graph = self.graph
        self.assertNotIn("fp8_conv3x3", graph)  # the TorchScript path: torch ops only

    def test_export_fuses_the_feed_forwards(self):
        from reference.architecture import sdxl_configs
        from reference.fp8_reference import contract_layer_names, fp8_layer_names

        meta = json.loads((self.model / "model.json").read_text())["unet"]["fp8"]
        from diffusers import UNet2DConditionModel
        from diffusers.models.attention import FeedForward

        unet = UNet2DConditionModel(**sdxl_configs("tiny")["unet"]).eval()
        n_ff = sum(isinstance(m, FeedForward) for m in unet.modules())
        self.assertEqual((n_ff, meta["geglu"]["layers"]), (17, 17), meta)
        self.assertEqual((meta["geglu"]["op"], meta["geglu"]["kernel"]), ("sdxl::fp8_geglu", "ptr"))
        self.assertIn("17 feed-forwards' GEGLU fused into their first GEMM", self.export_log)
        kinds = {n: m.original_name for n, m in self.ts.named_modules() if n.endswith(".ff")}
        self.assertEqual(sorted(set(kinds.values())), ["Fp8GegluFeedForward"], kinds)
        self.assertEqual(len(kinds), n_ff)
        self.assertFalse("sdxl::fp8_geglu" in self.graph, "an op call in the TorchScript path")
        tensors = self.tensors
        linear = [n for n in fp8_layer_names(tensors) if tensors[n + ".weight"].dim() == 2]
        self.assertEqual(linear, contract_layer_names(unet))  # the unfused export's layers and names
        for n in kinds:
            self.assertEqual(tensors[f"{n}.net.0.proj.weight"].shape[0], 2 * tensors[f"{n}.net.2.weight"].shape[1])

    def test_unet_fp8_ts_computes_the_unfused_contract(self):
        from reference.architecture import sdxl_configs
        from reference.fp8_reference import emulate_fp8_unet, fp8_layer_names
        from diffusers import UNet2DConditionModel

        tensors = self.tensors
        unet = UNet2DConditionModel(**sdxl_configs("tiny")["unet"]).eval()
        quantised = {f"{n}.{t}" for n in fp8_layer_names(tensors) for t in ("weight", "weight_scale", "input_scale")}
        rest = {k: v for k, v in tensors.items() if k not in quantised}
        missing, unexpected = unet.load_state_dict(rest, strict=False)
        self.assertEqual((unexpected, [k for k in missing if k not in quantised]), ([], []))
        self.assertEqual(len(emulate_fp8_unet(unet, tensors)), len(fp8_layer_names(tensors)))
        u = meta_of(self.model)["unet"]
        gen = torch.Generator().manual_seed(7)
        inp = (torch.randn(2, 4, 16, 16, generator=gen), torch.tensor([601.0, 601.0]),
               torch.randn(2, 77, u["context_dim"], generator=gen), torch.randn(2, u["pooled_dim"], generator=gen),
               torch.tensor([[128.0, 128.0, 0.0, 0.0, 128.0, 128.0]] * 2))
        res = tuple(torch.randn(2, ch, 16 // d, 16 // d, generator=gen) * 0.5
                    for ch, d in zip(u["control"]["channels"], u["control"]["downscales"]))
        ts = self.ts
        lat, t, ctx, te, tid = inp
        with torch.no_grad():
            for name, got, extra in (
                    ("forward", ts(*inp), {}),
                    ("forward_control", ts.forward_control(*inp, res),
                     {"down_block_additional_residuals": [r.clone() for r in res[:-1]],
                      "mid_block_additional_residual": res[-1].clone()})):
                ref = unet(lat, t, encoder_hidden_states=ctx, added_cond_kwargs={"text_embeds": te, "time_ids": tid},
                           return_dict=False, **extra)[0]
                d, scale = float((got - ref).abs().max()), float(ref.abs().max())
                print(f"\nunet_fp8.ts {name} vs the emulated unfused FP8 UNet: max |diff| {d:.3g} "
                      f"(max |ref| {scale:.3g})")
                self.assertLessEqual(d, 1e-4 * max(scale, 1e-6), name)

    def test_fp8_geglu_without_fp8_is_refused_before_torch(self):
        script = Path(ARGS.source) / "scripts" / "export_sdxl.py"
        # as `python export_sdxl.py ...` runs it (its folder first on sys.path), telling whether torch was imported
        probe = ("import os, runpy, sys\nsys.argv = sys.argv[1:]\nsys.path.insert(0, os.path.dirname(sys.argv[0]))\n"
                 "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
                 "except SystemExit as e:\n    print('exit', e.code, 'torch' in sys.modules)\n")
        out = Path(ARGS.work) / "refused"
        p = subprocess.run([sys.executable, "-c", probe, str(script), "--tiny", "--fp8-geglu", "--out", str(out)],
                           capture_output=True, text=True, timeout=60)
        self.assertIn("exit 2 False", p.stdout, p.stdout + p.stderr)
        self.assertIn("--fp8-geglu goes with --fp8", p.stderr)
        self.assertFalse(out.exists())

    def test_sdxl_batch_runs_it_with_and_without_loras(self):
        for name, (r, out) in self.runs.items():
            self.assertEqual(r.returncode, 0, f"{name}: {r.stderr[-1500:]}")
        man = {(l["task"], l["index"]): l for l in read_manifest(self.runs["fp8conv"][1])}
        self.assertEqual(len(man), 4)
        self.assertNotEqual(man[("p0", 0)]["sha256"], man[("locon", 0)]["sha256"], "the LoCon changed nothing")
        self.assertGreater(self.ff_keys, 0)
        self.assertNotEqual(man[("p0", 0)]["sha256"], man[("ff", 0)]["sha256"],
                            "the feed-forward LoRA changed nothing in the fused feed-forwards")

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
        self.assertEqual(s["runs"]["fp8conv"]["images"], 4)
        self.assertIn("### Fidelity", (work / "summary.md").read_text())


if __name__ == "__main__":
    sys.exit(main(__doc__, "--binary", "--work", "--source", "--loras"))
