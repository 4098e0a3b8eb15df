#!/usr/bin/env python3
"""Hostile conditions of a run through the real binary on the tiny model (ctest label e2e).

Each test names the rule it checks (issue 46): shards on other hosts keep their
temporary files, durations are finite, embedding names collide as prompts match
them, a LoRA named twice applies once, a dry run of 100k images is quick,
SIGHUP / SIGUSR1 stop gracefully, --verify-model checks ControlNet and
IP-Adapter folders, and a problem in "defaults" is reported there.

    test_hostile_run.py --binary BUILD/sdxl-batch --model TINY_MODEL_DIR --work DIR
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import unittest
from pathlib import Path

from e2e_common import ARGS, fresh, main, sdxl


DEAD_PID = 4194305  # above Linux's largest pid (2^22): no process has it on this host


def batch(d: Path, tasks: list[dict], name: str = "batch.json", **top) -> Path:
    p = d / name
    defaults = {"steps": 2, **top.pop("defaults", {})}
    p.write_text(json.dumps({"version": 1, "defaults": defaults, "tasks": tasks, **top}))
    return p


def run(b: Path, out: Path, *extra: str, **kw) -> subprocess.CompletedProcess:
    return sdxl("run", str(b), "--model", ARGS.model, "--out", str(out), *extra, **kw)


def model_json(model: str | Path = "") -> dict:
    return json.loads((Path(model or ARGS.model) / "model.json").read_text())


def write_safetensors(path: Path, tensors: dict[str, tuple[list[int], list[float]]]) -> None:
    """A float32 safetensors file (no torch needed): name -> (shape, values)."""
    header, blobs, offset = {}, [], 0
    for name, (shape, values) in tensors.items():
        blob = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def pixels(png: Path) -> bytes:
    from PIL import Image
    return Image.open(png).convert("RGB").tobytes()


def host_identity() -> str:
    """What sdxl-batch writes for this host in temporary names: hostname@pid-namespace inode."""
    safe = lambda s: re.sub(r"[^A-Za-z0-9_@-]", "_", s)
    ns = re.search(r"\[(\d+)\]", os.readlink("/proc/self/ns/pid"))
    return safe(socket.gethostname()[:64]) + ("@" + ns.group(1) if ns else "")


class TempFilesOfOtherHosts(unittest.TestCase):
    def test_start_up_removes_only_temp_files_provably_dead_here(self):
        d = fresh("temp-hosts")
        out = d / "out"
        out.mkdir()
        me = host_identity()
        keep = [  # in flight on another host, or of a writer this host cannot see: never removed
            f".a-0-5.png.{DEAD_PID}.0.tmp",                                   # no host in the name (older versions)
            f".a-0-5.png~node7@4026531836~{DEAD_PID}~shard-1-of-2~0.tmp",     # another host (or pod)
            f".a-0-5.png~{me}~{os.getpid()}~shard-1-of-2~3.tmp",              # this host, a live process
        ]
        gone = [f".a-0-5.png~{me}~{DEAD_PID}~shard-0-of-2~1.tmp"]            # this host, a dead process
        for name in keep + gone:
            (out / name).write_bytes(b"half a png")
        r = run(batch(d, [{"id": "a", "prompt": "a lighthouse", "seed": 5}]), out)
        self.assertEqual(r.returncode, 0, r.stderr)
        left = {p.name for p in out.iterdir()}
        for name in keep:
            self.assertIn(name, left, "a temporary file the run cannot prove dead was removed")
        for name in gone:
            self.assertNotIn(name, left, "a temporary file of a dead process of this host was left")


class Durations(unittest.TestCase):
    def test_non_finite_and_negative_durations_are_refused(self):
        d = fresh("durations")
        b = batch(d, [{"id": "a", "prompt": "x", "seed": 1}])
        for flag, values in (("--timeout", ("nan", "-5")), ("--max-runtime", ("inf", "1m-nan")),
                             ("--aging", ("infinity", "1e308h"))):
            for value in values:
                r = run(b, d / "out", flag, value, "--dry-run")
                self.assertEqual(r.returncode, 2, f"{flag} {value}: {r.stdout}{r.stderr}")
                self.assertIn(flag, r.stderr, f"{flag} {value}")
        for value in ("nan", "0s"):
            r = sdxl("validate", str(batch(d, [{"id": "a", "prompt": "x", "timeout": value}], name="t.json")))
            self.assertEqual(r.returncode, 2, f"timeout {value}: {r.stdout}")
            self.assertIn("/tasks/0/timeout", r.stdout, value)

    def test_zero_means_no_limit_as_the_help_says(self):
        d = fresh("durations-zero")
        r = run(batch(d, [{"id": "a", "prompt": "x", "seed": 1, "count": 2}]), d / "out",
                "--max-runtime", "0", "--timeout", "0", "--aging", "0")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(list((d / "out").glob("*.png"))), 2)
        help_text = " ".join(sdxl("run", "--help").stdout.split())
        for flag in ("--max-runtime", "--timeout"):
            self.assertRegex(help_text, re.escape(flag) + r" [^-]*0: no limit", flag)


class EmbeddingNames(unittest.TestCase):
    def test_a_name_that_is_a_word_in_another_case_is_refused(self):
        m = model_json()
        widths = [m["text_encoders"][0]["hidden_dim"], m["text_encoders"][1]["hidden_dim"]]
        for name in ("cat", "Cat", "CAT"):
            d = fresh("embedding-" + name)
            write_safetensors(d / f"{name}.safetensors", {"clip_l": ([1, widths[0]], [0.0] * widths[0]),
                                                          "clip_g": ([1, widths[1]], [0.0] * widths[1])})
            r = sdxl("tokens", "--model", ARGS.model, "--embedding-dir", str(d), "a cat on a mat")
            self.assertEqual(r.returncode, 2, f"{name}: {r.stdout}{r.stderr}")
            self.assertIn("already a word of the tokenizer", r.stderr, name)
            self.assertIn(f"{name}.safetensors", r.stderr, name)


class LoraNamedTwice(unittest.TestCase):
    def test_a_characters_lora_and_the_same_tag_apply_once(self):
        d = fresh("lora-twice")
        (d / "loras").mkdir()
        width = model_json()["text_encoders"][0]["hidden_dim"]
        rank, values = 4, [((k * 7919) % 23 - 11) / 4.0 for k in range(4 * width)]
        key = "lora_te1_text_model_encoder_layers_0_self_attn_v_proj"  # a text-encoder weight [width, width]
        write_safetensors(d / "loras" / "ink.safetensors", {
            f"{key}.lora_down.weight": ([rank, width], values[: rank * width]),
            f"{key}.lora_up.weight": ([width, rank], values[::-1][: width * rank]),
            f"{key}.alpha": ([], [float(rank)])})
        b = batch(d, [
            {"id": "plain", "prompt": "a keeper", "seed": 7},
            {"id": "tagged", "prompt": "a keeper <lora:ink:0.5>", "seed": 7},
            {"id": "clash", "prompt": "a keeper <lora:ink:0.9>", "seed": 7}],
            loras={"ink": {"path": "loras/ink.safetensors"}},
            characters={"mara": {"prompt": "", "loras": [{"name": "ink", "weight": 0.5}]}},
            defaults={"characters": ["mara"]})
        r = run(b, d / "out", "--retries", "0")
        self.assertEqual(r.returncode, 2, "the clash is an input problem, refused before the run: " + r.stderr)
        self.assertIn("/tasks/2/prompt", r.stderr)
        self.assertIn("at weight", r.stderr)
        self.assertFalse((d / "out").exists() and list((d / "out").glob("*.png")), "nothing made from a refused batch")
        b.write_text(json.dumps({**json.loads(b.read_text()), "tasks": json.loads(b.read_text())["tasks"][:2]}))
        r = run(b, d / "out", "--retries", "0")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("weights patched", r.stderr, "the test LoRA must touch the model")
        plain, tagged = (next((d / "out").glob(f"{t}-*.png")) for t in ("plain", "tagged"))
        self.assertEqual(pixels(plain), pixels(tagged), "a LoRA named by the character and the prompt at one weight "
                                                        "must apply once")
        r = sdxl("generate", "--model", ARGS.model, "--lora", f"{d}/loras/ink.safetensors:0.5", "--lora-dir",
                 str(d / "loras"), "--prompt", "x <lora:ink:0.7>", "--steps", "1", "--out", str(d / "g.png"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("at weight", r.stderr)


class Planning(unittest.TestCase):
    def test_dry_run_of_100k_images_takes_seconds(self):
        d = fresh("plan-100k")
        prios = ["high", "mid", "low"]
        tasks = [{"id": f"t{k}", "prompt": "x", "seed": k * 1000, "count": 100, "priority": prios[k % 3]}
                 for k in range(1000)]
        b = batch(d, tasks)
        t0 = time.monotonic()
        try:
            r = run(b, d / "out", "--dry-run", "--max-batch", "4", timeout=60)
        except subprocess.TimeoutExpired:
            self.fail("the dry run of 100k images took over 60 s (quadratic planning)")
        took = time.monotonic() - t0
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertIn("25000 batch(es)", r.stdout)
        self.assertLess(took, 15, f"the dry run of 100k images took {took:.1f} s")


class StopSignals(unittest.TestCase):
    def test_sighup_and_sigusr1_stop_like_sigterm_with_a_report(self):
        for sig in (signal.SIGHUP, signal.SIGUSR1):
            d = fresh(f"signal-{sig.name}")
            out = d / "out"
            b = batch(d, [{"id": "s", "prompt": "x", "seed": 3, "count": 40}])
            env = dict(os.environ, OMP_NUM_THREADS="1")
            p = subprocess.Popen([ARGS.binary, "run", str(b), "--model", ARGS.model, "--out", str(out)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
            deadline = time.time() + 60
            while time.time() < deadline and not list(out.glob("s-*.png")) and p.poll() is None:
                time.sleep(0.05)
            p.send_signal(sig)
            _, err = p.communicate(timeout=120)
            self.assertEqual(p.returncode, 3, f"{sig.name}: {err[-2000:]}")
            report = json.loads((out / "report.json").read_text())
            self.assertEqual(report["stop_reason"], "stopped by a signal", sig.name)
            self.assertGreater(report["images_not_started"], 0, sig.name)


class VerifyFolders(unittest.TestCase):
    @staticmethod
    def folder(d: Path, kind: str, block: str, fields: dict, main: str) -> Path:
        f = d / kind
        f.mkdir()
        data = os.urandom(4096)
        (f / main).write_bytes(data)
        files = {main: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
        (f / "model.json").write_text(json.dumps({"format_version": 1, "kind": kind, "name": kind, "dtype": "fp32",
                                                  "export_device": "cpu", block: fields, "files": files}))
        return f

    def test_verify_model_checks_controlnet_and_ip_adapter_folders(self):
        from PIL import Image
        d = fresh("verify-folders")
        m = model_json()
        unet = m["unet"]
        cn = self.folder(d, "controlnet", "controlnet", {
            "file": "controlnet.ts", "in_channels": m.get("latent_channels", 4),
            "context_dim": unet["context_dim"], "pooled_dim": unet["pooled_dim"], "cond_channels": 3,
            "downscale": m.get("vae_downsample", 8), **unet["control"]}, "controlnet.ts")
        ip = self.folder(d, "ip_adapter", "adapter", {
            "file": "ip_adapter.ts", "tokens": 4, "cross_attention_dim": unet["ip_adapter"]["cross_attention_dim"],
            "layers": unet["ip_adapter"]["layers"]}, "ip_adapter.ts")
        meta = json.loads((ip / "model.json").read_text())
        meta["variant"] = "plain"
        meta["image_encoder"] = {"file": "ip_adapter.ts", "image_size": 32, "mean": [0.5] * 3, "std": [0.5] * 3,
                                 "resample": "bicubic", "output": "image_embeds", "negative": "zero_embeds"}
        (ip / "model.json").write_text(json.dumps(meta))
        Image.new("RGB", (64, 64)).save(d / "pose.png")
        b = batch(d, [{"id": "c", "prompt": "x", "controlnets": [{"model": "controlnet", "image": "pose.png"}]},
                      {"id": "i", "prompt": "x", "ip_adapter": {"model": "ip_adapter", "images": ["pose.png"]}}])
        r = run(b, d / "out", "--verify-model", "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("2 file(s) of 2 folder(s) beside the model match", r.stderr)
        for folder, main in ((cn, "controlnet.ts"), (ip, "ip_adapter.ts")):
            data = bytearray((folder / main).read_bytes())
            data[100] ^= 0x01
            (folder / main).write_bytes(bytes(data))
            r = run(b, d / "out", "--verify-model", "--dry-run")
            self.assertEqual(r.returncode, 1, f"{main}: {r.stderr}")
            self.assertIn(f"{main}' has sha256", r.stderr)
            data[100] ^= 0x01
            (folder / main).write_bytes(bytes(data))


class Pointers(unittest.TestCase):
    def test_a_brace_error_in_the_defaults_negative_points_there_once(self):
        d = fresh("pointer")
        b = batch(d, [{"id": "a", "prompt": "x {a|b}"}, {"id": "b", "prompt": "y"}],
                  defaults={"negative": "blurry, {ugly|bad"})
        r = sdxl("validate", str(b))
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("/defaults/negative", r.stdout)
        self.assertEqual(r.stdout.count("/defaults/negative"), 1, r.stdout)
        self.assertNotIn("/tasks/0/prompt", r.stdout)
        b = batch(d, [{"id": "a", "prompt": "x", "negative": "{ugly|bad"}], name="task.json")
        r = sdxl("validate", str(b))
        self.assertIn("/tasks/0/negative", r.stdout)


if __name__ == "__main__":
    sys.exit(main(__doc__, "--binary", "--model", "--work"))
