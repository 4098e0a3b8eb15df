#!/usr/bin/env python3
"""Parity (ctest label parity): inpainting vs diffusers' StableDiffusionXLInpaintPipeline, tiny model, CPU.

One `sdxl-batch run` of one batch file: every case is a task with an init
image, a "mask" and its "mask_blur"; the cases of one shape (size, steps,
sampler, strength) share UNet calls, each row with its own mask. The reference
is StableDiffusionXLInpaintPipeline with the same weights, seed (a list of one
CPU generator), steps, strength and scheduler, given the mask as a PIL image
blurred by its mask processor's blur (VaeImageProcessor.blur, what "mask_blur"
names). As in the img2img parity test, sdxl-batch encodes the init image to the
mean of the VAE's latent distribution; the reference's _encode_vae_image is
given the same (instead of sampling the distribution with the generator), so
both draw the same noise in the same order.

Cases: strengths 0.6 and 1.0, mask_blur 0 and 4, a grey mask (binarised at
0.5), a mask at twice the task's size (resized), Euler and DPM++ 2M SDE Karras
(noise drawn every step), masks batched together, and "only masked"
("inpaint_area": "masked" vs padding_mask_crop) with paddings 32, 8 and 16, one
crop box pushed back inside the image at its edge, and a task with a LoRA (the test
LoRAs' peft file, UNet and text encoders; the reference has it fused by
reference.lora_reference; the image must differ from the same task without it).
Fails when a PSNR is below
--min-psnr (40 dB), or when an "only masked" image differs from the init image
by a single byte outside the padded crop box (diffusers' get_crop_region).
Also: `generate --mask --inpaint-area masked` makes an only-masked case's image
byte for byte, its PNG parameters carry A1111's Mask blur, Inpaint area and
Masked area padding, and the manifest records the mask's sha256.
"""
from __future__ import annotations

import hashlib
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from parity_common import finish, image_row, parse_args, reference_pipeline, run_ours_batch
from PIL import Image
from testkit import parameters, read_manifest, run_ok

from reference.a1111_schedulers import make_scheduler
from reference.compare_images import load_rgb, psnr
from reference.reference_sdxl import a1111_embeds, load_pipeline

PROMPT, NEGATIVE, CFG, W, H, STEPS = "comic panel, a red fox on a train", "blurry", 5.0, 256, 256, 8


def init_image() -> Image.Image:
    """A smooth colour field with a dark disc: something the VAE keeps recognisable."""
    y, x = np.mgrid[0:H, 0:W].astype(np.float32)
    rgb = np.stack([x / W * 255, y / H * 255, (1 - x / W) * 200 + 30], axis=-1)
    disc = (x - 90) ** 2 + (y - 150) ** 2 < 50 ** 2
    rgb[disc] = (40, 30, 60)
    return Image.fromarray(rgb.clip(0, 255).astype(np.uint8))


def masks() -> dict[str, Image.Image]:
    """rect: a white box; grey: a soft ellipse (values across 0.5); big: a box at 2x the task's size."""
    y, x = np.mgrid[0:H, 0:W].astype(np.float32)
    rect = np.zeros((H, W), np.uint8)
    rect[60:180, 100:220] = 255
    d = ((x - 128) / 90) ** 2 + ((y - 110) / 60) ** 2
    grey = (np.clip(1.3 - d, 0, 1) * 255).astype(np.uint8)
    big = np.zeros((2 * H, 2 * W), np.uint8)
    big[40:300, 250:470] = 255
    small = np.zeros((H, W), np.uint8)
    small[200:230, 20:90] = 255  # near an edge: the crop box is shifted back inside
    return {k: Image.fromarray(v).convert("RGB")
            for k, v in (("rect", rect), ("grey", grey), ("big", big), ("small", small))}


