#!/usr/bin/env python3
"""Hostile inputs of issue 46 through the real binary on the tiny model (ctest e2e_hostile_input).

Each test names the rule it checks (docs/unattended-runs.md, "Shared disks"); `validate` and `run`
must agree: both refuse with exit code 2 and the JSON pointer (and line) of the problem.

- reads stay inside the folder a file is named relative to (no link out of it);
- no two images of a batch file get one output path;
- wildcard expansion has a budget, and each wildcard file is parsed once;
- input text is UTF-8 without control characters, and PNG metadata never carries one;
- validate refuses what run would fail on for input reasons (validate = run): PNGs are decoded whole,
  embeddings checked as the run loads them, prompt tags' LoRAs resolved, inpainting masks checked
  (readable, with an init image, of its aspect ratio, not empty, not faded away by their blur).

    test_hostile_input.py --binary BUILD/sdxl-batch --model TINY_MODEL_DIR --work DIR
"""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import time
import unittest
import zlib
from pathlib import Path

from e2e_common import ARGS, fresh, main, sdxl

SECRET = "TOPSECRET-4f1c"


def batch(d: Path, tasks: list[dict], **top) -> Path:
    p = d / "batch.json"
    defaults = {"steps": 1, "width": 64, "height": 64}
    p.write_text(json.dumps({"version": 1, "defaults": defaults, "tasks": tasks, **top}, indent=1))
    return p


def validate(b: Path, *extra: str, **kw) -> subprocess.CompletedProcess:
    return sdxl("validate", str(b), *extra, **kw)


def run(b: Path, out: Path, *extra: str, **kw) -> subprocess.CompletedProcess:
    return sdxl("run", str(b), "--model", ARGS.model, "--out", str(out), *extra, **kw)


def png(path: Path, w: int = 64, h: int = 64, grey: int = 0x80, dot: tuple[int, int] | None = None) -> None:
    """A grey RGB PNG (every byte `grey`; a white pixel at `dot` (x, y)) written with the standard library."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    def row(y: int) -> bytes:
        r = bytearray([grey]) * (3 * w)
        if dot is not None and dot[1] == y:
            r[3 * dot[0]:3 * dot[0] + 3] = b"\xff\xff\xff"
        return b"\x00" + bytes(r)
    raw = b"".join(row(y) for y in range(h))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
                     chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


class Case(unittest.TestCase):
    def refused_by_both(self, b: Path, pointer: str, words: str, d: Path, *extra: str,
                        validate_only: bool = False) -> str:
        """validate and run both exit 2 naming `pointer` and `words`; run makes no PNG; the secret never shows.
        Returns validate's output."""
        v = validate(b, *extra)
        self.assertEqual(v.returncode, 2, v.stdout + v.stderr)
        self.assertIn(pointer, v.stdout)
        self.assertIn(words, v.stdout)
        self.assertRegex(v.stdout, r"batch\.json:\d+: " + pointer, "the problem's line")
        self.assertNotIn(SECRET, v.stdout + v.stderr)
        if validate_only:
            return v.stdout
        r = run(b, d / "out", *extra)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(pointer, r.stderr)
        self.assertIn(words, r.stderr)
        self.assertEqual(list((d / "out").glob("*.png")) if (d / "out").exists() else [], [])
        self.assertNotIn(SECRET, r.stdout + r.stderr)
        return v.stdout


