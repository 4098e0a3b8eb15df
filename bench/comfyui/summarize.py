#!/usr/bin/env python3
"""The table of bench/comfyui/run.sh: both tools per workload, and the draft write-up for
bench/results/ (OUT/comfy58.md: copy it to bench/results/YYYY-MM-DD-comfyui-DEVICE.md after
reading it; nothing here writes into the repository).

  summarize.py --work WORK --out OUT --comfy-base DIR

Rows: sdxl-batch's runs from WORK/NAME/report.json (images/hour after the load, as report.json
counts it), GPU busy from WORK/NAME.util, the card's peak memory.used from WORK/NAME.mem, and its
own peak allocated / reserved; ComfyUI's from OUT/comfy-*.json (comfy_queue.py). Speed-ups are
against the fastest ComfyUI row of the same workload, beside issue 58's goals (README path >= 1.5x
on W1 and >= 2x on the comic night; the best configuration >= 2x on both). Last, how a ComfyUI
image compares with sdxl-batch's of the same task: PSNR of the first W1 panel.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
from pathlib import Path

WORKLOADS = {"w1": "W1: panels of 1024², 28 steps, CFG 7, Euler", "mixed": "the mixed batch",
             "finish": "the comic night finished (hires on a third, upscaler frame on all, ControlNet on half)"}
GOALS = {("readme", "w1"): 1.5, ("best", "w1"): 2.0, ("readme", "mixed"): 2.0, ("best", "mixed"): 2.0,
         ("readme", "finish"): 2.0, ("best", "finish"): 2.0}


def samples(path: Path) -> list[float]:
    if not path.exists():
        return []
    out = []
    for x in path.read_text().split():
        try:
            out.append(float(x))
        except ValueError:
            pass
    return out


def sdxl_rows(work: Path) -> list[dict]:
    """Runs named [PREFIX]readme-W or [PREFIX]best-W (run.sh's RUN_PREFIX, e.g. aoti-)."""
    rows = []
    for rep in sorted(work.glob("*/report.json")):
        m = re.fullmatch(r"(.*?)(readme|best)-(w1|mixed|finish)", rep.parent.name)
        if not m:
            continue
        prefix, kind, wl = m.groups()
        name = rep.parent.name
        r = json.loads(rep.read_text())
        util, mem = samples(work / f"{name}.util"), samples(work / f"{name}.mem")
        sizes = sorted({b["size"] for b in r.get("batches", [])})
        rows.append({"tool": "sdxl-batch", "config": prefix + kind, "kind": kind, "workload": wl, "images": r["images_done"],
                     "failed": r.get("images_failed", 0), "images_per_hour": r["images_per_hour"],
                     "busy": sum(1 for u in util if u > 0) / len(util) if util else None,
                     "peak_used_gib": max(mem) / 1024 if mem else None,
                     "own_peak": f"allocated {r['memory']['peak_allocated_bytes'] / 2**30:.2f}, reserved "
                                 f"{r['memory']['peak_reserved_bytes'] / 2**30:.2f} GiB",
                     "note": f"load {r['load_s']:.1f} s; batch sizes {sizes}"})
    return rows


def comfy_rows(out: Path) -> tuple[list[dict], list[dict]]:
    rows, servers = [], []
    for f in sorted(out.glob("comfy-*.json")):
        c = json.loads(f.read_text())
        servers.append({"file": f.name, "flags": c.get("flags", "").strip() or "defaults", "command": c.get("command"),
                        "commit": c.get("commit"), "ready_s": c.get("ready_s"),
                        "load_and_first_image_s": c.get("load_and_first_image_s")})
        for r in c.get("runs", []):
            name = r["run"]
            wl = "w1" if name.startswith("w1") else name
            if "skipped" in r:
                rows.append({"tool": "ComfyUI", "config": f"{servers[-1]['flags']} {name}", "workload": wl,
                             "skipped": r["skipped"]})
                continue
            rows.append({"tool": "ComfyUI", "config": f"{servers[-1]['flags']}" + (f", {name}" if name != wl else ""),
                         "workload": wl, "images": r["images"], "failed": r["prompts"] - r["prompts_done"],
                         "images_per_hour": r["images_per_hour"], "busy": r.get("gpu_busy"),
                         "peak_used_gib": (r["peak_memory_used_mib"] / 1024) if r.get("peak_memory_used_mib") else None,
                         "own_peak": "", "note": f"{r['prompts']} prompts" + (f"; errors {r['errors']}" if r["errors"] else "")})
    return rows, servers


def psnr_first_panel(work: Path, comfy_out: Path) -> str:
    try:
        import numpy as np
        from PIL import Image
        line = json.loads((work / "readme-w1" / "manifest.jsonl").read_text().splitlines()[0])
        ours = work / "readme-w1" / line["file"]
        theirs = sorted(comfy_out.glob(f"{line['task']}_*.png"))
        if not theirs:
            return "no ComfyUI image of the first W1 panel to compare"
        a = np.asarray(Image.open(ours).convert("RGB")).astype(np.float64)
        b = np.asarray(Image.open(theirs[0]).convert("RGB")).astype(np.float64)
        if a.shape != b.shape:
            return f"sizes differ: {a.shape} vs {b.shape}"
        mse = ((a - b) ** 2).mean()
        return (f"{line['task']} (seed {line['seed']}): PSNR {10 * math.log10(255 ** 2 / mse):.1f} dB between the two tools' "
                f"PNGs" if mse > 0 else "identical pixels")
    except (OSError, ValueError, IndexError, KeyError) as e:
        return f"not compared: {e}"


def fmt(x, f):
    return "–" if x is None else format(x, f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--comfy-base", required=True, type=Path)
    a = ap.parse_args()
    ours = sdxl_rows(a.work)
    theirs, servers = comfy_rows(a.out)
    lines = ["| workload | tool | configuration | images | images/hour after load | vs best ComfyUI (goal) | GPU busy | "
             "peak memory.used GiB | own peak | notes |", "|---|---|---|---|---|---|---|---|---|---|"]
    verdicts = []
    for wl, title in WORKLOADS.items():
        comfy_best = max((r["images_per_hour"] for r in theirs if r["workload"] == wl and "skipped" not in r
                          and r["images"]), default=None)
        for r in [x for x in ours + theirs if x["workload"] == wl]:
            if "skipped" in r:
                lines.append(f"| {wl} | {r['tool']} | {r['config']} | skipped ({r['skipped']}) | | | | | | |")
                continue
            ratio, goal = "", GOALS.get((r["kind"], wl)) if r["tool"] == "sdxl-batch" else None
            if comfy_best and r["tool"] == "sdxl-batch":
                x = r["images_per_hour"] / comfy_best
                ratio = f"{x:.2f}×" + (f" ({goal}×: {'met' if x >= goal else 'missed'})" if goal else "")
                if goal:
                    verdicts.append(f"{r['config']} on {wl}: {x:.2f}× against ComfyUI's best, goal {goal}× "
                                    f"{'met' if x >= goal else 'MISSED'}")
            lines.append(f"| {wl} | {r['tool']} | {r['config']} | {r['images']}" + (f" ({r['failed']} failed)" if r["failed"] else "")
                         + f" | {r['images_per_hour']:,.0f} | {ratio} | {fmt(r['busy'], '.0%')} | {fmt(r['peak_used_gib'], '.2f')} | "
                         f"{r['own_peak']} | {r['note']} |")
    table = "\n".join(lines)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip() if any(r.get("busy") is not None for r in ours + theirs) else "CPU (dry run)"
    psnr = psnr_first_panel(a.work, a.comfy_base / "output")
    server_lines = "\n".join(f"- `{s['flags']}`: `{s['command']}`; ready {fmt(s['ready_s'], '.1f')} s, load + first image "
                             f"{fmt(s['load_and_first_image_s'], '.1f')} s" for s in servers)
    commit = next((s["commit"] for s in servers if s["commit"]), "?")
    doc = f"""# ComfyUI against sdxl-batch (issue 58): {smi}

Command: `OUT=DIR bash bench/comfyui/run.sh` (carry `.deps .whl .comfy/src.tar.xz .comfy/whl`), one call.
ComfyUI v0.8.0, commit `{commit}`, headless: its own server (main.py) on loopback, each panel POSTed
to `/prompt` in file order (bench/comfyui/comfy_queue.py), the queue drained. Servers:
{server_lines}

Same weights: the export's random full-size SDXL (fp16) as an original-layout single file, the two
rank-64 kohya LoRAs, a random full-size ControlNet (diffusers layout) and a random full-size 4x
RRDBNet (.pth) for ComfyUI; the same tensors exported for sdxl-batch. Rates exclude the model load
(ComfyUI: a warm-up prompt first; sdxl-batch: report.json). GPU busy: share of nvidia-smi samples
(100 ms) with utilisation > 0; peak memory.used: the card's, nvidia-smi, both tools alike.

{table}

{chr(10).join('- ' + v for v in verdicts) or '- no sdxl-batch row has a ComfyUI row to compare with'}

Same picture? {psnr}. No, and not up to noise alone: ComfyUI draws the initial noise in float32
(its empty latent's dtype) from torch's CPU generator seeded with the seed; sdxl-batch draws it from
the same generator in the model's dtype, fp16, which torch's CPU sampler fills by another algorithm
(uncorrelated: correlation -0.003 for seed 5000 at 1×4×128×128, checked on the CPU). The Euler
schedules differ too: sdxl-batch follows diffusers' EulerDiscreteScheduler with SDXL's "leading"
spacing (A1111's Automatic: timesteps 946 … 1 at 28 steps), ComfyUI's "normal" scheduler starts at
999. So this compares cost, not pixels (random weights: the pixels mean nothing either way).
"""
    (a.out / "comfy58.md").write_text(doc)
    print(table)
    print("\n".join(verdicts))
    print("same picture?", psnr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