# tag -> (mask, mask_blur, strength, sampler, schedule, seed, padding of "only masked" or None)
CASES = {
    "s06-rect-blur0": ("rect", 0, 0.6, "Euler", "Automatic", 11, None),
    "s06-grey-blur4": ("grey", 4, 0.6, "Euler", "Automatic", 12, None),
    "s06-big-blur4": ("big", 4, 0.6, "Euler", "Automatic", 13, None),
    "s10-rect-blur4": ("rect", 4, 1.0, "Euler", "Automatic", 14, None),
    "s06-grey-sde": ("grey", 0, 0.6, "DPM++ 2M SDE", "Karras", 15, None),
    "s06-rect-crop32": ("rect", 4, 0.6, "Euler", "Automatic", 16, 32),
    "s06-grey-crop8": ("grey", 0, 0.6, "Euler", "Automatic", 17, 8),
    "s10-small-crop16": ("small", 4, 1.0, "Euler", "Automatic", 18, 16),
}
# tag -> (the case it repeats with a LoRA, the LoRA file of the test LoRAs, its weight): its own task,
# which batches with no other (another LoRA set).
LORA_CASES = {"s06-rect-lora": ("s06-rect-blur0", "peft.safetensors", 0.9)}


def reference_image(inp, embeds, init, m, tag, work: Path, base_config) -> Path:
    """StableDiffusionXLInpaintPipeline's image of case `tag` with the (blurred) mask `m` -> its PNG."""
    mask, blur, strength, sampler, schedule, seed, pad = CASES[tag]
    inp.scheduler = make_scheduler(base_config, sampler, schedule)
    ref = inp(**embeds, image=init, mask_image=m, height=H, width=W, strength=strength,
              num_inference_steps=STEPS, guidance_scale=CFG, padding_mask_crop=pad,
              generator=[torch.Generator("cpu").manual_seed(seed)]).images[0]
    png = work / f"{tag}-ref.png"
    ref.save(png)
    return png


def check_outside_crop(row: dict, inp, mask, pad: int, png: Path, init) -> None:
    """"Only masked": outside the padded crop (diffusers' get_crop_region of the mask) the image must be
    the init image's bytes exactly; the count of changed pixels is added to the case's row."""
    w, h = init.size
    x1, y1, x2, y2 = inp.mask_processor.get_crop_region(mask, w, h, pad=pad)
    ours, want = np.array(Image.open(png).convert("RGB")), np.array(init)
    outside = np.ones((h, w), bool)
    outside[y1:y2, x1:x2] = False
    changed = int((ours[outside] != want[outside]).any(axis=-1).sum())
    row["what"] += f"; {changed} of {int(outside.sum())} pixels outside the crop changed"
    row["ok"] = bool(row["ok"] and changed == 0 and outside.any())


def inpaint_pipeline(pipe):
    """StableDiffusionXLInpaintPipeline on `pipe`'s modules, encoding to the latent mean as sdxl-batch does."""
    from diffusers import StableDiffusionXLInpaintPipeline

    inp = StableDiffusionXLInpaintPipeline(**pipe.components, add_watermarker=False)
    inp.set_progress_bar_config(disable=True)
    sf = pipe.vae.config.scaling_factor
    inp._encode_vae_image = lambda image, generator: pipe.vae.encode(image).latent_dist.mean * sf
    return inp


def lora_rows(a, work: Path, init, mask_images, pngs, base_config) -> list[dict]:
    """Each LoRA case against the reference with the LoRA fused, and against its case without it
    (which must differ: a LoRA that changes nothing proves nothing)."""
    rows = []
    for tag, (base, file, weight) in LORA_CASES.items():
        pipe, counts = load_pipeline(a.diffusers, loras=[(str(Path(a.loras) / file), weight)])
        inp = inpaint_pipeline(pipe)
        mask, blur = CASES[base][:2]
        m = mask_images[mask] if blur == 0 else inp.mask_processor.blur(mask_images[mask], blur_factor=blur)
        with torch.inference_mode():
            ref_png = reference_image(inp, a1111_embeds(pipe, PROMPT, NEGATIVE, True), init, m, base, work,
                                      base_config)
        ref_png = ref_png.rename(work / f"{tag}-ref.png")
        rows.append(image_row(tag, pngs[tag], None, ref_png, None, a.min_psnr))
        without = psnr(load_rgb(str(pngs[tag])), load_rgb(str(pngs[base])))
        rows[-1]["what"] += f"; {without:.1f} dB vs the case without the LoRA ({sum(counts.values())} layers)"
        rows[-1]["ok"] = bool(rows[-1]["ok"] and without < a.min_psnr)
        print(f"{tag:18} PSNR {rows[-1]['value']:6.2f} dB  {rows[-1]['what']}", flush=True)
    return rows


