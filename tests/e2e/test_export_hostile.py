#!/usr/bin/env python3
"""Hostile inputs to scripts/export_sdxl.py (ctest e2e_export_hostile, label e2e): FIFOs, devices,
missing files and links to nothing in place of an input file or inside an input folder; damaged
and hostile safetensors files (headers the format does not allow: lengths beyond the file, bytes
that are not UTF-8 JSON, odd __metadata__, unknown dtypes, shapes that lie or overflow, overlapping,
gapped or out-of-range data offsets, trailing bytes), given as a file and inside a diffusers folder;
checkpoints and VAE files whose weights hold NaN or infinities. Each must be refused with exit code
1 and one line naming the file and the problem, no Python traceback, no hang, and nothing left
where --out would be. The files are a few bytes each, written here; nothing is downloaded.

TorchScript archives under every flag (their code must not run), zip archives that expand beyond
their size, upscalers and detectors beyond the runtime's limits, and the upscaler and detector folders'
file lists checked by the binary's --verify-model (issue 56; the files: export_hostile_models.py).

    test_export_hostile.py --python PY --source REPO --work DIR --binary SDXL_BATCH --model TINY_MODEL
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import unittest
from pathlib import Path

ARGS: argparse.Namespace
ENV = dict(os.environ, OMP_NUM_THREADS="1")
TIMEOUT = 120  # a FIFO read by the export would block forever: a refusal takes well under a second


def safetensors(header, data: bytes = b"", length: int | None = None) -> bytes:
    """A safetensors file: the 8-byte header length (or `length`), the header (a dict as JSON, or raw
    bytes), the data."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def f32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def f16(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}e", *values)


