#!/usr/bin/env python3
"""Parity (ctest label parity): clip skip (`--clip-skip N`) in sdxl-batch vs
diffusers on the tiny model, CPU.

Clip skip N counts layers from the end as A1111 does: 1 and 2 give SDXL's
default (the penultimate hidden states); N >= 3 takes hidden_states[-N] of both
text encoders, which is diffusers' StableDiffusionXLPipeline(clip_skip=N-2).
The tiny model's encoders have 3 layers (4 hidden states), so N = 3 and 4 are
checked against the pipeline's own encode_prompt (reference.reference_sdxl
generate(prompt_rules="diffusers", clip_skip=N)). diffusers applies clip_skip to the
prompt only (its negative prompt keeps the penultimate layer); sdxl-batch
applies it to the negative prompt too, so the case with a negative prompt is
checked against the reference's A1111-rule conditioning with the same layer.

Also checked: --clip-skip 2 gives the pixels of no clip skip (and writes
"Clip skip: 2" in the parameters), clip skip 3 changes the image far more than
the gap to the reference (else the comparison proves nothing), and N = 5 is
refused naming the model's limit.

    PYTHONPATH=tests parity_clip_skip.py --binary B --model TINY --diffusers TINY_DIFFUSERS --work DIR
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
from parity_common import cli_args, finish, parse_args, reference_image

from reference.compare_images import load_rgb, psnr

PROMPT = "a lighthouse in a storm, comic panel"
# name, clip skip, negative prompt, reference prompt rules
CASES = [
    ("clip-skip-3", 3, "", "diffusers"),
    ("clip-skip-4", 4, "", "diffusers"),
    ("clip-skip-3-negative", 3, "blurry, low contrast", "a1111"),
]
SETTINGS = {"seed": 42, "steps": 6, "cfg": 5.0, "width": 256, "height": 256}


def main() -> int:
    a, work = parse_args(__doc__)
    common = cli_args(SETTINGS)

    def ours(name: str, negative: str, clip_skip: int | None, expect_rc: int = 0) -> subprocess.CompletedProcess:
        png = work / f"{name}-sdxl.png"
        args = [a.binary, "generate", "--model", a.model, "--prompt", PROMPT, "--negative", negative, *common,
                "--out", str(png), "--threads", "1"]
        if clip_skip is not None:
            args += ["--clip-skip", str(clip_skip)]
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != expect_rc:
            raise SystemExit(f"{name}: sdxl-batch exited {r.returncode}, expected {expect_rc}:\n{r.stderr}")
        return r

    def ref(name: str, negative: str, clip_skip: int, rules: str):
        png = work / f"{name}-ref.png"
        reference_image(a.diffusers, png, prompt=PROMPT, negative=negative, prompt_rules=rules, clip_skip=clip_skip,
                        **SETTINGS)
        return load_rgb(str(png))

    def params(name: str) -> str:
        from PIL import Image

        with Image.open(work / f"{name}-sdxl.png") as im:
            return im.info["parameters"]

    rows, failed = [], False
    defaults = {}
    for negative in sorted({c[2] for c in CASES}):
        key = f"default{'-negative' if negative else ''}"
        ours(key, negative, None)
        defaults[negative] = load_rgb(str(work / f"{key}-sdxl.png"))
    for name, n, negative, rules in CASES:
        ours(name, negative, n)
        ia, ib = load_rgb(str(work / f"{name}-sdxl.png")), ref(name, negative, n, rules)
        p, p_default = psnr(ia, ib), psnr(ia, defaults[negative])
        # The layer must change the image far more than the gap to the reference.
        ok = p >= a.min_psnr and p_default <= p - 10 and f"Clip skip: {n}," in params(name)
        failed |= not ok
        rows.append({"case": name, "reference": rules, "psnr_db": p, "psnr_vs_default_db": p_default, "ok": ok})

    ours("clip-skip-2", "", 2)
    same = np.array_equal(load_rgb(str(work / "clip-skip-2-sdxl.png")), defaults[""])
    ok = same and "Clip skip: 2," in params("clip-skip-2")
    failed |= not ok
    rows.append({"case": "clip-skip-2 = default", "reference": "pixels", "psnr_db": float("inf") if same else 0.0,
                 "psnr_vs_default_db": float("inf") if same else 0.0, "ok": ok})

    r = ours("clip-skip-5", "", 5, expect_rc=2)
    ok = "clip skip 5 is outside what model" in r.stderr and "1..4" in r.stderr
    failed |= not ok
    rows.append({"case": "clip-skip-5 refused", "reference": "exit 2", "psnr_db": 0.0, "psnr_vs_default_db": 0.0,
                 "ok": ok})
    return finish(rows, [("case", "case", "<22"), ("reference", "reference", "<10"), ("PSNR dB", "psnr_db", ">8.2f"),
                         ("vs default", "psnr_vs_default_db", ">10.2f")],
                  work / "parity_clip_skip.json", failed,
                  "a case is below {min_psnr} dB, its clip skip did not change the image, --clip-skip 2 changed "
                  "it, or N = 5 was not refused", ", clip skip 2 = default, N = 5 refused", a.min_psnr)


if __name__ == "__main__":
    sys.exit(main())
