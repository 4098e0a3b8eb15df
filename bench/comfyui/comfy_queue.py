#!/usr/bin/env python3
"""ComfyUI as its API users run it: its own server (main.py, headless: no browser, no frontend
package) on loopback, every panel POSTed to /prompt in file order, the queue drained, each
prompt's status read back from /history. Times, GPU busy and GPU memory of each workload.

  comfy_queue.py --comfy SRC --base DIR --out FILE.json [--port 8190] [--flags "--fast"]
                 [--warmup PROMPTS.json] [--deadline EPOCH_S] RUN=PROMPTS.json ...

SRC is ComfyUI's source (bench/comfyui/gather.sh), DIR its --base-directory (models/, input/,
output/: run.sh lays it out). The server starts with --listen 127.0.0.1 --port P
--base-directory DIR --front-end-root DIR/frontend (an empty folder: the UI's files are never
served) --disable-auto-launch, plus --flags; its log goes to FILE.json's folder as
comfy-server-LABEL.log (LABEL: FILE.json's stem). --warmup: the first prompt of that file, run
with another seed before anything is timed, so that the model load, cuDNN's and cuBLAS's set-up
and the first shapes stay out of the rates (as sdxl-batch's rates exclude its load).

Each RUN: all prompts queued at once (as a script over the API does), then the wall time from the
first POST to the queue being empty; images = the prompts' EmptyLatentImage batch sizes; GPU busy
= the share of nvidia-smi samples (100 ms) with utilisation > 0; peak GPU memory = the largest
memory.used sample (the whole card: CUDA context, PyTorch's cache and all). A failed prompt is
counted and its error kept; a run past --run-timeout (400 s) is stopped (the queue cleared, the
prompt in flight interrupted) and its unfinished prompts counted. FILE.json is rewritten after
each run (partial results survive a timeout). A RUN that would start after --deadline is skipped and says so.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path


class Sampler:
    """nvidia-smi's utilisation.gpu and memory.used every 100 ms, while running."""

    def __init__(self) -> None:
        self.util: list[float] = []
        self.mem: list[float] = []
        self.proc = None
        self.thread = None

    def __enter__(self) -> "Sampler":
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
                                          "--format=csv,noheader,nounits", "-lms", "100"],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except FileNotFoundError:  # a CPU dry run
            return self
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                u, m = (float(x) for x in line.split(",")[:2])
            except ValueError:
                continue
            self.util.append(u)
            self.mem.append(m)

    def __exit__(self, *exc) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait()
            self.thread.join(timeout=2)

    def summary(self) -> dict:
        if not self.util:
            return {"gpu_busy": None, "peak_memory_used_mib": None, "samples": 0}
        return {"gpu_busy": sum(1 for u in self.util if u > 0) / len(self.util),
                "peak_memory_used_mib": max(self.mem), "samples": len(self.util)}


def http(url: str, body: dict | None = None, timeout: float = 30) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"{}")


def wait_ready(base: str, server: subprocess.Popen, timeout_s: float) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if server.poll() is not None:
            raise SystemExit(f"the ComfyUI server exited with {server.returncode} before answering (see its log)")
        try:
            http(base + "/system_stats", timeout=2)
            return time.time() - t0
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.5)
    raise SystemExit(f"the ComfyUI server did not answer within {timeout_s:.0f} s")


def queue(base: str, prompts: list[dict]) -> list[str]:
    ids = []
    for p in prompts:
        try:
            ids.append(http(base + "/prompt", {"prompt": p, "client_id": "sdxl-batch-bench"}, timeout=300)["prompt_id"])
        except urllib.error.HTTPError as e:  # refused at validation: the body names the node and input
            raise SystemExit(f"ComfyUI refused a prompt: {e.code} {e.read().decode()[:2000]}")
    return ids


def drain(base: str, ids: list[str], timeout_s: float) -> dict:
    """Waits until every prompt is in /history; returns id -> history entry."""
    t0, done = time.time(), {}
    while len(done) < len(ids):
        if time.time() - t0 > timeout_s:
            break
        for i in ids:
            if i not in done:
                try:
                    h = http(f"{base}/history/{i}")
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    continue  # a server busy in Python code (a LoRA patch on the CPU) answers late: ask again
                if i in h and h[i].get("status", {}).get("completed") is not None:
                    st = h[i]["status"]
                    if st.get("status_str") in ("success", "error"):
                        done[i] = h[i]
        time.sleep(0.05)
    return done


def batch_size(p: dict) -> int:
    return sum(n["inputs"].get("batch_size", 0) for n in p.values() if n["class_type"] == "EmptyLatentImage")