def t(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


# name: (file bytes, words the message must hold)
HOSTILE = {
    "short": (b"\x01\x02\x03", "too short"),
    "header-beyond-file": (safetensors({"a": t("F32", [1], 0, 4)}, f32(1), length=4096), "header length 4096"),
    "header-over-limit": (safetensors({}, length=2**63), "header length"),
    "not-utf8": (safetensors(b'{"\xff\xfe": {}}'), "not JSON"),
    "not-json": (safetensors(b'{"a": {"dtype": "F32",'), "not JSON"),
    "not-object": (safetensors(b"[1, 2, 3]"), "not a JSON object"),
    "metadata-not-object": (safetensors({"__metadata__": "x"}), "__metadata__ is not an object"),
    "metadata-not-strings": (safetensors({"__metadata__": {"k": 1}}), "__metadata__ value 'k'"),
    "entry-not-object": (safetensors({"a": [1, 2]}), "'a': its entry is not an object"),
    "dtype-missing": (safetensors({"a": {"shape": [1], "data_offsets": [0, 4]}}, f32(1)), "'a': dtype"),
    "dtype-unknown": (safetensors({"a": t("F128", [1], 0, 16)}, bytes(16)), "unknown dtype 'F128'"),
    "shape-negative": (safetensors({"a": t("F32", [-1], 0, 4)}, f32(1)), "'a': shape"),
    "shape-float": (safetensors({"a": t("F32", [1.5], 0, 4)}, f32(1)), "'a': shape"),
    "offsets-one": (safetensors({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, f32(1)),
                    "'a': data_offsets"),
    "offsets-reversed": (safetensors({"a": t("F32", [0], 4, 0)}, f32(1)), "end before"),
    "offsets-beyond-file": (safetensors({"a": t("F32", [4], 0, 16)}, f32(1, 2)), "truncated"),
    "overlap": (safetensors({"a": t("F32", [2], 0, 8), "b": t("F32", [2], 4, 12)}, f32(1, 2, 3)),
                "'b': its bytes overlap"),
    "gap": (safetensors({"a": t("F32", [1], 0, 4), "b": t("F32", [1], 8, 12)}, f32(1, 2, 3)),
            "'b': its bytes leave a gap"),
    "lying-shape": (safetensors({"a": t("F32", [3], 0, 8)}, f32(1, 2)), "'a': shape [3] of F32 is 12 bytes"),
    "shape-overflow": (safetensors({"a": t("F32", [2**32, 2**32, 4], 0, 16)}, f32(1, 2, 3, 4)), "overflows"),
    "trailing-bytes": (safetensors({"a": t("F32", [1], 0, 4)}, f32(1, 2)), "bytes after the last tensor"),
    "duplicate-name": (safetensors(b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
                                   b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', f32(1, 2)),
                       "'a' appears twice"),
}


class ExportCase(unittest.TestCase):
    """The work folder, the files every case shares, and refused()."""
    work: Path

    @classmethod
    def setUpClass(cls):
        cls.work = Path(ARGS.work)
        shutil.rmtree(cls.work, ignore_errors=True)
        (cls.work / "files").mkdir(parents=True)
        cls.out = cls.work / "out" / "model"
        r = subprocess.run([ARGS.python, str(Path(ARGS.source) / "scripts" / "export_sdxl.py"), "--print-config",
                            "tiny"], capture_output=True, text=True, env=ENV, timeout=TIMEOUT)
        cls.vae_config = dict(json.loads(r.stdout)["vae"], _class_name="AutoencoderKL")
        cls.good = cls.write("good.safetensors", safetensors({"a": t("F32", [2], 0, 8)}, f32(1, 2)))
        cls.fifo = cls.work / "files" / "fifo.safetensors"
        os.mkfifo(cls.fifo)

    @classmethod
    def write(cls, name: str, data: bytes) -> Path:
        path = cls.work / "files" / name
        path.write_bytes(data)
        return path

    def vae_folder(self, name: str, weights: Path | None = None, config: Path | None = None) -> Path:
        """A diffusers VAE folder: config.json (the tiny VAE's, or a link to `config`) and its weights
        file (a link to `weights`)."""
        d = self.work / "folders" / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        if config is None:
            (d / "config.json").write_text(json.dumps(self.vae_config))
        else:
            (d / "config.json").symlink_to(config)
        if weights is not None:
            (d / "diffusion_pytorch_model.safetensors").symlink_to(weights)
        return d

    def refused(self, args: list[str], words: str, names: str) -> str:
        """Runs the export with args and --out: exit code 1, the message's last line holds `words` and
        `names` (the file it is about), no traceback, and nothing where --out would be."""
        shutil.rmtree(self.out.parent, ignore_errors=True)
        cmd = [ARGS.python, str(Path(ARGS.source) / "scripts" / "export_sdxl.py"), *args, "--out", str(self.out)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.fail(f"{' '.join(args)}: still running after {TIMEOUT} s (blocked on a read?)")
        last = (r.stderr.strip().splitlines() or [""])[-1]
        context = f"{' '.join(args)}\nstderr: {r.stderr[-1500:]}"
        self.assertEqual(r.returncode, 1, context)
        self.assertNotIn("Traceback", r.stderr, context)
        self.assertIn(words, last, context)
        self.assertIn(names, last, context)
        left = list(self.out.parent.iterdir()) if self.out.parent.exists() else []
        self.assertEqual(left, [], f"{' '.join(args)}: left behind {left}")
        return last


class ExportRefusals(ExportCase):
    def test_hostile_safetensors_are_refused_as_a_file_and_inside_a_folder(self):
        for name, (data, words) in HOSTILE.items():
            with self.subTest(name):
                path = self.write(f"{name}.safetensors", data)
                self.refused(["--vae-only", "--vae", str(path)], words, path.name)
                folder = self.vae_folder(name, weights=path)
                self.refused(["--vae-only", "--vae", str(folder)], words, "diffusion_pytorch_model.safetensors")

    def test_prediction_flags_that_contradict_the_checkpoint_markers_are_refused(self):
        """Issue 61: a single file's v_pred / ztsnr marker keys against --prediction-type epsilon and
        --no-zero-snr, refused from the header before torch loads."""
        keys = ["model.diffusion_model.label_emb.0.0.weight", "conditioner.embedders.0.transformer.w",
                "conditioner.embedders.1.model.w"]
        header = {k: t("F32", [1], 4 * i, 4 * i + 4) for i, k in enumerate(keys)}
        header.update(v_pred=t("F32", [0], 12, 12), ztsnr=t("F32", [0], 12, 12))
        path = self.write("vpred-markers.safetensors", safetensors(header, f32(0, 0, 0)))
        self.refused(["--from", str(path), "--prediction-type", "epsilon"], "--prediction-type epsilon contradicts",
                     "'v_pred' marker")
        self.refused(["--from", str(path), "--no-zero-snr"], "--no-zero-snr contradicts", "'ztsnr' marker")

    def test_prediction_settings_come_from_the_source_and_the_flags(self):
        """Issue 61: what model.json records (checkpoint_family.prediction_settings, torch-free): a
        diffusers folder's scheduler config, a single file's markers, the flags over both."""
        sys.path.insert(0, str(Path(ARGS.source) / "scripts"))
        from export.checkpoint_family import prediction_settings

        def flags(**kw) -> argparse.Namespace:
            return argparse.Namespace(**{"from_path": "src", "prediction_type": None, "zero_snr": None,
                                         "guidance_rescale": None, **kw})
        vz = {"prediction_type": "v_prediction", "rescale_betas_zero_snr": True, "guidance_rescale": 0.7,
              "timestep_spacing": "trailing"}
        eps = {"prediction_type": "epsilon", "rescale_betas_zero_snr": False, "guidance_rescale": 0.0}
        self.assertEqual(prediction_settings(flags(), {"prediction_type": "v_prediction",
                                                       "rescale_betas_zero_snr": True}, None), vz)
        self.assertEqual(prediction_settings(flags(), {}, {"v_pred", "ztsnr"}), vz)
        self.assertEqual(prediction_settings(flags(), {}, None), eps)
        self.assertEqual(prediction_settings(flags(), {}, {"v_pred"}), dict(eps, prediction_type="v_prediction"))
        self.assertEqual(prediction_settings(flags(prediction_type="v_prediction", zero_snr=True), {}, None), vz)
        self.assertEqual(prediction_settings(flags(prediction_type="epsilon", zero_snr=False),
                                             {"prediction_type": "v_prediction", "rescale_betas_zero_snr": True},
                                             None), eps)
        self.assertEqual(prediction_settings(flags(guidance_rescale=0.5), {}, {"v_pred", "ztsnr"})["guidance_rescale"],
                         0.5)

    def test_every_weights_flag_checks_its_files(self):
        bad = self.write("overlap.safetensors", HOSTILE["overlap"][0])
        encoder = self.work / "folders" / "encoder"
        encoder.mkdir(parents=True, exist_ok=True)
        (encoder / "config.json").write_text("{}")
        shutil.copyfile(bad, encoder / "model.safetensors")
        words = "its bytes overlap"
        self.refused(["--from", str(bad)], words, bad.name)
        self.refused(["--from", str(self.good), "--vae", str(bad)], words, bad.name)
        self.refused(["--controlnet", str(bad)], words, bad.name)
        self.refused(["--controlnet", str(self.vae_folder("cn", weights=bad))], words, "diffusion_pytorch_model")
        self.refused(["--ip-adapter", str(bad), "--image-encoder", str(encoder)], words, bad.name)
        self.refused(["--ip-adapter", str(self.good), "--image-encoder", str(encoder)], words, "model.safetensors")

    def test_fifos_devices_and_missing_files_are_refused_by_name(self):
        fifo, enc = self.fifo, self.work / "folders" / "encoder-fifo"
        enc.mkdir(parents=True, exist_ok=True)
        (enc / "config.json").write_text("{}")
        if not (enc / "model.safetensors").exists():
            os.mkfifo(enc / "model.safetensors")
        dangling = self.work / "files" / "dangling.safetensors"
        if not dangling.is_symlink():
            dangling.symlink_to(self.work / "files" / "nothing-here")
        prompts = self.work / "files" / "prompts.fifo"
        if not prompts.exists():
            os.mkfifo(prompts)
        cases = [
            (["--vae-only", "--vae", str(fifo)], "a FIFO", fifo.name),
            (["--from", str(self.good), "--vae", str(fifo)], "a FIFO", fifo.name),
            (["--from", str(fifo)], "a FIFO", fifo.name),
            (["--from", "/dev/zero"], "a character device", "/dev/zero"),
            (["--vae-only", "--vae", "/dev/null"], "a character device", "/dev/null"),
            (["--from", str(self.good), "--config", str(fifo)], "a FIFO", fifo.name),
            (["--controlnet", str(fifo)], "a FIFO", fifo.name),
            (["--ip-adapter", str(fifo), "--image-encoder", str(enc)], "a FIFO", fifo.name),
            (["--ip-adapter", str(self.good), "--image-encoder", str(enc)], "is a FIFO", "model.safetensors"),
            (["--vae-only", "--vae", str(self.vae_folder("fifo-config", config=fifo))], "is a FIFO", "config.json"),
            (["--vae-only", "--vae", str(self.vae_folder("fifo-weights", weights=fifo))], "is a FIFO",
             "diffusion_pytorch_model.safetensors"),
            (["--tiny", "--fp8", "--fp8-prompts", str(prompts)], "a FIFO", prompts.name),
            (["--vae-only", "--vae", str(self.work / "files" / "missing.safetensors")], "no such file",
             "missing.safetensors"),
            (["--controlnet", str(dangling)], "a link to nothing", dangling.name),
            (["--ip-adapter", str(enc), "--image-encoder", str(enc)], "a folder, not a regular file", enc.name),
            (["--ip-adapter", str(self.good), "--image-encoder", str(self.good)], "not a folder", self.good.name),
        ]
        for args, words, names in cases:
            with self.subTest(" ".join(args)):
                self.refused(args, words, names)

    def test_weights_with_nan_or_infinity_are_refused(self):
        nan, inf = float("nan"), float("inf")
        ckpt = {"model.diffusion_model.input_blocks.0.0.weight": (t("F16", [1, 4, 1, 1], 0, 8), f16(1, 2, 3, 4)),
                "model.diffusion_model.label_emb.0.0.weight": (t("F16", [2, 2], 8, 16), f16(1, nan, nan, 4)),
                "conditioner.embedders.0.transformer.w": (t("F32", [2], 16, 24), f32(1, inf)),
                "conditioner.embedders.1.model.w": (t("F32", [1], 24, 28), f32(1)),
                "first_stage_model.w": (t("F32", [1], 28, 32), f32(1))}
        nan_ckpt = self.write("nan-checkpoint.safetensors", safetensors(
            {k: h for k, (h, _) in ckpt.items()}, b"".join(d for _, d in ckpt.values())))
        self.refused(["--from", str(nan_ckpt)], "'model.diffusion_model.label_emb.0.0.weight' holds 2 NaN",
                     nan_ckpt.name)
        ckpt["model.diffusion_model.label_emb.0.0.weight"] = (ckpt["model.diffusion_model.label_emb.0.0.weight"][0],
                                                              f16(1, 2, 3, 4))
        inf_ckpt = self.write("inf-checkpoint.safetensors", safetensors(
            {k: h for k, (h, _) in ckpt.items()}, b"".join(d for _, d in ckpt.values())))
        self.refused(["--from", str(inf_ckpt)], "'conditioner.embedders.0.transformer.w' holds 1 infinite",
                     inf_ckpt.name)
        vae = self.write("nan-vae.safetensors", safetensors(
            {"decoder.conv_in.weight": t("F32", [2], 0, 8),
             "encoder.down.0.block.0.norm1.weight": t("F32", [2], 8, 16)}, f32(1, 2, nan, 1)))
        self.refused(["--vae-only", "--vae", str(vae)], "'encoder.down.0.block.0.norm1.weight' holds 1 NaN", vae.name)


class ModelFileRefusals(ExportCase):
    """Issue 56: model files that run code or allocate without bound, and the bounds the runtime has
    (tests/e2e/export_hostile_models.py makes the files)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.models = cls.work / "models"
        cls.marker = cls.work / "marker"
        r = subprocess.run([ARGS.python, str(Path(__file__).with_name("export_hostile_models.py")), str(cls.models),
                            str(cls.marker)], capture_output=True, text=True, env=ENV, timeout=TIMEOUT)
        if r.returncode != 0:
            raise RuntimeError(f"export_hostile_models.py failed: {r.stderr[-2000:]}")

    def code_folder(self, name: str, files: dict[str, Path | str]) -> Path:
        """A folder of files: name -> a file to copy, or text."""
        d = self.work / "folders" / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        for rel, src in files.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            if isinstance(src, Path):
                shutil.copyfile(src, d / rel)
            else:
                (d / rel).write_text(src)
        return d

    def test_a_torchscript_archive_runs_no_code_whatever_flag_names_it(self):
        evil = self.models / "evil.pth"
        as_safetensors = self.work / "files" / "evil.safetensors"
        shutil.copyfile(evil, as_safetensors)
        vae = self.code_folder("evil-vae", {"config.json": json.dumps(self.vae_config),
                                            "diffusion_pytorch_model.bin": evil})
        encoder = self.code_folder("evil-encoder", {"config.json": "{}", "pytorch_model.bin": evil})
        config = self.code_folder("evil-config", {"unet/config.json": "{}", "scheduler/scheduler.pt": evil})
        cases = [*[(["--upscaler", str(self.models / f"evil{ext}")], f"evil{ext}") for ext in (".pth", ".pt", ".ckpt")],
                 (["--upscaler", str(self.models / "compact_x2.pth"), str(self.models / "evil.pt")], "evil.pt"),
                 (["--detector", str(self.models / "evil.pt")], "evil.pt"),
                 (["--from", str(as_safetensors)], as_safetensors.name),
                 (["--from", str(self.good), "--config", str(config)], "scheduler.pt"),
                 (["--vae-only", "--vae", str(as_safetensors)], as_safetensors.name),
                 (["--vae-only", "--vae", str(vae)], "diffusion_pytorch_model.bin"),
                 (["--controlnet", str(as_safetensors)], as_safetensors.name),
                 (["--ip-adapter", str(as_safetensors), "--image-encoder", str(encoder)], as_safetensors.name),
                 (["--ip-adapter", str(self.good), "--image-encoder", str(encoder)], "pytorch_model.bin")]
        for args, name in cases:
            with self.subTest(" ".join(args)):
                self.refused(args, "a TorchScript archive", name)
                self.assertFalse(self.marker.exists(), f"{' '.join(args)}: the archive's code ran")

    def test_tiny_adapters_need_a_diffusers_folder_and_go_alone(self):
        """--tiny-ip-adapter / --tiny-controlnet DIR read DIR/unet/config.json (refused by name before torch
        loads); --source-only goes only with them, and they go without the model export's flags."""
        no_unet = self.work / "folders" / "no-unet"
        no_unet.mkdir(parents=True, exist_ok=True)
        for flag in ("--tiny-ip-adapter", "--tiny-controlnet"):
            with self.subTest(flag):
                self.refused([flag, str(no_unet)], "no such file or folder", str(no_unet / "unet" / "config.json"))
                self.refused([flag, str(self.fifo)], "not a folder", self.fifo.name)
        for args, words in ((["--tiny", "--source-only"], "--source-only goes with --tiny-ip-adapter"),
                            (["--tiny-controlnet", str(no_unet), "--aoti"], "go without --aoti")):
            cmd = [ARGS.python, str(Path(ARGS.source) / "scripts" / "export_sdxl.py"), *args, "--out", str(self.out)]
            r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=TIMEOUT)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(words, r.stderr)

    def test_zip_entries_that_expand_beyond_the_file_are_refused(self):
        self.refused(["--upscaler", str(self.models / "bomb.pth")], "expand to 671", "bomb.pth")

    def test_upscalers_beyond_the_runtime_limits_are_refused(self):
        self.refused(["--upscaler", str(self.models / "compact_x64.pth")], "scale 64", "compact_x64.pth")
        for tile in ("16", "8192"):
            cmd = [ARGS.python, str(Path(ARGS.source) / "scripts" / "export_sdxl.py"), "--upscaler",
                   str(self.models / "compact_x2.pth"), "--upscaler-tile", tile, "--out", str(self.out)]
            r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=TIMEOUT)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(f"--upscaler-tile {tile}: must be 64..1024", r.stderr)

    def test_detectors_with_bad_sizes_names_or_huge_layers_are_refused_in_one_line(self):
        cases = [("imgsz-nan.pt", "imgsz 'nan' of the checkpoint is not a size"),
                 ("imgsz-str.pt", "imgsz 'abc' of the checkpoint is not a size"),
                 ("imgsz-4096.pt", "imgsz [4096, 4096] of the checkpoint is not a multiple of its stride 32 from 32 "
                                   "to 2048"),
                 ("control-name.pt", "class 0's name 'fa\\x1bce' holds a control character (U+001B)"),
                 ("big-linear.pt", "constructs layers of more than 1024 MiB"),
                 ("broken-layer.pt", "Ultralytics' TorchScript export of it failed at imgsz [64, 64]")]
        for name, words in cases:
            with self.subTest(name):
                self.refused(["--detector", str(self.models / name)], words, name)

    def test_exported_upscaler_and_detector_folders_verify(self):
        """model.json records every other file of the folder with its sha256, not itself (M5); the
        binary's --verify-model passes both folders untouched and fails a changed module."""
        d = self.work / "verify"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        export = [ARGS.python, str(Path(ARGS.source) / "scripts" / "export_sdxl.py")]
        for args in (["--upscaler", str(self.models / "compact_x2.pth"), "--out", str(d)],
                     ["--detector", str(self.models / "face.pt"), "--out", str(d / "face")]):
            r = subprocess.run(export + args, capture_output=True, text=True, env=ENV, timeout=TIMEOUT)
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        for folder, module in ((d / "compact_x2", "upscaler.ts"), (d / "face", "detector.ts")):
            files = json.loads((folder / "model.json").read_text())["files"]
            self.assertEqual(sorted(files), [module], folder)
        (d / "batch.json").write_text(json.dumps({"version": 1, "defaults": {"steps": 2}, "tasks": [
            {"id": "a", "prompt": "x", "upscale": {"model": "compact_x2", "scale": 2},
             "detailer": [{"detector": "face", "denoise": 0.5}]}]}))
        verify = [ARGS.binary, "run", str(d / "batch.json"), "--model", ARGS.model, "--out", str(d / "out"),
                  "--verify-model", "--dry-run"]
        r = subprocess.run(verify, capture_output=True, text=True, env=ENV, timeout=TIMEOUT)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertIn("2 file(s) of 2 folder(s) beside the model match", r.stderr)
        data = bytearray((d / "face" / "detector.ts").read_bytes())
        data[100] ^= 0x01
        (d / "face" / "detector.ts").write_bytes(bytes(data))
        r = subprocess.run(verify, capture_output=True, text=True, env=ENV, timeout=TIMEOUT)
        self.assertEqual(r.returncode, 1, r.stderr[-2000:])
        self.assertIn("detector.ts' has sha256", r.stderr)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    for name in ("--python", "--source", "--work", "--binary", "--model"):
        ap.add_argument(name, required=True)
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0], "-v", *rest])