class ReadsStayInTheirFolder(Case):
    """Rule: a file read for a batch file stays inside the folder it is named relative to (no link out)."""

    def setUp(self):
        self.d = fresh(self.id().rsplit(".", 1)[-1])
        outside = self.d / "elsewhere"
        outside.mkdir()
        (outside / "secret.txt").write_text(SECRET + "\n")
        (self.d / "wildcards").mkdir()
        (self.d / "wildcards" / "colors.txt").write_text("red\nblue\n")

    def test_wildcard_file_linked_out_of_its_folder(self):
        (self.d / "wildcards" / "secret.txt").symlink_to(self.d / "elsewhere" / "secret.txt")
        b = batch(self.d, [{"id": "a", "prompt": "a __secret__ cat", "seed": 1}], wildcards_dir="wildcards")
        self.refused_by_both(b, "/tasks/0/prompt", "leads out of its folder", self.d)
        e = validate(b, "--expand")
        self.assertNotIn(SECRET, e.stdout + e.stderr)

    def test_wildcard_subfolder_linked_out_of_its_folder(self):
        (self.d / "wildcards" / "sub").symlink_to(self.d / "elsewhere")
        b = batch(self.d, [{"id": "a", "prompt": "a __sub/secret__ cat", "seed": -1}], wildcards_dir="wildcards")
        self.refused_by_both(b, "/tasks/0/prompt", "leads out of its folder", self.d)

    def test_link_inside_the_folder_is_followed(self):
        (self.d / "wildcards" / "hues.txt").symlink_to("colors.txt")
        b = batch(self.d, [{"id": "a", "prompt": "a __hues__ cat", "seed": 1}], wildcards_dir="wildcards")
        v = validate(b, "--expand")
        self.assertEqual(v.returncode, 0, v.stdout)
        self.assertRegex(v.stdout, r"a (red|blue) cat")

    def test_images_linked_out_of_the_batch_folder(self):
        here = self.d / "batch"
        here.mkdir()
        png(self.d / "elsewhere" / "init.png")
        (here / "init.png").symlink_to(self.d / "elsewhere" / "init.png")
        b = batch(here, [{"id": "a", "prompt": "x", "seed": 1, "init_image": "init.png"}])
        self.refused_by_both(b, "/tasks/0/init_image", "leads out of its folder", self.d)
        png(here / "real.png")
        (here / "alias.png").symlink_to("real.png")
        b = batch(here, [{"id": "a", "prompt": "x", "seed": 1, "init_image": "alias.png", "strength": 1}])
        v = validate(b)
        self.assertEqual(v.returncode, 0, "a link inside the folder is followed: " + v.stdout)

    def test_model_file_linked_out_of_the_model_folder(self):
        model = self.d / "model"
        shutil.copytree(ARGS.model, model, symlinks=True)
        meta = json.loads((model / "model.json").read_text())
        unet = model / meta["unet"]["file"]
        shutil.move(unet, self.d / "elsewhere" / "unet.ts")
        unet.symlink_to(self.d / "elsewhere" / "unet.ts")
        b = batch(self.d, [{"id": "a", "prompt": "x", "seed": 1}])
        for r in (validate(b, "--model", str(model)),
                  sdxl("run", str(b), "--model", str(model), "--out", str(self.d / "out"))):
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn("leads out of its folder", r.stdout + r.stderr)

    def test_lora_tag_linked_out_of_the_lora_folder(self):
        (self.d / "loras").mkdir()
        (self.d / "elsewhere" / "x.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
        (self.d / "loras" / "x.safetensors").symlink_to(self.d / "elsewhere" / "x.safetensors")
        r = sdxl("generate", "--model", ARGS.model, "--lora-dir", str(self.d / "loras"), "--prompt", "a cat <lora:x:1>",
                 "--steps", "1", "--width", "64", "--height", "64", "--out", str(self.d / "x.png"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("leads out of its folder", r.stderr)


class OneFilePerImage(Case):
    """Rule: no two images of one batch file (over all its shards) get the same output path."""

    def setUp(self):
        self.d = fresh(self.id().rsplit(".", 1)[-1])

    def test_ids_that_become_the_same_file_name(self):
        for k, (a, b_id) in enumerate((("a b", "a_b"), (".x", "_.x"), ("Hero", "hero"))):
            b = batch(self.d, [{"id": a, "prompt": "x", "seed": 7, "count": 3},
                               {"id": b_id, "prompt": "y", "seed": 7, "count": 3}])
            self.refused_by_both(b, "/tasks/1/id", "(/tasks/0)", self.d, validate_only=k > 0)

    def test_template_without_id(self):
        b = batch(self.d, [{"id": "a", "prompt": "x", "seed": 5, "count": 3},
                           {"id": "b", "prompt": "y", "seed": 5, "count": 3}], output={"template": "{seed}.png"})
        self.refused_by_both(b, "/tasks/1/id", "would be written to '5.png'", self.d)
        # the same over shards: shard 1 alone has one task, but shares the folder with shard 0
        r = run(b, self.d / "out", "--shard", "1/2")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("/tasks/1/id", r.stderr)

    def test_random_seeds_that_may_meet(self):
        b = batch(self.d, [{"id": "a", "prompt": "x", "seed": -1, "count": 2},
                           {"id": "b", "prompt": "y", "seed": 12, "count": 2}], output={"template": "{seed}.png"})
        self.refused_by_both(b, "/tasks/1/id", "drawn at run time", self.d)

    def test_distinct_names_pass(self):
        b = batch(self.d, [{"id": "p01", "prompt": "x", "seed": -1, "count": 2},
                           {"id": "p02", "prompt": "y", "seed": -1, "count": 2},
                           {"id": "p03", "prompt": "z", "seed": 1, "count": 2}])
        v = validate(b)
        self.assertEqual(v.returncode, 0, v.stdout)


class WildcardBudget(Case):
    """Rule: wildcard expansion has a budget (text and work), and each file is parsed once."""

    def setUp(self):
        self.d = fresh(self.id().rsplit(".", 1)[-1])
        (self.d / "wildcards").mkdir()

    def test_exponential_chain_is_refused_quickly(self):
        for i in range(40):
            (self.d / "wildcards" / f"w{i}.txt").write_text(f"__w{i + 1}__ __w{i + 1}__\n")
        (self.d / "wildcards" / "w40.txt").write_text("x\n")
        b = batch(self.d, [{"id": "a", "prompt": "__w0__", "seed": 1}], wildcards_dir="wildcards")
        t0 = time.monotonic()
        out = self.refused_by_both(b, "/tasks/0/prompt", "beyond the budget", self.d)
        self.assertLess(time.monotonic() - t0, 30)
        self.assertIn("w0.txt') -> __w1__", out, "the chain of files is named")

    def test_large_file_is_parsed_once(self):
        (self.d / "wildcards" / "big.txt").write_text("".join(f"value {k} {{a|b}}\n" for k in range(150000)))
        b = batch(self.d, [{"id": "a", "prompt": "__big__", "seed": 1, "count": 1000}], wildcards_dir="wildcards")
        t0 = time.monotonic()
        v = validate(b, "--expand", timeout=60)
        took = time.monotonic() - t0
        self.assertEqual(v.returncode, 0, v.stdout[-500:])
        self.assertEqual(v.stdout.count("\na #") + v.stdout.startswith("a #"), 1000)
        self.assertLess(took, 20, "1000 images of one 150000-line file: parsed once, not once per image")


class TextRule(Case):
    """Rule: input text is UTF-8 without control characters; PNG metadata never carries one."""

    def setUp(self):
        self.d = fresh(self.id().rsplit(".", 1)[-1])
        (self.d / "wildcards").mkdir()

    def test_wildcard_line_not_utf8(self):
        (self.d / "wildcards" / "bad.txt").write_bytes(b"good\ncaf\xe9 latin-1\n")
        b = batch(self.d, [{"id": "a", "prompt": "__bad__", "seed": 1, "count": 4}], wildcards_dir="wildcards")
        self.refused_by_both(b, "/tasks/0/prompt", "line 2 is not UTF-8", self.d)

    def test_wildcard_line_with_a_control_character(self):
        (self.d / "wildcards" / "sep.txt").write_bytes(b"lake\x1eugly, blurry\n")
        b = batch(self.d, [{"id": "a", "prompt": "a __sep__", "seed": 1}], wildcards_dir="wildcards")
        self.refused_by_both(b, "/tasks/0/prompt", "U+001E", self.d)

    def test_batch_strings(self):
        b = batch(self.d, [{"id": "a", "prompt": "x\u0000y", "seed": 1}])
        self.refused_by_both(b, "/tasks/0/prompt", "U+0000", self.d)
        b = batch(self.d, [{"id": "a\nb", "prompt": "x", "seed": 1}])
        self.refused_by_both(b, "/tasks/0/id", "line break", self.d)

    def test_multiline_prompt_is_fine_and_png_text_is_clean(self):
        b = batch(self.d, [{"id": "a", "prompt": "line one\nline two\tend", "seed": 1}])
        r = run(b, self.d / "out")
        self.assertEqual(r.returncode, 0, r.stderr)
        data = next((self.d / "out").glob("*.png")).read_bytes()
        self.assertIn(b"line one\nline two end", data, "a line break stays; a tab becomes a space in PNG text")


class ValidateEqualsRun(Case):
    """Rule: validate refuses (exit 2, naming the task, the key and the file) what run would fail on for
    input reasons; run refuses the same; run --skip-invalid fails only that task and makes the others."""

    def setUp(self):
        self.d = fresh(self.id().rsplit(".", 1)[-1])
        png(self.d / "good.png")
        whole = (self.d / "good.png").read_bytes()
        (self.d / "truncated.png").write_bytes(whole[:len(whole) - 40])  # IDAT cut short, no IEND
        corrupt = bytearray(whole)
        corrupt[41] = 0  # the first byte of the IDAT data: no longer a zlib stream
        (self.d / "corrupt.png").write_bytes(bytes(corrupt))

    def skip_invalid_fails_only(self, b: Path, bad_id: str, good_ids: list[str], *extra: str) -> None:
        r = run(b, self.d / "out", "--skip-invalid", *extra)
        self.assertEqual(r.returncode, 3, r.stderr)
        files = sorted(p.name for p in (self.d / "out").glob("*.png"))
        self.assertEqual([f.split("-")[0] for f in files], sorted(good_ids), "every valid task's image exists")
        self.assertIn(f"skipping invalid task {bad_id}", r.stderr)

    def test_truncated_init_image(self):
        b = batch(self.d, [{"id": "ok", "prompt": "x", "seed": 1},
                           {"id": "bad", "prompt": "x", "seed": 1, "init_image": "truncated.png"}])
        self.refused_by_both(b, "/tasks/1/init_image", "truncated.png' is not a readable PNG", self.d)
        self.skip_invalid_fails_only(b, "bad", ["ok"])

    def test_corrupt_control_and_reference_images(self):
        for key, value, pointer in (
                ("controlnets", [{"model": "cn", "image": "corrupt.png"}], "/tasks/1/controlnets/0/image"),
                ("ip_adapter", {"model": "ip", "images": ["good.png", "truncated.png"]}, "/tasks/1/ip_adapter/images/1")):
            b = batch(self.d, [{"id": "ok", "prompt": "x", "seed": 1}, {"id": "bad", "prompt": "x", "seed": 1, key: value}])
            v = validate(b)
            self.assertEqual(v.returncode, 2, v.stdout)
            self.assertRegex(v.stdout, pointer + r": '[^']*(corrupt|truncated)\.png' is not a readable PNG", key)

    def test_png_over_the_pixel_limit(self):
        head = bytearray((self.d / "good.png").read_bytes())
        head[16:24] = struct.pack(">II", 20000, 16000)  # IHDR's width and height: 320 megapixels
        head[29:33] = struct.pack(">I", zlib.crc32(bytes(head[12:29])) & 0xFFFFFFFF)
        (self.d / "huge.png").write_bytes(bytes(head))
        b = batch(self.d, [{"id": "ok", "prompt": "x", "seed": 1},
                           {"id": "bad", "prompt": "x", "seed": 1, "width": 64, "height": 64, "init_image": "huge.png"}])
        t0 = time.monotonic()
        self.refused_by_both(b, "/tasks/1/init_image", "more than the 268435456 pixels", self.d)
        self.assertLess(time.monotonic() - t0, 30, "refused from the header, not decoded")

    def embeddings(self, tensors: dict) -> Path:
        from safetensors.numpy import save_file
        emb = self.d / "emb"
        shutil.rmtree(emb, ignore_errors=True)
        emb.mkdir()
        save_file(tensors, str(emb / "inkstyle.safetensors"))
        return emb

    def test_embeddings_the_run_would_refuse(self):
        import numpy as np
        width = [t["hidden_dim"] for t in json.loads((Path(ARGS.model) / "model.json").read_text())["text_encoders"]]
        nan = np.zeros((1, width[1]), np.float16)
        nan[0, 3] = np.nan
        cases = {
            "wrong width": ({"clip_l": np.zeros((1, width[0] + 1), np.float32), "clip_g": np.zeros((1, width[1]), np.float32)},
                            "'clip_l' has shape [1, %d], this model needs [n, %d]" % (width[0] + 1, width[0])),
            "NaN": ({"clip_l": np.zeros((1, width[0]), np.float32), "clip_g": nan}, "'clip_g' contains NaN or Inf"),
            "int dtype": ({"clip_l": np.zeros((1, width[0]), np.int32), "clip_g": np.zeros((1, width[1]), np.int32)},
                          "'clip_l' has dtype I32"),
        }
        b = batch(self.d, [{"id": "ok", "prompt": "x, inkstyle", "seed": 1}])
        for name, (tensors, why) in cases.items():
            emb = self.embeddings(tensors)
            v = validate(b, "--model", ARGS.model, "--embedding-dir", str(emb))
            self.assertEqual(v.returncode, 2, f"{name}: {v.stdout}")
            self.assertIn("inkstyle.safetensors", v.stdout, name)
            self.assertIn(why, v.stdout, name)
            r = run(b, self.d / "out", "--embedding-dir", str(emb))
            self.assertEqual(r.returncode, 2, f"{name}: {r.stderr}")
            self.assertIn(why, r.stderr, name)
        emb = self.embeddings({"clip_l": np.zeros((1, width[0]), np.float16), "clip_g": np.zeros((1, width[1]), np.float16)})
        v = validate(b, "--model", ARGS.model, "--embedding-dir", str(emb))
        self.assertEqual(v.returncode, 0, "a good embedding passes: " + v.stdout)

    def test_bad_masks(self):
        """Each bad mask refuses the batch in validate and run (exit 2, the task's pointer and the file);
        --skip-invalid makes the other task. An empty mask is an error, not a copy of the init image
        (docs/prompts-and-samplers.md, "Inpainting", says why)."""
        png(self.d / "white.png")  # grey 0x80 >= 0.5: marks everything
        png(self.d / "wide.png", 128, 64)
        png(self.d / "black.png", grey=0)
        png(self.d / "speck.png", grey=0, dot=(30, 30))  # one white pixel: a blur of 8 fades it below 0.5
        for mask, extra, words in (
                ("truncated.png", {"init_image": "good.png"}, "truncated.png' is not a readable PNG"),
                ("white.png", {}, "white.png' is a mask but the task has no init image"),
                ("wide.png", {"init_image": "good.png"}, "wide.png' is 128x64, another aspect ratio"),
                ("black.png", {"init_image": "good.png"}, "black.png' is an empty mask"),
                ("speck.png", {"init_image": "good.png", "mask_blur": 8}, "speck.png' marks nothing to repaint")):
            with self.subTest(mask=mask):
                b = batch(self.d, [{"id": "ok", "prompt": "x", "seed": 1},
                                   {"id": "bad", "prompt": "x", "seed": 1, "mask": mask, **extra}])
                # with the model: the blur on the model's latent grid is checked too
                v = validate(b, "--model", ARGS.model)
                self.assertEqual(v.returncode, 2, v.stdout + v.stderr)
                self.assertRegex(v.stdout, r"batch\.json:\d+: /tasks/1/mask\b")
                self.assertIn(words, v.stdout)
                r = run(b, self.d / "out")
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn("/tasks/1/mask", r.stderr)
                self.assertIn(words, r.stderr)
                self.assertEqual(list((self.d / "out").glob("*.png")) if (self.d / "out").exists() else [], [])
        self.skip_invalid_fails_only(b, "bad", ["ok"])

    def test_unknown_lora_in_a_prompt_tag(self):
        (self.d / "loras").mkdir()
        b = batch(self.d, [{"id": "ok", "prompt": "x", "seed": 1},
                           {"id": "bad", "prompt": "x <lora:nosuch:0.8>", "seed": 1}])
        out = self.refused_by_both(b, "/tasks/1/prompt", "LoRA 'nosuch'", self.d, "--lora-dir", str(self.d / "loras"))
        self.assertIn(str(self.d / "loras"), out, "the folders searched are named")
        self.skip_invalid_fails_only(b, "bad", ["ok"], "--lora-dir", str(self.d / "loras"))


class Round3(Case):
    """Issue 56's findings on the batch file (validate = run): folder keys confined like files (M9), a
    strength of 0 with an init image (M6), a detailer prompt's unknown LoRA tag (M7)."""

    def setUp(self):
        self.d = fresh(self.id().rsplit(".", 1)[-1])
        (self.d / "elsewhere" / "folder").mkdir(parents=True)
        (self.d / "elsewhere" / "folder" / "model.json").write_text(SECRET)
        self.here = self.d / "batch"
        self.here.mkdir()
        (self.here / "linked").symlink_to(self.d / "elsewhere" / "folder")
        png(self.here / "pose.png")

    def test_folder_keys_linked_out_of_the_batch_folder(self):
        cases = [({"vae": "linked"}, "/tasks/0/vae"),
                 ({"controlnets": [{"model": "linked", "image": "pose.png"}]}, "/tasks/0/controlnets/0/model"),
                 ({"ip_adapter": {"model": "linked", "images": ["pose.png"]}}, "/tasks/0/ip_adapter/model"),
                 ({"upscale": {"model": "linked", "scale": 2}}, "/tasks/0/upscale/model"),
                 ({"detailer": [{"detector": "linked"}]}, "/tasks/0/detailer/0/detector"),
                 ({"hires": {"scale": 2, "upscaler": "linked"}}, "/tasks/0/hires/upscaler")]
        for key, pointer in cases:
            with self.subTest(pointer=pointer):
                b = batch(self.here, [{"id": "a", "prompt": "x", "seed": 1, **key}])
                self.refused_by_both(b, pointer, "leads out of its folder", self.d)

    def test_strength_zero_with_an_init_image(self):
        png(self.here / "init.png")
        b = batch(self.here, [{"id": "a", "prompt": "x", "seed": 1, "init_image": "init.png", "strength": 0}])
        self.refused_by_both(b, "/tasks/0/strength", "needs a strength above 0", self.d)
        r = sdxl("generate", "--model", ARGS.model, "--prompt", "x", "--init-image", str(self.here / "init.png"),
                 "--strength", "0", "--steps", "2", "--out", str(self.d / "g.png"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--strength is 0", r.stderr)
        self.assertNotIn("loading", r.stderr.lower(), "refused before the weights load")

    def test_unknown_lora_in_a_detailer_prompt(self):
        b = batch(self.here, [{"id": "a", "prompt": "x", "seed": 1,
                               "detailer": [{"detector": "linked", "prompt": "[PROMPT], <lora:nobody:1>"}]}])
        out = self.refused_by_both(b, "/tasks/0/detailer/0/prompt", "detailer prompt", self.d)
        self.assertIn("nobody", out)

    def test_pinned_folders(self):
        """M10: a batch file pins a folder by its model.json's sha256; validate and run refuse another folder
        (a replaced model.json, or a file that differs from what it records) before anything loads."""
        import hashlib
        model = self.here / "model"
        shutil.copytree(ARGS.model, model)
        want = hashlib.sha256((model / "model.json").read_bytes()).hexdigest()
        b = batch(self.here, [{"id": "a", "prompt": "x", "seed": 1}], pins={"model": want.upper()})
        v = validate(b, "--model", str(model))
        self.assertEqual(v.returncode, 0, v.stdout + v.stderr)
        b = batch(self.here, [{"id": "a", "prompt": "x", "seed": 1}], pins={"model": "0" * 64})
        self.refused_by_both(b, "/pins/model", "the folder is not the one pinned", self.d)
        meta = json.loads((model / "model.json").read_text())
        victim = model / meta["unet"]["file"]
        victim.write_bytes(victim.read_bytes() + b"\0")
        b = batch(self.here, [{"id": "a", "prompt": "x", "seed": 1}], pins={"model": want})
        out = self.refused_by_both(b, "/pins/model", "the folder is not the one pinned", self.d)
        self.assertIn(meta["unet"]["file"], out)
        b = batch(self.here, [{"id": "a", "prompt": "x", "seed": 1}], pins={"linked": want, "model": "abc"})
        out = self.refused_by_both(b, "/pins/linked", "leads out of its folder", self.d)
        self.assertIn("/pins/model", out)


class SamplingKeys(Case):
    """Issue 61's keys (validate = run, at their pointer): a timestep list that is empty, out of
    range, not strictly decreasing, not a list, given with a sampler whose diffusers scheduler takes
    none, or beside a different "steps"; eta outside [0, 1]."""

    def test_bad_timesteps_and_eta(self):
        d = fresh("sampling_keys")
        cases = [({"timesteps": []}, "/tasks/0/timesteps", "at least one timestep"),
                 ({"timesteps": [999, 1000]}, "/tasks/0/timesteps", "item 1 (1000) is out of range"),
                 ({"timesteps": [499, 749]}, "/tasks/0/timesteps", "strictly decreasing"),
                 ({"timesteps": "999,749"}, "/tasks/0/timesteps", "must be a list of integer timesteps"),
                 ({"timesteps": [999, 499], "sampler": "DDIM"}, "/tasks/0/timesteps", "sampler 'DDIM' takes no"),
                 ({"timesteps": [999, 499], "sampler": "Euler", "schedule": "Karras"}, "/tasks/0/timesteps",
                  "not 'Karras'"),
                 ({"timesteps": [999, 499], "steps": 3}, "/tasks/0/steps", "holds 2"),
                 ({"eta": 1.5, "sampler": "TCD"}, "/tasks/0/eta", "eta")]
        for i, (keys, pointer, words) in enumerate(cases):
            with self.subTest(keys=keys):
                b = batch(d, [{"id": "a", "prompt": "x", "seed": 1, **keys}])
                # run too for every other case (one check serves both; this keeps the test short)
                self.refused_by_both(b, pointer, words, d, validate_only=i % 2 == 1)
        r = sdxl("generate", "--model", ARGS.model, "--prompt", "x", "--sampler", "UniPC", "--timesteps", "999,499",
                 "--out", str(d / "g.png"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("sampler 'UniPC' takes no timestep list", r.stderr)
        self.assertNotIn("loading", r.stderr.lower(), "refused before the weights load")


if __name__ == "__main__":
    sys.exit(main(__doc__, "--binary", "--model", "--work"))
