#!/usr/bin/env python3
"""Parity (ctest label parity): every sampler x schedule that sdxl-batch accepts
vs the diffusers scheduler that diffusers' documentation maps to the A1111 name
(reference.a1111_schedulers), with StableDiffusionXLPipeline on the tiny model,
on the CPU, same weights, prompt, seed, steps, CFG; the pipeline gets a list of
per-image CPU generators, as sdxl-batch draws its noise. Also checks that the
combinations diffusers cannot do are refused with exit code 2, and one case with
guidance_rescale.

sdxl-batch makes every case in one `run` of one batch file (one task per case);
prints a table sampler x schedule -> PSNR; fails when a PSNR is below --min-psnr
(40 dB). The reference pipeline is loaded once.

    PYTHONPATH=tests parity_samplers.py --binary B --model TINY --diffusers TINY_DIFFUSERS --work DIR
"""
from __future__ import annotations

import subprocess
import sys
import time

import torch
from parity_common import finish, parse_args, reference_pipeline, run_ours_batch

from reference.a1111_schedulers import SCHEDULES, VALID, make_scheduler
from reference.compare_images import load_rgb, psnr
from reference.reference_sdxl import a1111_embeds

PROMPT, NEGATIVE, SEED, STEPS, CFG, W, H = "comic panel, a lighthouse in a storm", "blurry", 42, 8, 5.0, 256, 256


def main() -> int:
    a, work = parse_args(__doc__, lambda ap: ap.add_argument("--only", help="run only this sampler (A1111 name)"))

    pipe = reference_pipeline(a.diffusers)
    base_config = dict(pipe.scheduler.config)
    with torch.inference_mode():
        embeds = a1111_embeds(pipe, PROMPT, NEGATIVE, True)

    cases = [(s, k, 0.0) for s, ks in VALID.items() for k in ks]
    cases.append(("DPM++ 2M", "Karras", 0.7))  # guidance rescale
    if a.only:
        cases = [c for c in cases if c[0] == a.only]
    tags = {c: f"{c[0]}-{c[1]}-{c[2]}".replace(" ", "_").replace("+", "p") for c in cases}
    # sdxl-batch: every case a task of one batch file, one run (the model loaded once).
    t0 = time.time()
    ours = run_ours_batch(a, work, {tags[c]: dict(prompt=PROMPT, negative=NEGATIVE, seed=SEED, steps=STEPS, cfg=CFG,
                                                  width=W, height=H, sampler=c[0], schedule=c[1],
                                                  guidance_rescale=c[2]) for c in cases})
    print(f"sdxl-batch: {len(cases)} images in one run, {time.time() - t0:.1f} s", flush=True)
    rows, failed = [], False
    for sampler, schedule, rescale in cases:
        tag = tags[(sampler, schedule, rescale)]
        ref_png = work / f"{tag}-ref.png"
        pipe.scheduler = make_scheduler(base_config, sampler, schedule)
        t0 = time.time()
        with torch.inference_mode():
            out = pipe(**embeds, num_inference_steps=STEPS, guidance_scale=CFG, guidance_rescale=rescale, width=W,
                       height=H, generator=[torch.Generator("cpu").manual_seed(SEED)], output_type="pil")
        t_ref = time.time() - t0
        out.images[0].save(ref_png)
        p = psnr(load_rgb(str(ours[tag])), load_rgb(str(ref_png)))
        row = {"sampler": sampler, "schedule": schedule, "guidance_rescale": rescale, "psnr_db": p,
               "ref_s": round(t_ref, 2)}
        rows.append(row)
        failed |= not (p >= a.min_psnr)
        print(f"{sampler:13} {schedule:12} rescale {rescale:<3} PSNR {p:6.2f} dB", flush=True)

    # Combinations diffusers cannot do are usage errors that list the valid ones.
    refused = []
    for sampler in VALID:
        for schedule in SCHEDULES:
            if schedule in VALID[sampler] or (a.only and sampler != a.only):
                continue
            r = subprocess.run([a.binary, "generate", "--model", a.model, "--prompt", "x", "--sampler", sampler,
                                "--schedule", schedule, "--out", str(work / "refused.png")], capture_output=True, text=True)
            ok = r.returncode == 2 and "valid:" in r.stderr
            refused.append(f"{sampler}/{schedule}")
            if not ok:
                print(f"{sampler} / {schedule}: expected exit 2 listing the valid schedules, got {r.returncode}: {r.stderr}")
                failed = True

    print(f"refused as diffusers does not support them: {', '.join(refused)}\n")
    return finish(rows, [("sampler", "sampler", "<13"), ("schedule", "schedule", "<12"), ("rescale", "guidance_rescale", ">7"),
                         ("PSNR dB", "psnr_db", ">8.2f")],
                  work / "parity_samplers.json", failed, "a case is below {min_psnr} dB or a refusal is wrong", "",
                  a.min_psnr)


if __name__ == "__main__":
    sys.exit(main())
