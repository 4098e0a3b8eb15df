#!/usr/bin/env python3
"""The summary of bench/fp8_conv_e2e.sh (issue 44 item 1, FP8 3x3 convolutions in unet_fp8.pt2):
per sdxl-batch run its speed, per pair of runs the fidelity of their images, per export what its
model.json records; markdown on stdout and in --md, everything in --json.

  speed (report.json): images, steady sampling s/image (the batches after the first of each UNet
        shape: no graph capture, no cold kernels; as bench/steady_sampling.py), sampling s/image over
        all batches, whole run after the load (3600 / images per hour), load seconds, peak memory;
  fidelity (the PNGs of the images both runs made, by task and index, same seeds): PSNR (dB, uint8
        RGB) and SSIM (bench/fp8_fidelity.py's: luminance, Gaussian 11x11), mean and min, as
        bench/fp8_fidelity.py compares the FP8 pipeline's images with the fp16 pipeline's;
  export (model.json): unet.fp8's layers, conv layers, the package's compile seconds and checks.

    python3 bench/fp8_conv_summary.py --run fp8=DIR --run fp8conv=DIR --run fp16=DIR \
        --pair fp8:fp16 --pair fp8conv:fp16 --pair fp8conv:fp8 --export fp8=MODEL --export fp8conv=MODEL \
        [--json OUT.json] [--md OUT.md] [--title TEXT]
A run or export folder that is missing is reported as missing (a call cut short still summarises).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))
from fp8_fidelity import ssim  # noqa: E402


def speed(run: Path) -> dict:
    rep = run / "report.json"
    if not rep.is_file():
        return {"missing": str(rep)}
    r = json.loads(rep.read_text())
    bs = sorted((b for b in r["batches"] if "sample" in b and "error" not in b), key=lambda b: b["sample"][0])
    seen, warm_s, warm_n, all_s, all_n, cold = set(), 0.0, 0, 0.0, 0, 0
    for b in bs:
        s = b["sample"][1] - b["sample"][0]
        all_s, all_n = all_s + s, all_n + b["size"]
        key = (b.get("device", ""), b["group"].split("|")[0], b["size"])  # the UNet shape
        if key in seen:
            warm_s, warm_n = warm_s + s, warm_n + b["size"]
        else:
            seen.add(key)
            cold += 1
    iph = r.get("images_per_hour") or 0
    return {"images": r["images_done"], "failed": r["images_failed"],
            "batch_sizes": [b["size"] for b in bs],
            "steady_sample_s_per_image": round(warm_s / warm_n, 4) if warm_n else None, "steady_images": warm_n,
            "sample_s_per_image": round(all_s / all_n, 4) if all_n else None, "cold_shapes": cold,
            "run_s_per_image": round(3600.0 / iph, 4) if iph else None, "load_s": r.get("load_s"),
            "peak_allocated_gib": round(r["memory"]["peak_allocated_bytes"] / 2 ** 30, 2)}


def manifest(run: Path) -> dict:
    return {(l["task"], l["index"]): l for m in sorted(run.glob("manifest*.jsonl"))
            for l in map(json.loads, m.read_text().splitlines()) if l.get("file")}


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def fidelity(a: Path, b: Path) -> dict:
    ma, mb = manifest(a), manifest(b)
    keys = sorted(k for k in ma if k in mb and ma[k].get("seed") == mb[k].get("seed"))
    if not keys:
        return {"images": 0, "missing": [str(p) for p, m in ((a, ma), (b, mb)) if not m]}
    ps, ss, identical = [], [], 0
    for k in keys:
        x = np.asarray(Image.open(a / ma[k]["file"]).convert("RGB"))
        y = np.asarray(Image.open(b / mb[k]["file"]).convert("RGB"))
        if ma[k].get("sha256") and ma[k].get("sha256") == mb[k].get("sha256"):
            identical += 1
        ps.append(psnr(x, y))
        ss.append(ssim(x, y))
    finite = [p for p in ps if math.isfinite(p)]
    return {"images": len(keys), "identical": identical,
            "psnr_db_mean": round(float(np.mean(finite)), 2) if finite else math.inf,
            "psnr_db_min": round(min(ps), 2), "ssim_mean": round(float(np.mean(ss)), 5), "ssim_min": round(min(ss), 5),
            "per_image": [{"task": k[0], "index": k[1], "psnr_db": round(p, 2), "ssim": round(s, 5)}
                          for k, p, s in zip(keys, ps, ss)]}


def export_info(model: Path) -> dict:
    mj = model / "model.json"
    if not mj.is_file():
        return {"missing": str(mj)}
    fp8 = json.loads(mj.read_text()).get("unet", {}).get("fp8", {})
    aoti = fp8.get("aoti", {})
    return {"linear_layers": fp8.get("layers"), "conv_layers": fp8.get("conv", {}).get("layers", 0),
            "rel_l2_vs_unet_on_trace_inputs": fp8.get("rel_l2_vs_unet_on_trace_inputs"),
            "calibration_s": fp8.get("calibration", {}).get("seconds"),
            "package": aoti.get("file"), "package_seconds": aoti.get("seconds"),
            "package_checks": [{k: c.get(k) for k in ("rows", "rel_l2", "rel_l2_vs_fp16", "eager_rel_l2_vs_fp16",
                                                      "ok")} for c in aoti.get("checks", [])]}


def fmt(v, spec=".3f") -> str:
    return "—" if v is None else (f"{v:{spec}}" if isinstance(v, (int, float)) else str(v))


def markdown(title: str, runs: dict, pairs: dict, exports: dict) -> str:
    lines = [f"## {title}", "", "### Speed (sdxl-batch, report.json)", "",
             "| run | images | steady sampling s/image (images) | sampling s/image, all batches "
             "| whole run s/image after load | load s | peak GiB | batches |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, s in runs.items():
        if "missing" in s:
            lines.append(f"| {name} | missing: {s['missing']} | | | | | | |")
            continue
        failed = f" ({s['failed']} failed)" if s["failed"] else ""
        lines.append(f"| {name} | {s['images']}{failed} "
                     f"| {fmt(s['steady_sample_s_per_image'])} ({s['steady_images']}) | {fmt(s['sample_s_per_image'])} "
                     f"| {fmt(s['run_s_per_image'])} | {fmt(s['load_s'], '.1f')} | {fmt(s['peak_allocated_gib'], '.2f')} "
                     f"| {s['batch_sizes']} |")
    base = [n for n in runs if "missing" not in runs[n] and runs[n]["steady_sample_s_per_image"]]
    if len(base) >= 2:
        a, b = base[0], base[1]
        ta, tb = runs[a]["steady_sample_s_per_image"], runs[b]["steady_sample_s_per_image"]
        lines += ["", f"steady sampling: {b} {tb:.3f} s/image against {a} {ta:.3f}: {b} is {ta / tb:.3f}x as fast"]
    lines += ["", "### Fidelity (the images both runs made, same seeds)", "",
              "| pair | images | PSNR dB mean | PSNR dB min | SSIM mean | SSIM min |", "|---|---:|---:|---:|---:|---:|"]
    for name, f in pairs.items():
        if not f.get("images"):
            lines.append(f"| {name} | 0 (missing: {f.get('missing')}) | | | | |")
            continue
        lines.append(f"| {name} | {f['images']} | {fmt(f['psnr_db_mean'], '.2f')} | {fmt(f['psnr_db_min'], '.2f')} "
                     f"| {fmt(f['ssim_mean'], '.4f')} | {fmt(f['ssim_min'], '.4f')} |")
    lines += ["", "### Exports (model.json unet.fp8)", "",
              "| export | FP8 linear | FP8 conv | rel. L2 vs fp16 UNet (trace inputs) | package seconds "
              "| package checks: rel. L2 vs fp16 (eager FP8) |",
              "|---|---:|---:|---:|---|---|"]
    for name, e in exports.items():
        if "missing" in e:
            lines.append(f"| {name} | missing: {e['missing']} | | | | |")
            continue
        checks = "; ".join(f"rows {c['rows']}: {fmt(c['rel_l2_vs_fp16'], '.4f')} "
                           f"({fmt(c['eager_rel_l2_vs_fp16'], '.4f')}) {'ok' if c['ok'] else 'FAILED'}"
                           for c in e["package_checks"])
        lines.append(f"| {name} | {e['linear_layers']} | {e['conv_layers']} "
                     f"| {fmt(e['rel_l2_vs_unet_on_trace_inputs'], '.4f')} | {e['package_seconds'] or '—'} "
                     f"| {checks or '—'} |")
    return "\n".join(lines)


def labelled(items: list[str], what: str) -> dict[str, Path]:
    out = {}
    for it in items:
        if "=" not in it:
            raise SystemExit(f"{what} '{it}': LABEL=PATH")
        k, v = it.split("=", 1)
        out[k] = Path(v)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="append", default=[], help="LABEL=DIR: an sdxl-batch output folder")
    ap.add_argument("--pair", action="append", default=[], help="A:B: compare run A's images with run B's")
    ap.add_argument("--export", action="append", default=[], help="LABEL=MODEL: an export folder")
    ap.add_argument("--title", default="FP8 3x3 convolutions in unet_fp8.pt2")
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args()
    run_dirs = labelled(a.run, "--run")
    runs = {k: speed(v) for k, v in run_dirs.items()}
    pairs = {}
    for p in a.pair:
        x, _, y = p.partition(":")
        if x not in run_dirs or y not in run_dirs:
            raise SystemExit(f"--pair {p}: both must be --run labels")
        pairs[f"{x} vs {y}"] = fidelity(run_dirs[x], run_dirs[y])
    exports = {k: export_info(v) for k, v in labelled(a.export, "--export").items()}
    md = markdown(a.title, runs, pairs, exports)
    print(md)
    if a.md:
        Path(a.md).write_text(md + "\n")
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": runs, "pairs": pairs, "exports": exports}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
