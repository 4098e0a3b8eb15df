#!/usr/bin/env python3
"""One markdown table from the results of bench/bench_speed.sh.

    bench_table.py --rows rows.jsonl --peak peak.json [--out table.md] [--dtype fp16]
                   [--unet-tflop 13.52 --vae-tflop 10.5] [--title TEXT]

rows.jsonl, one JSON object a line:
  {"tool": "sdxl-batch", "name": ..., "report": "report.json", "rc": N, "limit_s": S, "log": ...}
      a `sdxl-batch run`; numbers from its report.json: s/image = (run_s - load_s) / images done
      (= 3600 / images_per_hour: model load excluded, the first, cold batch included)
  {"tool": "diffusers", "mode": ..., "batch": ..., "s_per_image_mean": ..., ...}
      a configuration measured by bench_diffusers_sdxl.py (or its "error")
  {"tool": "diffusers-run", "configs": "eager:1,eager:4", "rc": N, "limit_s": S, "log": ...}
      one bench_diffusers_sdxl.py process: its configurations without a line above are "failed"

FLOP per image = steps x UNet FLOP per CFG call (batch 2) + VAE decode FLOP; the
defaults are the full SDXL base at 1024x1024 (GPU-NOTES.md: 13.52 and 10.5 TFLOP,
389 TFLOP at 28 steps). Hardware limit s/image = FLOP per image / the measured
dense matmul peak in --dtype; fraction of the limit = that / s per image.
"vs best diffusers" = the best (lowest) diffusers s/image of the same steps and CFG / this row's s/image
(above 1: faster than diffusers). A row that failed says "failed" and why.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

GIB = 2.0**30


def load_rows(path: Path) -> list[dict]:
    rows = []
    if not path.exists():
        return rows
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            print(f"bench_table: {path}:{n}: not JSON ({e}); line ignored", file=sys.stderr)
    return rows


def why_failed(rc, limit_s, log) -> str:
    if rc in (124, 137):
        return f"timed out after {limit_s:.0f} s" if limit_s else "timed out"
    where = f"; see {Path(log).name}" if log else ""
    return f"exit {rc}{where}" if rc not in (None, 0) else f"no result{where}"


def sdxl_row(r: dict) -> dict:
    row = {"name": r.get("name", "sdxl-batch"), "tool": "sdxl-batch"}
    rep_path = Path(r.get("report", ""))
    if r.get("error"):  # the script's reason (no binary, no time left)
        row["error"] = r["error"]
        return row
    if not rep_path.is_file():
        row["error"] = why_failed(r.get("rc"), r.get("limit_s"), r.get("log")) + " (no report.json)"
        return row
    try:
        rep = json.loads(rep_path.read_text())
        done = int(rep["images_done"])
        make_s = float(rep["run_s"]) - float(rep["load_s"])
        notes = [f"{done} images", f"load {float(rep['load_s']):.1f} s"]
        if done == 0:
            row["error"] = f"no image made ({rep.get('images_failed', 0)} failed" + (
                f": {rep['failures'][0]['error'][:120]}" if rep.get("failures") else "") + ")"
            return row
        row["s_per_image"] = make_s / done
        row["peak_bytes"] = rep["memory"]["peak_allocated_bytes"]
        steps = [im["steps"] for im in rep.get("images", []) if "steps" in im]
        row["steps"] = steps[0] if steps else None
        cfgs = [im["cfg"] for im in rep.get("images", []) if "cfg" in im]
        row["cfg"] = cfgs[0] if cfgs else None
        batches = rep.get("batches", [])
        warm = [b for b in batches[1:] if "error" not in b]
        if warm:
            n_warm = sum(b["size"] for b in warm)
            if n_warm:
                notes.append(f"warm {sum(b['seconds'] for b in warm) / n_warm:.3f} s/image")
        sizes = sorted({b["size"] for b in batches})
        if sizes:
            notes.append("batch sizes " + "/".join(map(str, sizes)))
        if rep.get("images_failed"):
            notes.append(f"{rep['images_failed']} failed")
        if r.get("rc") in (124, 137) or rep.get("stop_reason"):
            notes.append(f"stopped early ({rep.get('stop_reason') or 'timeout'})")
        if r.get("vae_fallbacks"):
            notes.append(f"{r['vae_fallbacks']} VAE fp32 re-decodes")
        row["notes"] = ", ".join(notes)
    except (KeyError, ValueError, TypeError, json.JSONDecodeError) as e:
        row["error"] = f"unreadable report.json ({type(e).__name__}: {e})"
    return row


def diffusers_row(r: dict) -> dict:
    mode = r.get("mode", "eager")
    name = f"diffusers {mode}" + (f" ({r['compile_mode']})" if mode == "compile" and r.get("compile_mode") else "") + \
        f" batch {r.get('batch', '?')}"
    row = {"name": name, "tool": "diffusers"}
    if "error" in r:
        row["error"] = r["error"]
        return row
    row["s_per_image"] = float(r.get("s_per_image_mean", r["s_per_image"]))
    row["peak_bytes"] = r.get("peak_allocated_bytes")
    row["steps"] = r.get("steps")
    row["cfg"] = r.get("cfg")
    notes = [f"{len(r.get('call_s', []))} timed calls (best {r['s_per_image']:.3f} s/image)", f"load {r['load_s']:.1f} s"]
    if "compile_s" in r:
        notes.append(f"compile {r['compile_s']:.0f} s")
    if r.get("peak_memory_note"):
        notes.append(f"memory: {r['peak_memory_note']}")
    row["notes"] = ", ".join(notes)
    return row


def build_rows(raw: list[dict]) -> list[dict]:
    rows = []
    seen = set()
    for r in raw:
        if r.get("tool") == "sdxl-batch":
            rows.append(sdxl_row(r))
        elif r.get("tool") == "diffusers":
            rows.append(diffusers_row(r))
            seen.add((r.get("mode"), r.get("batch"), r.get("steps")))
    for r in raw:  # configurations of a diffusers process that never reported
        if r.get("tool") != "diffusers-run":
            continue
        for item in str(r.get("configs", "")).split(","):
            mode, _, batch = item.partition(":")
            if not batch.isdigit() or (mode, int(batch), r.get("steps")) in seen:
                continue
            rows.append({"name": f"diffusers {mode} batch {batch}", "tool": "diffusers", "steps": r.get("steps"),
                         "cfg": r.get("cfg"),
                         "error": r.get("error") or why_failed(r.get("rc"), r.get("limit_s"), r.get("log"))})
    return rows


def fmt(x, spec: str, missing: str = "—") -> str:
    return missing if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def render(rows: list[dict], peak: dict, dtype: str, unet_tflop: float, vae_tflop: float, default_steps: int,
           title: str) -> str:
    peak_tflops = (peak.get(dtype) or {}).get("tflops")
    # Each row is compared with the best diffusers row of its own settings (steps, CFG).
    settings = lambda r: (r.get("steps") or default_steps, r.get("cfg"))  # noqa: E731
    best_diff: dict = {}
    for r in rows:
        if r["tool"] == "diffusers" and "s_per_image" in r:
            best_diff[settings(r)] = min(best_diff.get(settings(r), math.inf), r["s_per_image"])
    flop_default = (default_steps * unet_tflop + vae_tflop) * 1e12
    lines = [f"### {title}", ""]
    measured = {k: v for k, v in peak.items() if isinstance(v, dict) and "tflops" in v}
    peaks = ", ".join(f"{k} {v['tflops']:.4g} TFLOP/s" for k, v in measured.items())
    n = next((v.get("n") for v in measured.values()), None)
    lines.append(f"Device: {peak.get('device', '?')}; dense matmul peak{f' ({n}³)' if n else ''}: "
                 f"{peaks or 'not measured'}. FLOP per image = steps × {unet_tflop} TFLOP (UNet, CFG batch 2) + "
                 f"{vae_tflop} TFLOP (VAE decode) = {flop_default / 1e12:.1f} TFLOP at {default_steps} steps; "
                 f"hardware limit = {fmt(flop_default / (peak_tflops * 1e12) if peak_tflops else None, '.3f')} s/image "
                 f"at the {dtype} peak.")
    lines.append("")
    lines.append("| configuration | s/image | images/hour | achieved TFLOP/s | of hardware limit | peak memory GiB | "
                 "vs best diffusers | notes |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if (r.get("steps") and r["steps"] != default_steps) or r.get("cfg") not in (None, 7.0):
            r["name"] += f" ({r.get('steps') or default_steps} steps, CFG {fmt(r.get('cfg'), 'g', '?')})"
        if "error" in r:
            lines.append(f"| {r['name']} | failed | — | — | — | — | — | {r['error'].replace('|', '/')} |")
            continue
        s = r["s_per_image"]
        steps = r.get("steps") or default_steps
        flop = (steps * unet_tflop + vae_tflop) * 1e12
        achieved = flop / s / 1e12 if s > 0 else None
        frac = achieved / peak_tflops if (achieved and peak_tflops) else None
        peak_gib = r["peak_bytes"] / GIB if r.get("peak_bytes") else None
        best = best_diff.get(settings(r))
        ratio = best / s if (best and s > 0) else None
        lines.append(f"| {r['name']} | {s:.3f} | {fmt(3600.0 / s if s > 0 else None, '.0f')} | {fmt(achieved, '.1f')} | "
                     f"{fmt(frac * 100 if frac is not None else None, '.1f')}{'%' if frac is not None else ''} | "
                     f"{fmt(peak_gib, '.2f')} | {fmt(ratio, '.2f')}{'×' if ratio is not None else ''} | "
                     f"{r.get('notes', '').replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", required=True, type=Path)
    ap.add_argument("--peak", type=Path, help="bench_matmul_peak.py's JSON (missing: the TFLOP columns stay empty)")
    ap.add_argument("--out", type=Path, help="also write the table here")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "fp32"], help="the peak the limit is taken from")
    ap.add_argument("--steps", type=int, default=28, help="steps of rows that do not say")
    ap.add_argument("--unet-tflop", type=float, default=13.52, help="UNet TFLOP per CFG call (batch 2)")
    ap.add_argument("--vae-tflop", type=float, default=10.5, help="VAE decode TFLOP per image")
    ap.add_argument("--title", default="sdxl-batch vs diffusers, same weights and settings")
    a = ap.parse_args()
    peak = {}
    if a.peak and a.peak.is_file():
        try:
            peak = json.loads(a.peak.read_text())
        except json.JSONDecodeError as e:
            print(f"bench_table: {a.peak}: not JSON ({e}); no peak", file=sys.stderr)
    rows = build_rows(load_rows(a.rows))
    if not rows:
        print(f"bench_table: no rows in {a.rows}", file=sys.stderr)
    table = render(rows, peak, a.dtype, a.unet_tflop, a.vae_tflop, a.steps, a.title)
    print(table, end="")
    if a.out:
        a.out.write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
