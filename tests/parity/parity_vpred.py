#!/usr/bin/env python3
"""Parity (ctest label parity, issue 61): v-prediction with zero-terminal-SNR, a timestep list
and TCD vs diffusers' StableDiffusionXLPipeline on the tiny model's weights, fp32, CPU, same
prompt, seed and settings, one generator per image.

- A v-prediction + zero-SNR model: the tiny model's files (hard links) with a model.json whose
  scheduler says prediction_type v_prediction, rescale_betas_zero_snr, trailing spacing, and whose
  defaults say guidance_rescale 0.7 (what export_sdxl.py --prediction-type v_prediction --zero-snr
  writes); the reference is the same pipeline with that scheduler config. Euler (guidance_rescale
  left to the model's default), DPM++ 2M and DPM++ 2M SDE Karras (0.7 given), and the other
  samplers whose diffusers scheduler takes rescale_betas_zero_snr (Euler a, DDIM, UniPC, TCD).
- The epsilon tiny model: LCM with DMD2's timesteps [999, 749, 499, 249] (diffusers' timesteps=),
  DPM++ SDE with a list of 5 (its solver orders follow the count), TCD at 4 and 8 steps with eta 0.3.

sdxl-batch makes each model's cases in one `run` of one batch file; prints each PSNR and fails
below --min-psnr (65 dB here).

    PYTHONPATH=tests parity_vpred.py --binary B --model TINY --diffusers TINY_DIFFUSERS --work DIR
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from parity_common import finish, parse_args, reference_pipeline, run_ours_batch

from reference.a1111_schedulers import make_scheduler
from reference.compare_images import load_rgb, psnr
from reference.reference_sdxl import a1111_embeds

PROMPT, NEGATIVE, SEED, CFG, W, H = "comic panel, a lighthouse in a storm", "blurry", 42, 5.0, 256, 256
VPRED = {"prediction_type": "v_prediction", "rescale_betas_zero_snr": True, "timestep_spacing": "trailing"}
DMD2 = [999, 749, 499, 249]

# (tag, model, batch-file keys, reference keyword arguments); "vpred" cases run on the v-prediction model.
CASES = [
    ("vpred-euler", "vpred", dict(sampler="Euler", steps=8), dict(steps=8, rescale=0.7)),
    ("vpred-dpmpp2m", "vpred", dict(sampler="DPM++ 2M", steps=8, guidance_rescale=0.7), dict(steps=8, rescale=0.7)),
    ("vpred-dpmpp2m-sde-karras", "vpred",
     dict(sampler="DPM++ 2M SDE", schedule="Karras", steps=8, guidance_rescale=0.7), dict(steps=8, rescale=0.7)),
    ("vpred-euler-a", "vpred", dict(sampler="Euler a", steps=8, guidance_rescale=0.7), dict(steps=8, rescale=0.7)),
    ("vpred-ddim", "vpred", dict(sampler="DDIM", steps=8, guidance_rescale=0.7), dict(steps=8, rescale=0.7)),
    ("vpred-unipc", "vpred", dict(sampler="UniPC", steps=8, guidance_rescale=0.7), dict(steps=8, rescale=0.7)),
    ("vpred-tcd", "vpred", dict(sampler="TCD", steps=4, eta=0.3, guidance_rescale=0.7),
     dict(steps=4, rescale=0.7, eta=0.3)),
    ("lcm-dmd2", "eps", dict(sampler="LCM", timesteps=DMD2), dict(timesteps=DMD2)),
    ("dpmpp-sde-list", "eps", dict(sampler="DPM++ SDE", timesteps=[999, 874, 749, 499, 249]),
     dict(timesteps=[999, 874, 749, 499, 249])),
    ("tcd-4", "eps", dict(sampler="TCD", steps=4, eta=0.3), dict(steps=4, eta=0.3)),
    ("tcd-8", "eps", dict(sampler="TCD", steps=8, eta=0.3), dict(steps=8, eta=0.3)),
]


def vpred_model(fixture: Path, out: Path) -> Path:
    """The fixture's files hard-linked into `out` (copied where links fail), model.json rewritten with
    the v-prediction + zero-SNR scheduler and the guidance_rescale default the export writes."""
    shutil.rmtree(out, ignore_errors=True)

    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(fixture, out, copy_function=link, ignore=shutil.ignore_patterns("model.json"))
    meta = json.loads((fixture / "model.json").read_text())
    meta["scheduler"].update(VPRED)
    meta["defaults"]["guidance_rescale"] = 0.7
    (out / "model.json").write_text(json.dumps(meta, indent=1))
    return out


def reference(pipe, base_config: dict, embeds: dict, sampler: str, schedule: str, kw: dict, png: Path) -> float:
    """diffusers' image of one case, saved to `png`; returns its seconds."""
    pipe.scheduler = make_scheduler(base_config, sampler, schedule)
    steps = {"timesteps": kw["timesteps"]} if "timesteps" in kw else {"num_inference_steps": kw["steps"]}
    t0 = time.time()
    with torch.inference_mode():
        out = pipe(**embeds, **steps, guidance_scale=CFG, guidance_rescale=kw.get("rescale", 0.0),
                   eta=kw.get("eta", 0.0), width=W, height=H, generator=[torch.Generator("cpu").manual_seed(SEED)],
                   output_type="pil")
    out.images[0].save(png)
    return time.time() - t0


def main() -> int:
    a, work = parse_args(__doc__, lambda ap: ap.set_defaults(min_psnr=65.0))
    models = {"eps": a.model, "vpred": str(vpred_model(Path(a.model), work / "tiny-vpred"))}
    ours = {}
    for name, model in models.items():
        t0 = time.time()
        cases = {tag: dict(prompt=PROMPT, negative=NEGATIVE, seed=SEED, cfg=CFG, width=W, height=H, **keys)
                 for tag, m, keys, _ in CASES if m == name}
        a.model = model
        (work / name).mkdir(exist_ok=True)
        ours.update(run_ours_batch(a, work / name, cases))
        print(f"sdxl-batch ({name} model): {len(cases)} images in one run, {time.time() - t0:.1f} s", flush=True)

    pipe = reference_pipeline(a.diffusers)
    eps_config = dict(pipe.scheduler.config)
    configs = {"eps": eps_config, "vpred": {**eps_config, **VPRED}}
    with torch.inference_mode():
        embeds = a1111_embeds(pipe, PROMPT, NEGATIVE, True)
    rows, failed = [], False
    for tag, model, keys, kw in CASES:
        ref_png = work / f"{tag}-ref.png"
        t_ref = reference(pipe, configs[model], embeds, keys["sampler"], keys.get("schedule", "Automatic"), kw, ref_png)
        p = psnr(load_rgb(str(ours[tag])), load_rgb(str(ref_png)))
        rows.append({"case": tag, "psnr_db": p, "ref_s": round(t_ref, 2), "ok": p >= a.min_psnr})
        failed |= not (p >= a.min_psnr)
        print(f"{tag:26} PSNR {p:6.2f} dB", flush=True)
    return finish(rows, [("case", "case", "<26"), ("PSNR dB", "psnr_db", ">8.2f")], work / "parity_vpred.json",
                  failed, "a case is below {min_psnr} dB", "", a.min_psnr)


if __name__ == "__main__":
    sys.exit(main())
