#!/usr/bin/env python3
"""End-to-end tests of unattended runs on the tiny model (ctest label e2e):
kill -9 at random moments then rerun (no half file, nothing lost, nothing twice),
the lock (exit 4), SIGTERM (finishes the image in flight, writes the report),
shards into one folder, `validate`.

    test_batch_ops.py --binary B --model TINY --work DIR [--kills N]
"""
from __future__ import annotations

import hashlib
import json
import random
import signal
import subprocess
import sys
import time
import unittest
from pathlib import Path

from e2e_common import ARGS, ENV, fresh, main, read_report, run
from PIL import Image


def write_batch(path: Path, tasks: int = 5, count: int = 2, steps: int = 3) -> list[tuple[str, int]]:
    items = []
    spec = {"version": 1, "defaults": {"steps": steps, "negative": "blurry"}, "tasks": []}
    for t in range(tasks):
        spec["tasks"].append({"id": f"scene-{t:02d}", "prompt": f"comic panel {t}, a cat on a roof", "seed": 100 + t * 10,
                              "count": count})
        items += [(f"scene-{t:02d}", i) for i in range(count)]
    path.write_text(json.dumps(spec, indent=1))
    return items


def run_cmd(*args: str) -> list[str]:
    return [ARGS.binary, "run", *args, "--model", ARGS.model, "--threads", "1"]


