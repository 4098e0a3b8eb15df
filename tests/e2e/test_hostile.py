#!/usr/bin/env python3
"""Hostile inputs and faults through the real binary on the tiny model (ctest label e2e).

Each test names the rule it checks; together they hold README's promises:
"nothing outside the output folder is written" and "a kill -9 at any moment
loses at most the image in flight and never makes an image twice".

    test_hostile.py --binary BUILD/sdxl-batch --model TINY_MODEL_DIR --work DIR
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import unittest
from pathlib import Path

from e2e_common import ARGS, ENV, fresh, main, pixels, read_report, sdxl


def batch(d: Path, tasks: list[dict], **top) -> Path:
    p = d / "batch.json"
    p.write_text(json.dumps({"version": 1, "defaults": {"steps": 2}, "tasks": tasks, **top}))
    return p


def run(b: Path, out: Path, *extra: str, **kw) -> subprocess.CompletedProcess:
    return sdxl("run", str(b), "--model", ARGS.model, "--out", str(out), *extra, **kw)


ONE = [{"id": "a", "prompt": "a lighthouse", "seed": 5}]


def held(lock: Path) -> bool:
    """Whether a process holds an exclusive flock on `lock` now."""
    try:
        with open(lock) as f:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
    except BlockingIOError:
        return True
    except FileNotFoundError:
        return False


class NothingWrittenOutside(unittest.TestCase):
    def test_linked_lock_and_manifest_are_refused_not_followed(self):
        for name in (".sdxl-batch.lock", "manifest.jsonl", "seeds.jsonl", "manifest-shard-1-of-2.jsonl"):
            d = fresh("link-" + name.strip("."))
            victim = d / "victim.txt"
            victim.write_text("precious\n")
            out = d / "out"
            out.mkdir()
            (out / name).symlink_to(victim)
            r = run(batch(d, ONE), out)
            self.assertEqual(r.returncode, 2, f"{name}: {r.stderr}")
            self.assertIn("symbolic link", r.stderr)
            self.assertEqual(victim.read_text(), "precious\n", f"{name}: the link's target was written")

    def test_lock_flag_never_replaces_a_file(self):
        d = fresh("lock-flag")
        notes = d / "notes.txt"
        notes.write_text("a user's notes\n")
        r = run(batch(d, ONE), d / "out", "--lock", str(notes))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(notes.read_text(), "a user's notes\n")

    def test_prompt_tags_do_not_read_outside_the_lora_folders(self):
        d = fresh("lora-tag")
        (d / "loras").mkdir()
        (d / "x.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")  # there to be read
        for tag in ("<lora:../x:1>", f"<lora:{d}/x:1>"):
            r = sdxl("generate", "--model", ARGS.model, "--lora-dir", str(d / "loras"), "--prompt", f"a cat {tag}",
                     "--steps", "1", "--out", str(d / "x.png"))
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("not an absolute path or one with '..'", r.stderr)

    def test_model_json_paths_stay_in_the_model_folder(self):
        d = fresh("model-path")
        model = d / "model"
        shutil.copytree(ARGS.model, model)
        meta = json.loads((model / "model.json").read_text())
        shutil.copy(model / "unet.ts", d / "outside.ts")  # there to be read, if the path were followed
        meta["unet"]["file"] = "../outside.ts"
        (model / "model.json").write_text(json.dumps(meta))
        r = sdxl("validate", str(batch(d, ONE)), "--model", str(model))
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("must be inside the model directory", r.stderr)


class NothingLostOrTwice(unittest.TestCase):
    def test_control_character_in_template(self):
        d = fresh("nul")
        b = batch(d, [{"id": "a", "prompt": "x", "seed": 1, "count": 2}],
                  output={"template": "{id}\u0000-{index}.png"})
        r = sdxl("validate", str(b))
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("/output/template", r.stdout)
        self.assertIn("control character", r.stdout)

    def test_plain_run_beside_a_running_shard_is_refused(self):
        d = fresh("shard-live")
        out = d / "out"
        b = batch(d, [{"id": f"t{k}", "prompt": "x", "seed": -1, "count": 6, "steps": 8} for k in range(2)])
        shard = subprocess.Popen([ARGS.binary, "run", str(b), "--model", ARGS.model, "--out", str(out), "--shard", "0/2"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
        try:
            lock = out / ".sdxl-batch-shard-0-of-2.lock"
            deadline = time.time() + 60
            while time.time() < deadline and not held(lock):
                time.sleep(0.05)
            self.assertTrue(held(lock), "the shard run should hold its lock")
            r = run(b, out)
            self.assertEqual(r.returncode, 4, "a plain run beside a shard would make the shard's images again")
        finally:
            shard.wait(timeout=300)
        self.assertEqual(shard.returncode, 0)
        self.assertEqual(len(list(out.glob("t0-*.png"))), 6, "task t0 made once, by its shard")

    def test_plain_run_and_shard_runs_exclude_each_other(self):
        d = fresh("shards")
        out = d / "out"
        out.mkdir()
        b = batch(d, [{"id": f"t{k}", "prompt": "x", "seed": -1} for k in range(2)])
        # A running shard 0/2: its own lock exclusively, the folder's lock shared.
        with open(out / ".sdxl-batch-shard-0-of-2.lock", "w") as shard, open(out / ".sdxl-batch.lock", "w") as folder:
            fcntl.flock(shard, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(folder, fcntl.LOCK_SH | fcntl.LOCK_NB)
            r = run(b, out)
            self.assertEqual(r.returncode, 4, r.stderr)
            self.assertIn("shard run(s) 0/2", r.stderr)
            r = run(b, out, "--shard", "0/3")
            self.assertEqual(r.returncode, 4, r.stderr)
            self.assertIn("use the same N", r.stderr)
            r = run(b, out, "--shard", "1/2")
            self.assertEqual(r.returncode, 0, "the other shard runs beside it: " + r.stderr)
        # A running plain run: the folder's lock exclusively.
        with open(out / ".sdxl-batch.lock", "w") as folder:
            fcntl.flock(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
            r = run(b, out, "--shard", "0/2")
            self.assertEqual(r.returncode, 4, r.stderr)

    def test_plain_run_of_another_batch_is_refused_in_a_shard_folder(self):
        d = fresh("shard-other-batch")
        out = d / "out"
        out.mkdir()
        other = str(d / "elsewhere" / "other.json")
        (out / "report-shard-0-of-2.json").write_text(json.dumps({"batch": other, "shard": "0/2"}))
        b = batch(d, ONE)
        r = run(b, out)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(f"holds shard runs of batch file '{other}' (report-shard-0-of-2.json); this run is of", r.stderr)
        self.assertEqual(list(out.glob("*.png")), [], "nothing made before the refusal")
        r = run(b, out, "--force")
        self.assertEqual(r.returncode, 0, "--force runs it there anyway: " + r.stderr)

    def test_kill_after_png_before_manifest_makes_no_second_image(self):
        d = fresh("kill-png")
        out = d / "out"
        b = batch(d, [{"id": "r", "prompt": "a fox", "seed": -1, "count": 2}])
        r = run(b, out, env_extra={"SDXL_TEST_KILL_AT": "png-written"})
        self.assertEqual(r.returncode, -signal.SIGKILL, r.stderr)
        first = sorted(p.name for p in out.glob("*.png"))
        self.assertEqual(len(first), 1, "killed right after the first PNG")
        self.assertFalse((out / "manifest.jsonl").exists(), "the kill came before its manifest line")
        r = run(b, out)
        self.assertEqual(r.returncode, 0, r.stderr)
        pngs = sorted(p.name for p in out.glob("*.png"))
        self.assertEqual(len(pngs), 2, f"a rerun must not make the killed image again under a new seed: {pngs}")
        self.assertIn(first[0], pngs)

    def test_torn_manifest_line_does_not_swallow_the_next_record(self):
        d = fresh("torn")
        out = d / "out"
        out.mkdir()
        (out / "manifest.jsonl").write_text('{"task": "old", "index": 0, "se')  # a full disk tore it
        r = run(batch(d, ONE), out)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = (out / "manifest.jsonl").read_text().splitlines()
        self.assertEqual(json.loads(lines[-1])["task"], "a")
        r = run(batch(d, ONE), out)
        self.assertEqual(read_report(out)["images_done"], 0, "the record was read back")


class NoCrashNoHang(unittest.TestCase):
    def test_deeply_nested_json(self):
        d = fresh("deep")
        b = d / "deep.json"
        b.write_text('{"version": 1, "tasks": ' + "[" * 50000 + "]" * 50000 + "}")
        for cmd in (("validate", str(b)), ("run", str(b), "--model", ARGS.model, "--out", str(d / "out"))):
            r = sdxl(*cmd)
            self.assertEqual(r.returncode, 2, f"{cmd[0]}: {r.returncode} {r.stderr[-300:]}")
            self.assertIn("nested deeper than 64", r.stdout + r.stderr)

    def test_fifo_device_and_folder_inputs(self):
        d = fresh("fifo")
        os.mkfifo(d / "pipe.png")
        os.mkfifo(d / "pipe.safetensors")
        (d / "folder.png").mkdir()
        cases = {"pipe.png": "FIFO", "/dev/zero": "device", "folder.png": "folder"}
        for image, why in cases.items():
            r = sdxl("validate", str(batch(d, [{"id": "a", "prompt": "x", "init_image": image}])), timeout=30)
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn(why, r.stdout)
        r = sdxl("generate", "--model", ARGS.model, "--lora", str(d / "pipe.safetensors"), "--prompt", "x",
                 "--steps", "1", "--out", str(d / "x.png"), timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("FIFO", r.stderr)


def panel(path: Path, w: int = 40, h: int = 40) -> Path:
    """A PNG of a horizontal grey ramp with a "parameters" chunk, as a panel the upscale command takes."""
    from PIL import Image, PngImagePlugin
    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", "a panel\nSteps: 2, Seed: 1")
    row = bytes(x * 255 // max(1, w - 1) for x in range(w))
    Image.frombytes("L", (w, h), row * h).convert("RGB").save(path, pnginfo=info)
    return path


def upscaler_folder(d: Path, name: str, *, tile: int, nan: bool = False) -> Path:
    """An upscaler folder made by hand (model.json as export_sdxl.py --upscaler writes it): a scripted
    nearest-neighbour x2 module traced at a fixed tile (SwinIR's kind of folder); `nan`: its output is NaN."""
    import hashlib

    import torch

    class Nearest2(torch.nn.Module):
        def __init__(self, nan: bool):
            super().__init__()
            self.nan = nan

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.nn.functional.interpolate(x, scale_factor=2.0, mode="nearest")
            return y * float("nan") if self.nan else y

    folder = d / name
    folder.mkdir(parents=True)
    torch.jit.script(Nearest2(nan)).save(str(folder / "upscaler.ts"))
    data = (folder / "upscaler.ts").read_bytes()
    meta = {"kind": "upscaler", "format_version": 1, "name": name, "dtype": "fp32", "export_device": "cpu",
            "upscaler": {"file": "upscaler.ts"}, "architecture": {"id": "Nearest"}, "scale": 2,
            "tile": {"fixed": True, "size": tile},
            "files": {"upscaler.ts": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}}
    (folder / "model.json").write_text(json.dumps(meta))
    return folder


def upscale(out: Path, *inputs: Path, model: str = "Lanczos", by: str = "2", **kw) -> subprocess.CompletedProcess:
    return sdxl("upscale", "--upscale-model", model, "--upscale", by, "--device", "cpu", "--out", str(out),
                *map(str, inputs), **kw)


class UpscaleNeverInPlace(unittest.TestCase):
    """issue 56: `upscale` never overwrites an input, bounds its frames as the batch key does, fails one
    image (exit 3) for what one image does, and reads only regular files."""

    def test_out_that_is_an_input_folder_is_refused(self):
        d = fresh("up-inplace")
        panels = d / "panels"
        panels.mkdir()
        original = panel(panels / "p1.png").read_bytes()
        (d / "linked").symlink_to(panels)
        for out, src in ((panels, panels), (panels, panels / "p1.png"), (d / "linked", panels)):
            r = upscale(out, src)
            self.assertEqual(r.returncode, 2, f"--out {out} {src}: {r.stdout}{r.stderr}")
            self.assertIn(f"--out '{out}' is the folder of the input '{src}'", r.stderr)
        # An output file that is a link to an input would replace the input's content.
        (d / "frames-linked").mkdir()
        (d / "frames-linked" / "p1.png").symlink_to(panels / "p1.png")
        r = upscale(d / "frames-linked", panels)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(f"is the input '{panels / 'p1.png'}' (through a link)", r.stderr)
        self.assertEqual((panels / "p1.png").read_bytes(), original, "the original is untouched")
        self.assertEqual(sorted(p.name for p in panels.iterdir()), ["p1.png"], "nothing written beside it")
        # A folder inside the input folder is fine: folders are read one level deep, so a rerun skips.
        for attempt in ("first", "rerun"):
            r = upscale(panels / "frames", panels)
            self.assertEqual(r.returncode, 0, f"{attempt}: {r.stderr}")
        self.assertIn("0 written, 1 already done", r.stdout)
        self.assertEqual((panels / "p1.png").read_bytes(), original)

    def test_frames_out_of_bounds_fail_their_image_only(self):
        d = fresh("up-bounds")
        src = d / "in"
        src.mkdir()
        panel(src / "big.png", 2048, 2048)
        panel(src / "small.png", 64, 64)
        r = upscale(d / "out", src, by="16")
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        self.assertIn("--upscale 16 makes a 32768x32768 frame from the 2048x2048 image; each side must be 8..16384",
                      r.stdout)
        self.assertIn("1 written, 0 already done, 1 failed", r.stdout)
        self.assertEqual(pixels(d / "out" / "small.png").shape, (1024, 1024, 3), "the other image is still made")
        self.assertFalse((d / "out" / "big.png").exists())
        r = upscale(d / "out-tiny", src / "small.png", by="0.05")
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        self.assertIn("makes a 3x3 frame", r.stdout)
        self.assertFalse((d / "out-tiny" / "small.png").exists(), "no 3x3 frame is written")

    def test_fifos_and_a_file_as_out_are_refused_clearly(self):
        d = fresh("up-fifo")
        src = d / "in"
        src.mkdir()
        panel(src / "p1.png")
        os.mkfifo(src / "pipe.png")
        r = upscale(d / "out", src / "pipe.png", timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(f"upscale input '{src / 'pipe.png'}' is a FIFO", r.stderr)
        r = upscale(d / "out", src, timeout=60)  # the folder's FIFO is skipped, its PNG made
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("skipped", r.stderr)
        self.assertTrue((d / "out" / "p1.png").is_file())
        (d / "planted").mkdir()
        os.mkfifo(d / "planted" / "manifest.jsonl")
        r = upscale(d / "planted", src / "p1.png", timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("manifest.jsonl' is not a regular file", r.stderr)
        (d / "a-file").write_text("x")
        r = upscale(d / "a-file", src / "p1.png", timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(f"--out '{d / 'a-file'}' is a file, not a folder", r.stderr)

    def test_small_fixed_tile_ends_and_nan_output_fails_the_image(self):
        d = fresh("up-tile")
        src = panel(d / "p1.png", 40, 40)
        # A fixed tile of 16 px with ComfyUI's overlap of 32: the tile step was 16 - 32 < 0 (an endless
        # loop); the overlap is now 16 / 4 px.
        r = upscale(d / "out", src, model=str(upscaler_folder(d, "tile16", tile=16)), timeout=20)
        self.assertEqual(r.returncode, 0, r.stderr)
        got, want = pixels(d / "out" / "p1.png"), pixels(src).repeat(2, axis=0).repeat(2, axis=1)
        self.assertLessEqual(int(abs(got - want).max()), 1, "the tiles of a nearest x2 blend to a nearest x2")
        r = upscale(d / "out-nan", src, model=str(upscaler_folder(d, "nan", tile=16, nan=True)), timeout=20)
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        self.assertIn("upscaler 'nan' gave values that are not finite", r.stdout)
        self.assertFalse((d / "out-nan" / "p1.png").exists(), "no black frame")


class ReportReadsOnlyItsFolder(unittest.TestCase):
    """`sdxl-batch report DIR` on a shared folder where others planted reports, manifest lines and FIFOs (issue 56)."""

    def setUp(self):
        self.d = fresh("report")
        self.out = self.d / "out"
        r = run(batch(self.d, ONE), self.out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.secret = self.d / "secret.png"
        shutil.copy(next(self.out.glob("a-*.png")), self.secret)
        self.run_report = (self.out / "report.json").read_bytes()

    def report(self):
        return sdxl("report", str(self.out), timeout=60)

    def test_planted_names_and_links_get_no_thumbnail(self):
        line = {"task": "b", "index": 0, "seed": 1, "sha256": "0", "finished": "2026-12-04T18:00:00Z"}
        with open(self.out / "manifest-shard-1-of-2.jsonl", "w") as f:
            for name in (str(self.secret), "../secret.png", "link.png"):
                f.write(json.dumps({**line, "task": name, "file": name}) + "\n")
        os.symlink(self.secret, self.out / "link.png")
        r = self.report()
        self.assertIn(r.returncode, (0, 3), r.stderr)
        html = (self.out / "report.html").read_text()
        self.assertEqual(html.count('src="data:image/png;base64,'), 1, "only the run's own image")
        self.assertEqual(html.count('class="card missing"'), 3)

    def test_deep_fifo_and_wrong_typed_reports_end_with_clear_errors(self):
        batch_path = json.dumps(json.loads(self.run_report)["batch"])
        deep = '{"batch": ' + batch_path + ', "images": [' + "[" * 200000 + "]" * 200000 + "]}"
        (self.out / "report-shard-1-of-2.json").write_text(deep)
        r = self.report()
        self.assertEqual(r.returncode, 1, r.stderr[-300:])  # IoError, not SIGSEGV (-11)
        self.assertIn("report-shard-1-of-2.json: not a run report (nested deeper than 64 levels)", r.stderr)
        (self.out / "report-shard-1-of-2.json").write_text('{"images": 5}')
        r = self.report()
        self.assertIn(r.returncode, (0, 3), r.stderr)
        self.assertIn("report-shard-1-of-2.json: /images is a number, not an array", r.stderr)
        self.assertNotIn("unexpected", r.stderr)
        (self.out / "report-shard-1-of-2.json").unlink()
        (self.out / "report.json").write_bytes(self.run_report)  # the merge above replaced it
        os.mkfifo(self.out / "seeds-shard-1-of-2.jsonl")
        r = self.report()
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("seeds-shard-1-of-2.jsonl' is not a regular file", r.stderr)


class ClearErrors(unittest.TestCase):
    def test_bad_numbers_in_flags(self):
        d = fresh("flags")
        for flag, value in (("--cfg", "nan"), ("--cfg", "inf"), ("--strength", "nan")):
            r = sdxl("generate", "--model", ARGS.model, "--prompt", "x", flag, value, "--out", str(d / "x.png"))
            self.assertEqual(r.returncode, 2, f"{flag} {value}: {r.stderr}")
            self.assertIn(flag, r.stderr)
            self.assertIn("not a finite number", r.stderr)
        r = run(batch(d, ONE), d / "out", "--devices", "99999999999999999999")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--devices", r.stderr)
        self.assertNotIn("unexpected", r.stderr)

    def test_duplicate_keys_long_ids_and_long_prompts_fail_validate(self):
        d = fresh("validate")
        b = d / "dup.json"
        b.write_text('{"version": 1, "tasks": [{"id": "a", "prompt": "x", "cfg": 5, "cfg": 9}]}')
        r = sdxl("validate", str(b))
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("/tasks/0/cfg: the key \"cfg\" is written twice", r.stdout)
        b = batch(d, [{"id": "x" * 5000, "prompt": "x"}, {"id": "b", "prompt": "word, " * 12000}])
        r = sdxl("validate", str(b), "--model", ARGS.model)
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("/tasks/0/id: its file name would be", r.stdout)
        self.assertIn("/tasks/1/prompt: image 0's prompt needs", r.stdout)


class SilentCorruption(unittest.TestCase):
    def test_verify_model_finds_a_flipped_byte(self):
        d = fresh("verify")
        model = d / "model"
        shutil.copytree(ARGS.model, model)
        b = batch(d, ONE)
        r = sdxl("run", str(b), "--model", str(model), "--out", str(d / "out"), "--verify-model")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("match their sha256", r.stderr)
        unet = model / "unet.ts"
        data = bytearray(unet.read_bytes())
        data[len(data) // 2] ^= 0x01
        unet.write_bytes(bytes(data))
        r = sdxl("run", str(b), "--model", str(model), "--out", str(d / "out2"), "--verify-model")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("unet.ts' has sha256", r.stderr)


if __name__ == "__main__":
    sys.exit(main(__doc__, "--binary", "--model", "--work"))
