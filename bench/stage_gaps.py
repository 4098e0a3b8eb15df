#!/usr/bin/env python3
"""Where a run's device sat idle: the gaps in which none of its pipeline stages
(text, sample, decode) ran, from report.json's batch records.

Usage: python3 bench/stage_gaps.py REPORT.json [...] [--min-gap 0.3]

Per report and device: the span from the first batch's text stage to the last
decode, the idle seconds inside it (no stage running), and each gap of at least
--min-gap seconds with the batch that came after it (its group, size and LoRA
set, read from its images' prompts, so a gap at a LoRA switch shows as one).
The model load and the first batch's set-up are outside the span or inside the
first batch's stages; PNG writing runs on CPU threads and is not a stage here.
"""
import argparse
import json
import re
import sys
from pathlib import Path

LORA_TAG = re.compile(r"<lora:([^:>]+)")


def lora_set(images) -> str:
    names = sorted({m for i in images for m in LORA_TAG.findall(i.get("prompt", ""))})
    return "+".join(names) or "-"


def gaps(report: dict, min_gap: float):
    by_start = {}
    for im in report.get("images", []):
        by_start.setdefault((im.get("device"), round(im.get("start_s", -1), 6)), []).append(im)
    devices = sorted({b.get("device") for b in report.get("batches", []) if "error" not in b})
    for dev in devices:
        bs = sorted((b for b in report["batches"] if b.get("device") == dev and "error" not in b), key=lambda b: b["text"][0])
        if not bs:
            continue
        spans = sorted((s, e) for b in bs for s, e in (b["text"], b["sample"], b["decode"]))
        start, end = spans[0][0], max(e for _, e in spans)
        idle, found, reach = 0.0, [], start
        for s, e in spans:
            if s > reach:
                idle += s - reach
                if s - reach >= min_gap:
                    found.append((reach, s))
            reach = max(reach, e)
        sets = [lora_set(by_start.get((dev, round(b["start_s"], 6)), [])) for b in bs]
        switches = sum(a != b for a, b in zip(sets, sets[1:]))
        after = []  # each gap with the batch whose stage started where it ended, and its LoRA set
        for g0, g1 in found:
            k = next(i for i, b in enumerate(bs) if any(abs(b[st][0] - g1) < 1e-9 for st in ("text", "sample", "decode")))
            after.append((g0, g1, bs[k], sets[k]))
        yield dev, start, end, idle, switches, after


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+")
    ap.add_argument("--min-gap", type=float, default=0.3, help="list gaps of at least this many seconds (0.3)")
    a = ap.parse_args()
    for p in a.reports:
        r = json.loads(Path(p).read_text())
        name = Path(p).parent.name if Path(p).name == "report.json" else Path(p).stem
        for dev, start, end, idle, switches, found in gaps(r, a.min_gap):
            span = end - start
            print(f"{name} {dev}: idle {idle:.2f} s of {span:.1f} s ({idle / span:.1%} of the span), "
                  f"{switches} LoRA set changes between batches, {len(found)} gap(s) >= {a.min_gap} s")
            for g0, g1, b, loras in found:
                print(f"    {g0:7.2f}-{g1:7.2f} s ({g1 - g0:.2f} s) before a batch of {b['size']} "
                      f"{b['group']} LoRA {loras}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