def run_batch(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`run` with these arguments, waited for."""
    return run(run_cmd(*args), timeout=timeout)


def check_folder(test: unittest.TestCase, out: Path) -> dict:
    """Every PNG decodes whole; manifest lines (but a torn last one) parse, match their files, are unique."""
    for png in out.glob("*.png"):
        with Image.open(png) as im:
            im.load()  # raises on a truncated file
    entries, seen = {}, set()
    for manifest in sorted(out.glob("manifest*.jsonl")):  # the plain run's and each shard's
        lines = manifest.read_text().splitlines()
        for n, line in enumerate(lines):
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                test.assertEqual(n, len(lines) - 1, "only the last manifest line may be torn")
                continue
            key = (e["task"], e["index"])
            test.assertNotIn(key, seen, f"duplicate manifest line {key}")
            seen.add(key)
            data = (out / e["file"]).read_bytes()
            test.assertEqual(hashlib.sha256(data).hexdigest(), e["sha256"], e["file"])
            entries[key] = e
    return entries


class CrashSafety(unittest.TestCase):
    def test_kill_at_random_moments_then_resume(self):
        work = fresh("kill")
        out = work / "out"
        items = write_batch(work / "batch.json", tasks=8, count=2, steps=3)
        rng = random.Random(1234)
        kills = 0
        for _ in range(ARGS.kills):
            p = subprocess.Popen(run_cmd(str(work / "batch.json"), "--out", str(out)), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, env=ENV)
            time.sleep(rng.uniform(0.3, 4.0))
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                kills += 1
            p.wait()
            check_folder(self, out)
        r = run_batch(str(work / "batch.json"), "--out", str(out))
        self.assertEqual(r.returncode, 0, r.stderr)
        entries = check_folder(self, out)
        self.assertEqual(set(entries), set(items))
        pngs = sorted(p.name for p in out.glob("*.png"))
        self.assertEqual(pngs, sorted(e["file"] for e in entries.values()), "a PNG outside the manifest or missing")
        self.assertEqual([p.name for p in out.rglob("*.tmp")], [], "temporary files left behind")
        print(f"killed {kills} of {ARGS.kills} runs at random moments; the rerun completed {len(items)} images")


class Unattended(unittest.TestCase):
    def test_lock_sigterm_and_report(self):
        work = fresh("lock")
        out = work / "out"
        write_batch(work / "batch.json", tasks=6, count=2, steps=6)
        first = subprocess.Popen(run_cmd(str(work / "batch.json"), "--out", str(out)), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, env=ENV)
        deadline = time.time() + 120
        while time.time() < deadline and not (out / "manifest.jsonl").exists():
            time.sleep(0.1)
        second = run_batch(str(work / "batch.json"), "--out", str(out), timeout=120)
        self.assertEqual(second.returncode, 4, second.stderr)
        self.assertIn("holds the lock", second.stderr)
        self.assertIn(str(first.pid), second.stderr)
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=300)
        self.assertEqual(first.returncode, 3, err)
        report = read_report(out)
        self.assertEqual(report["stop_reason"], "stopped by a signal")
        self.assertGreater(report["images_not_started"], 0)
        check_folder(self, out)
        r = run_batch(str(work / "batch.json"), "--out", str(out))
        self.assertEqual(r.returncode, 0, r.stderr)
        report = read_report(out)
        self.assertEqual(report["images_done"] + report["images_skipped"], 12)

    def test_shards_share_one_folder(self):
        work = fresh("shards")
        out = work / "out"
        items = write_batch(work / "batch.json", tasks=5, count=1, steps=2)
        for k in range(3):
            r = run_batch(str(work / "batch.json"), "--out", str(out), "--shard", f"{k}/3", timeout=600)
            self.assertEqual(r.returncode, 0, r.stderr)
        entries = check_folder(self, out)
        self.assertEqual(set(entries), set(items))
        self.assertEqual(sorted(p.name for p in out.glob("manifest*.jsonl")),
                         [f"manifest-shard-{k}-of-3.jsonl" for k in range(3)], "one manifest per shard")
        r = run_batch(str(work / "batch.json"), "--out", str(out), timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(read_report(out)["images_done"], 0,
                         "a plain run reads the shards' manifests: nothing left to make")
        r = run_batch(str(work / "batch.json"), "--out", str(out), "--shard", "3/3")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--shard", r.stderr)

    def test_skip_invalid_runs_the_valid_tasks(self):
        work = fresh("skip-invalid")
        batch = work / "batch.json"
        batch.write_text(json.dumps({"version": 1, "defaults": {"steps": 2}, "tasks": [
            {"id": "good", "prompt": "x", "seed": 1},
            {"id": "bad-steps", "prompt": "y", "seed": 2, "steps": 999},
            {"id": "bad-size", "prompt": "z", "seed": 3, "width": 8200}]}))
        r = run_batch(str(batch), "--out", str(work / "refused"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertFalse((work / "refused" / "manifest.jsonl").exists(), "nothing runs without --skip-invalid")
        r = run_batch(str(batch), "--out", str(work / "out"), "--skip-invalid", timeout=600)
        self.assertEqual(r.returncode, 3, r.stderr)
        report = read_report(work / "out")
        self.assertEqual(report["images_done"], 1)
        self.assertEqual(sorted(f["task"] for f in report["failures"]), ["bad-size", "bad-steps"])
        self.assertIn("/tasks/1/steps", json.dumps(report["failures"]))

    def test_validate(self):
        work = Path(ARGS.work) / "validate"
        work.mkdir(parents=True, exist_ok=True)
        good = work / "good.json"
        write_batch(good)
        r = run([ARGS.binary, "validate", str(good), "--model", ARGS.model])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        bad = work / "bad.json"
        bad.write_text('{\n  "version": 1,\n  "tasks": [\n    {"id": "a", "prompt": "x",\n     "steps": 900},\n'
                       '    {"id": "a", "prompt": "y", "width": 100}\n  ]\n}\n')
        r = run([ARGS.binary, "validate", str(bad), "--model", ARGS.model])
        self.assertEqual(r.returncode, 2)
        self.assertIn(f"{bad}:5: /tasks/0/steps", r.stdout)
        self.assertIn(f"{bad}:6: /tasks/1/id", r.stdout)
        self.assertIn("/tasks/1/width", r.stdout)


if __name__ == "__main__":
    sys.exit(main(__doc__, "--binary", "--model", "--work",
                  extra=lambda ap: ap.add_argument("--kills", type=int, default=12)))
