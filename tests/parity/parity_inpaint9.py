#!/usr/bin/env python3
"""Parity (ctest label parity): a 9-channel SDXL inpainting UNet vs diffusers'
StableDiffusionXLInpaintPipeline, tiny model, CPU.

The fixture (fixture_tiny_inpaint: reference.inpaint_fixture and two exports) is the tiny
model with its UNet's conv_in widened to 9 input channels (seeded random weights for the
mask and masked-image channels), written as a diffusers folder and as a single-file
checkpoint, and exported from each (the file with --config of the 4-channel tiny model:
the export takes in_channels 9 from the checkpoint's conv_in, as diffusers' single-file
loader does). Checked here:
  - both exports record /unet/in_channels 9 and /latent_channels 4, and hold the same
    tensors bit for bit;
  - ONE `sdxl-batch run` of a batch file on the single-file export, every case a masked
    task (cases of one shape share UNet calls, each row with its own mask) against
    StableDiffusionXLInpaintPipeline with the same weights, seed, steps, strength and
    scheduler: strengths 0.6 and 1.0 (pure noise, no init latents), mask_blur 0 and 4,
    Euler and DPM++ 2M SDE Karras, "only masked" (padding_mask_crop) with its pixels outside
    the padded crop equal to the init image's; PSNR >= --min-psnr (40 dB). As in the 4-channel
    test the reference's _encode_vae_image takes the latent distribution's mean (what
    sdxl-batch encodes), for the init image and for the masked image alike;
  - a task without a mask on the inpainting model is refused by `validate` and `run`
    (exit 2, its JSON pointer, "inpainting model").

    PYTHONPATH=tests parity_inpaint9.py --binary B --model TINY --diffusers TINY_DIFFUSERS --inpaint FIXTURE --work DIR
"""
from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import torch
from parity_common import finish, image_row, parse_args, reference_pipeline, run_ours_batch
from parity_inpaint import check_outside_crop, init_image, inpaint_pipeline, masks

from reference.a1111_schedulers import make_scheduler
from reference.reference_sdxl import a1111_embeds

PROMPT, NEGATIVE, CFG, W, H, STEPS = "comic panel, a red fox on a train", "blurry", 5.0, 256, 256, 6

# tag -> (mask, mask_blur, strength, sampler, schedule, seed, padding of "only masked" or None)
CASES = {
    "s06-rect-blur0": ("rect", 0, 0.6, "Euler", "Automatic", 21, None),
    "s06-grey-blur4": ("grey", 4, 0.6, "Euler", "Automatic", 22, None),
    "s06-rect-crop32": ("rect", 4, 0.6, "Euler", "Automatic", 23, 32),
    "s10-rect-blur4": ("rect", 4, 1.0, "Euler", "Automatic", 24, None),
    "s10-small-crop16": ("small", 4, 1.0, "Euler", "Automatic", 25, 16),
    "s06-grey-sde": ("grey", 0, 0.6, "DPM++ 2M SDE", "Karras", 26, None),
}


def exports_agree(fixture: Path) -> dict:
    """Both exports: in_channels 9, latent_channels 4, the same UNet / VAE / text encoder tensors."""
    metas = {k: json.loads((fixture / k / "model.json").read_text()) for k in ("model-dir", "model-file")}
    channels = all(m["unet"]["in_channels"] == 9 and m["latent_channels"] == 4 for m in metas.values())
    worst = 0.0
    for f in ("unet.ts", "vae_encoder.ts", "text_encoder.ts", "text_encoder_2.ts"):
        a, b = (torch.jit.load(str(fixture / k / f), map_location="cpu").state_dict() for k in metas)
        if set(a) != set(b):
            worst = float("inf")
            continue
        worst = max([worst] + [float((a[n].float() - b[n].float()).abs().max()) for n in a])
    conv_in = torch.jit.load(str(fixture / "model-file" / "unet.ts"), map_location="cpu").state_dict()
    shape = tuple(conv_in["conv_in.weight"].shape)
    ok = channels and worst == 0.0 and shape[1] == 9
    print(f"exports: in_channels 9 / latent_channels 4 {channels}; conv_in {shape}; max|diff| dir vs file {worst:.3g}",
          flush=True)
    return {"case": "export-dir=file", "what": "in_channels 9, same tensors", "value": float("inf") if ok else 0.0,
            "ok": ok}