def cli_and_records(a, work: Path, cases: dict, pngs: dict) -> dict:
    """`generate --mask ... --inpaint-area masked` makes the batch's image byte for byte (its
    flags reach the same settings); the PNG's parameters and the manifest record the mask."""
    tag = "s06-rect-crop32"
    c = cases[tag]
    png = work / "cli-sdxl.png"
    run_ok([a.binary, "generate", "--model", a.model, "--prompt", c["prompt"], "--negative", c["negative"],
            "--seed", str(c["seed"]), "--steps", str(c["steps"]), "--cfg", str(c["cfg"]), "--init-image",
            str(work / c["init_image"]), "--strength", str(c["strength"]), "--mask", str(work / c["mask"]),
            "--mask-blur", str(c["mask_blur"]), "--inpaint-area", "masked", "--inpaint-padding",
            str(c["inpaint_padding"]), "--out", str(png), "--threads", "1"], "sdxl-batch generate --mask")
    same = np.array_equal(np.array(Image.open(png).convert("RGB")), np.array(Image.open(pngs[tag]).convert("RGB")))
    params = parameters(png)
    want = f"Mask blur: {c['mask_blur']}, Inpaint area: Only masked, Masked area padding: {c['inpaint_padding']}"
    entry = next(e for e in read_manifest(work / "ours-batch") if e["task"] == tag)
    sha = hashlib.sha256((work / c["mask"]).read_bytes()).hexdigest()
    ok = same and want in params and entry["params"]["mask"]["sha256"] == sha
    print(f"generate --mask: same image {same}; parameters {want in params}; manifest mask sha256 "
          f"{entry['params']['mask']['sha256'] == sha}", flush=True)
    return {"case": "generate-cli", "what": "generate --mask = run; parameters; manifest", "value": 0.0 if not ok
            else float("inf"), "ok": bool(ok)}


def main() -> int:
    a, work = parse_args(__doc__, lambda ap: ap.add_argument("--loras", required=True,
                                                             help="reference.make_test_loras' folder"))
    init = init_image()
    init.save(work / "init.png")
    mask_images = masks()
    for k, m in mask_images.items():
        m.save(work / f"mask-{k}.png")
    cases = {tag: {"prompt": PROMPT, "negative": NEGATIVE, "seed": seed, "steps": STEPS, "cfg": CFG, "sampler": sampler,
                   "schedule": schedule, "init_image": "init.png", "mask": f"mask-{mask}.png", "mask_blur": blur,
                   "strength": strength, **({} if pad is None else {"inpaint_area": "masked", "inpaint_padding": pad})}
             for tag, (mask, blur, strength, sampler, schedule, seed, pad) in CASES.items()}
    for tag, (base, file, weight) in LORA_CASES.items():
        shutil.copyfile(Path(a.loras) / file, work / file)
        cases[tag] = dict(cases[base], loras=[{"path": file, "weight": weight}])
    t0 = time.time()
    pngs = run_ours_batch(a, work, cases)
    print(f"sdxl-batch run {time.time() - t0:.1f} s", flush=True)

    pipe = reference_pipeline(a.diffusers)
    inp = inpaint_pipeline(pipe)
    base_config = dict(pipe.scheduler.config)
    rows, failed = [], False
    t0 = time.time()
    with torch.inference_mode():
        embeds = a1111_embeds(pipe, PROMPT, NEGATIVE, True)
        for tag, (mask, blur, *_, pad) in CASES.items():
            m = mask_images[mask]
            if blur > 0:
                m = inp.mask_processor.blur(m, blur_factor=blur)
            ref_png = reference_image(inp, embeds, init, m, tag, work, base_config)
            rows.append(image_row(tag, pngs[tag], None, ref_png, None, a.min_psnr))
            if pad is not None:
                check_outside_crop(rows[-1], inp, m, pad, pngs[tag], init)
            failed |= not rows[-1]["ok"]
            print(f"{tag:18} PSNR {rows[-1]['value']:6.2f} dB  {rows[-1]['what']}", flush=True)
    rows += lora_rows(a, work, init, mask_images, pngs, base_config)
    failed |= not all(r["ok"] for r in rows)
    print(f"reference time {time.time() - t0:.1f} s")
    rows.append(cli_and_records(a, work, cases, pngs))
    failed |= not rows[-1]["ok"]
    return finish(rows, [("case", "case", "<18"), ("PSNR dB", "value", ">8.2f")], work / "parity_inpaint.json",
                  failed, "a case is below {min_psnr} dB", "", a.min_psnr)


if __name__ == "__main__":
    sys.exit(main())