def run_workload(base: str, name: str, prompts: list[dict], timeout_s: float) -> dict:
    with Sampler() as s:
        t0 = time.time()
        ids = queue(base, prompts)
        hist = drain(base, ids, timeout_s)
        wall = time.time() - t0
    if len(hist) < len(ids):  # out of time: empty the queue so that the next run starts clean
        http(base + "/queue", {"clear": True}, timeout=300)
        http(base + "/interrupt", {}, timeout=300)
        t1 = time.time()
        while time.time() - t1 < 120:
            q = http(base + "/queue", timeout=300)
            if not q.get("queue_running") and not q.get("queue_pending"):
                break
            time.sleep(0.5)
    ok = [i for i in ids if hist.get(i, {}).get("status", {}).get("status_str") == "success"]
    images = sum(batch_size(p) for i, p in zip(ids, prompts) if i in ok)
    errors = [m for i in ids if i in hist and hist[i]["status"]["status_str"] == "error"
              for m in hist[i]["status"].get("messages", []) if m[0] == "execution_error"][:3]
    r = {"run": name, "prompts": len(prompts), "prompts_done": len(ok), "images": images, "wall_s": wall,
         "s_per_image": wall / images if images else None,
         "images_per_hour": images * 3600 / wall if images else 0.0,
         "unfinished": len(ids) - len(hist), "errors": errors}
    r.update(s.summary())
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comfy", required=True, type=Path)
    ap.add_argument("--base", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--port", type=int, default=8190)
    ap.add_argument("--flags", default="", help="ComfyUI flags beside the headless ones, e.g. '--fast --highvram'")
    ap.add_argument("--warmup", type=Path)
    ap.add_argument("--deadline", type=float, default=0, help="epoch seconds after which no run starts (0: none)")
    ap.add_argument("--run-timeout", type=float, default=400)
    ap.add_argument("runs", nargs="+", metavar="RUN=PROMPTS.json")
    a = ap.parse_args()
    runs = []
    for spec in a.runs:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            ap.error(f"{spec}: expected RUN=PROMPTS.json naming a file")
        runs.append((name, json.loads(Path(path).read_text())))
    (a.base / "frontend").mkdir(parents=True, exist_ok=True)
    log = a.out.parent / f"comfy-server-{a.out.stem}.log"
    cmd = [sys.executable, str(a.comfy / "main.py"), "--listen", "127.0.0.1", "--port", str(a.port),
           "--base-directory", str(a.base), "--front-end-root", str(a.base / "frontend"), "--disable-auto-launch",
           *a.flags.split()]
    result = {"command": " ".join(cmd), "flags": a.flags, "commit": (a.comfy / "COMMIT").read_text().strip()
              if (a.comfy / "COMMIT").exists() else None, "runs": []}
    save = lambda: a.out.write_text(json.dumps(result, indent=1))  # noqa: E731
    t_start = time.time()
    with open(log, "w") as lf:
        server = subprocess.Popen(cmd, cwd=a.comfy, stdout=lf, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{a.port}"
    try:
        result["ready_s"] = wait_ready(base, server, 300)
        if a.warmup:
            p = json.loads(a.warmup.read_text())[0]
            p = json.loads(json.dumps(p))
            for n in p.values():
                if "seed" in n["inputs"]:
                    n["inputs"]["seed"] = 4999
                if n["class_type"] == "SaveImage":
                    n["inputs"]["filename_prefix"] = "warmup"
            w = run_workload(base, "warmup", [p], a.run_timeout)
            result["warmup"] = w
            result["load_and_first_image_s"] = w["wall_s"]
            print(f"ComfyUI [{a.flags or 'defaults'}]: ready in {result['ready_s']:.1f} s, warm-up (load + first image) "
                  f"{w['wall_s']:.1f} s, {w['prompts_done']}/1 done {w['errors'] or ''}", flush=True)
        save()
        for name, prompts in runs:
            if a.deadline and time.time() > a.deadline:
                result["runs"].append({"run": name, "skipped": "deadline"})
                print(f"{name}: skipped (deadline)", flush=True)
                save()
                continue
            r = run_workload(base, name, prompts, a.run_timeout)
            result["runs"].append(r)
            save()
            busy = "n/a" if r["gpu_busy"] is None else f"{r['gpu_busy']:.0%}"
            mem = "n/a" if r["peak_memory_used_mib"] is None else f"{r['peak_memory_used_mib'] / 1024:.2f} GiB"
            print(f"ComfyUI {name} [{a.flags or 'defaults'}]: {r['images']} images in {r['wall_s']:.1f} s = "
                  f"{r['images_per_hour']:.0f} images/hour after load ({r['s_per_image'] or 0:.3f} s/image); GPU busy "
                  f"{busy}; peak memory.used {mem}; prompts {r['prompts_done']}/{r['prompts']}"
                  + (f"; ERRORS {r['errors']}" if r["errors"] else "") + (f"; {r['unfinished']} unfinished" if r["unfinished"] else ""),
                  flush=True)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        result["server_s"] = time.time() - t_start
        save()
    return 0 if all(r.get("prompts_done") == r.get("prompts") for r in result["runs"] if "skipped" not in r) else 1


if __name__ == "__main__":
    raise SystemExit(main())