def refuses_unmasked(a, model: Path, work: Path) -> dict:
    """validate and run refuse a task without a mask on the inpainting model: exit 2, its pointer."""
    bf = work / "unmasked.json"
    bf.write_text(json.dumps({"version": 1, "tasks": [
        {"id": "ok", "prompt": "x", "init_image": "init.png", "mask": "mask-rect.png"},
        {"id": "plain", "prompt": "x", "seed": 1}]}))
    ok = True
    for cmd in (["validate", str(bf), "--model", str(model)],
                ["run", str(bf), "--model", str(model), "--out", str(work / "unmasked-out"), "--no-progress"]):
        r = subprocess.run([a.binary, *cmd], capture_output=True, text=True)
        said = r.stdout + r.stderr
        good = r.returncode == 2 and re.search(r"/tasks/1\b[^\n]*: model '[^']*' is an inpainting model", said) is not None
        print(f"{cmd[0]} of a task without a mask: exit {r.returncode}, refused with its pointer {good}", flush=True)
        if not good:
            print(said[-1500:])
        ok &= good
    ok &= not list((work / "unmasked-out").glob("*.png")) if (work / "unmasked-out").exists() else True
    return {"case": "unmasked-refused", "what": "validate = run: exit 2", "value": float("inf") if ok else 0.0,
            "ok": bool(ok)}


def reference(a, fixture: Path, work: Path, init, mask_images, pngs) -> tuple[list, bool]:
    pipe = reference_pipeline(str(fixture / "diffusers"))
    assert pipe.unet.config.in_channels == 9
    inp = inpaint_pipeline(pipe)
    base_config = dict(pipe.scheduler.config)
    rows, failed = [], False
    with torch.inference_mode():
        embeds = a1111_embeds(pipe, PROMPT, NEGATIVE, True)
        for tag, (mask, blur, strength, sampler, schedule, seed, pad) in CASES.items():
            inp.scheduler = make_scheduler(base_config, sampler, schedule)
            m = mask_images[mask]
            if blur > 0:
                m = inp.mask_processor.blur(m, blur_factor=blur)
            ref = inp(**embeds, image=init, mask_image=m, height=H, width=W, strength=strength,
                      num_inference_steps=STEPS, guidance_scale=CFG, padding_mask_crop=pad,
                      generator=[torch.Generator("cpu").manual_seed(seed)]).images[0]
            ref_png = work / f"{tag}-ref.png"
            ref.save(ref_png)
            rows.append(image_row(tag, pngs[tag], None, ref_png, None, a.min_psnr))
            if pad is not None:
                check_outside_crop(rows[-1], inp, m, pad, pngs[tag], init)
            failed |= not rows[-1]["ok"]
            print(f"{tag:18} PSNR {rows[-1]['value']:6.2f} dB  {rows[-1]['what']}", flush=True)
    return rows, failed


def main() -> int:
    a, work = parse_args(__doc__, lambda ap: ap.add_argument(
        "--inpaint", required=True, help="fixture_tiny_inpaint's folder (diffusers/, model-dir/, model-file/)"))
    fixture = Path(a.inpaint)
    init = init_image()
    init.save(work / "init.png")
    mask_images = masks()
    for k, m in mask_images.items():
        m.save(work / f"mask-{k}.png")
    rows = [exports_agree(fixture)]
    cases = {tag: {"prompt": PROMPT, "negative": NEGATIVE, "seed": seed, "steps": STEPS, "cfg": CFG, "sampler": sampler,
                   "schedule": schedule, "init_image": "init.png", "mask": f"mask-{mask}.png", "mask_blur": blur,
                   "strength": strength, **({} if pad is None else {"inpaint_area": "masked", "inpaint_padding": pad})}
             for tag, (mask, blur, strength, sampler, schedule, seed, pad) in CASES.items()}
    ours9 = copy.copy(a)
    ours9.model = str(fixture / "model-file")
    t0 = time.time()
    # Up to 3 images a UNet call: tasks of one size, sampler and strength share calls, each with its own mask.
    pngs = run_ours_batch(ours9, work, cases, extra=["--max-batch", "3"])
    print(f"sdxl-batch run (9-channel UNet, {len(cases)} masked tasks) {time.time() - t0:.1f} s", flush=True)
    sizes = [i["batch_size"] for i in json.loads((work / "ours-batch" / "report.json").read_text())["images"]]
    rows.append({"case": "masks batched", "what": "most images in one UNet call", "value": float(max(sizes)),
                 "ok": max(sizes) >= 2})

    t0 = time.time()
    ref_rows, failed = reference(a, fixture, work, init, mask_images, pngs)
    print(f"reference time {time.time() - t0:.1f} s", flush=True)
    rows += ref_rows
    rows.append(refuses_unmasked(a, fixture / "model-file", work))
    failed |= not all(r["ok"] for r in rows)
    return finish(rows, [("case", "case", "<18"), ("PSNR dB", "value", ">8.2f")], work / "parity_inpaint9.json",
                  failed, "a case is below {min_psnr} dB", "", a.min_psnr)


if __name__ == "__main__":
    sys.exit(main())
