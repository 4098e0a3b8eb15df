#!/usr/bin/env python3
"""Parity (ctest label parity): sdxl-batch vs diffusers' StableDiffusionXLPipeline
on the same tiny-model weights, prompt, seed, steps, CFG and size, on the CPU.

For each case it runs `sdxl-batch generate --save-latents` and
reference.reference_sdxl (in this process: the pipeline is loaded once), then reports the max abs difference of the final
latents and the PSNR of the images. Fails when any PSNR < --min-psnr (40 dB).

    PYTHONPATH=tests parity_tiny.py --binary B --model TINY --diffusers TINY_DIFFUSERS --work DIR
"""
from __future__ import annotations

import sys

import numpy as np
from parity_common import finish, parse_args, reference_image, run_ours

from reference.compare_images import load_rgb, psnr

CASES = [
    # name, prompt, negative, seed, steps, cfg, width, height
    ("negative", "comic panel, a lighthouse keeper in a storm, bold ink lines", "blurry, lowres", 42, 8, 5.0, 256, 256),
    ("empty-negative", "a red fox reading a newspaper on a train", "", 7, 10, 7.0, 256, 256),
    ("non-square", "城市夜景, neon signs, rain", "ugly", 1234, 6, 4.5, 384, 264),
    ("no-cfg", "a teapot", "", 3, 5, 1.0, 256, 320),
    ("long-prompt-3-chunks", ", ".join(["a very detailed description of a fantasy castle"] * 20), "", 99, 4, 6.0, 256, 256),
    ("emphasis", "(masterpiece:1.3), a ((knight)) in [[fog]], \\(literal\\) (unclosed", "(blurry:1.4), lowres", 5, 5, 6.0,
     256, 256),
    ("break-and-long-negative", "a red door BREAK a blue sky, clouds", ", ".join(["ugly, deformed hands"] * 30), 11, 4,
     5.0, 256, 256),
    ("chinese-weighted", "(一只猫:1.2), 在月光下, [水墨画]", "", 21, 4, 5.0, 256, 256),
]


def main() -> int:
    a, work = parse_args(__doc__)

    rows, failed = [], False
    for name, prompt, negative, seed, steps, cfg, w, h in CASES:
        ref_png = work / f"{name}-ref.png"
        ours_png, ours_lat = run_ours(a, work, name, ["--prompt", prompt, "--negative", negative, "--seed", str(seed),
                                                      "--steps", str(steps), "--cfg", str(cfg), "--width", str(w),
                                                      "--height", str(h)])
        lb, _ = reference_image(a.diffusers, ref_png, prompt=prompt, negative=negative, seed=seed, steps=steps, cfg=cfg,
                                width=w, height=h)
        np.save(work / f"{name}-ref.npy", lb)
        la = np.load(ours_lat)
        if la.shape != lb.shape:
            print(f"{name}: latent shapes differ {la.shape} vs {lb.shape}")
            return 1
        ia, ib = load_rgb(str(ours_png)), load_rgb(str(ref_png))
        p = psnr(ia, ib)
        row = {"case": name, "size": f"{w}x{h}", "steps": steps, "cfg": cfg,
               "latent_max_abs": float(np.abs(la - lb).max()), "latent_absmax_ref": float(np.abs(lb).max()),
               "pixel_max_abs": int(np.abs(ia.astype(int) - ib.astype(int)).max()), "psnr_db": p}
        rows.append(row)
        failed |= not (p >= a.min_psnr)
    return finish(rows, [("case", "case", "<16"), ("size", "size", "<8"), ("steps", "steps", ">5"), ("cfg", "cfg", ">4"),
                         ("latent max|d|", "latent_max_abs", ">14.3e"), ("pixel max|d|", "pixel_max_abs", ">12"),
                         ("PSNR dB", "psnr_db", ">8.2f")],
                  work / "parity.json", failed, "a case is below {min_psnr} dB", "", a.min_psnr)


if __name__ == "__main__":
    sys.exit(main())
