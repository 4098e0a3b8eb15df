#!/usr/bin/env python3
"""Steady-state sampling speed from sdxl-batch report.json files.

For each report and device: sampling seconds per image over all batches, and the
steady state, the batches after the first of each UNet shape (latent size, from
the batch group, x batch size): the first one pays the shape's cold cost (cuDNN /
cuBLAS plans, CUDA graph capture). Used by bench/gpu_runtime.sh and
bench/gpu_aoti.sh.

Usage: steady_sampling.py REPORT.json... (each labelled by its folder's name)
"""
import json
import os
import sys


def steady_lines(path: str) -> list[str]:
    r = json.load(open(path))
    if "batches" not in r:  # not an sdxl-batch report (e.g. diffusers_loop.py's)
        return []
    name = os.path.basename(os.path.dirname(os.path.abspath(path)))
    lines = []
    for dev in sorted({b.get("device", "") for b in r["batches"]}):
        bs = sorted((b for b in r["batches"] if b.get("device", "") == dev and "sample" in b), key=lambda b: b["sample"][0])
        seen, cold, warm, n_warm = set(), 0.0, 0.0, 0
        for b in bs:
            key = (b["group"].split("|")[0], b["size"])  # the UNet shape
            s = b["sample"][1] - b["sample"][0]
            if key in seen:
                warm += s
                n_warm += b["size"]
            else:
                seen.add(key)
                cold += s
        n = sum(b["size"] for b in bs)
        eng = next((d.get("engine", {}) for d in r.get("devices", []) if d["name"] == dev), {})
        lines.append(f"{name:>14} {dev}: sampling {sum(b['sample'][1] - b['sample'][0] for b in bs) / max(1, n):.3f} s/image overall; "
                     f"steady {warm / max(1, n_warm):.3f} s/image over {n_warm} images; first batch of each of {len(seen)} shapes "
                     f"{cold:.1f} s; first UNet calls {eng.get('unet_first_call_s', 0):.1f} s, captures {eng.get('unet_capture_s', 0):.1f} s")
    return lines


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    for p in sys.argv[1:]:
        lines = steady_lines(p)
        if lines:
            print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
