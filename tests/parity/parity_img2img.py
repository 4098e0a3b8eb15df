#!/usr/bin/env python3
"""Parity (ctest label parity): img2img and the hires fix vs diffusers on the tiny model, CPU.

img2img: `sdxl-batch generate --init-image PNG --strength S` vs
StableDiffusionXLImg2ImgPipeline with the same weights, seed (a list of one CPU
generator), steps, strength and scheduler. sdxl-batch encodes the image to the
mean of the VAE's latent distribution; the reference is given those latents
(image=latents, which the pipeline takes as they are) instead of letting it
sample the distribution with the generator.

Hires fix: `--hires-scale F --hires-upscaler U --hires-steps N --hires-denoise D`
vs StableDiffusionXLPipeline (first pass, output_type="latent"), then the
upscale (torch interpolate for the latent upscalers; decode -> PIL NEAREST or
LANCZOS resize -> encode for "Nearest" and "Lanczos"; upscaler models are
tests/parity/parity_frame.py's), then StableDiffusionXLImg2ImgPipeline at the
new size with a fresh generator of the same seed. Also checks the output size.

Fails when a PSNR is below --min-psnr (40 dB) or a size is wrong.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from parity_common import finish, parse_args, reference_pipeline
from PIL import Image

from reference.a1111_schedulers import make_scheduler
from reference.compare_images import load_rgb, psnr
from reference.reference_sdxl import a1111_embeds

PROMPT, NEGATIVE, SEED, CFG, W, H = "comic panel, a red fox on a train", "blurry", 7, 5.0, 256, 256
IMG2IMG = [("Euler", "Automatic"), ("Euler a", "Automatic"), ("Heun", "Karras"), ("DPM++ 2M", "Karras"),
           ("DPM++ 2M SDE", "Automatic"), ("DPM++ SDE", "Automatic"), ("DDIM", "Automatic"), ("UniPC", "Automatic"),
           ("LCM", "Automatic")]
IMG2IMG_STEPS, STRENGTH = 8, 0.6
HIRES = [("Latent", "bilinear", False), ("Latent (bicubic)", "bicubic", False), ("Latent (nearest)", "nearest", False),
         ("Latent (antialiased)", "bilinear", True), ("Nearest", None, False), ("Lanczos", None, False)]
HIRES_SCALE, HIRES_STEPS, HIRES_DENOISE, BASE_STEPS = 1.5, 6, 0.5, 6


def main() -> int:
    a, work = parse_args(__doc__)
    from diffusers import StableDiffusionXLImg2ImgPipeline

    pipe = reference_pipeline(a.diffusers)
    i2i = StableDiffusionXLImg2ImgPipeline(**{k: v for k, v in pipe.components.items()}, add_watermarker=False)
    i2i.set_progress_bar_config(disable=True)
    base_config = dict(pipe.scheduler.config)
    sf = pipe.vae.config.scaling_factor
    with torch.inference_mode():
        embeds = a1111_embeds(pipe, PROMPT, NEGATIVE, True)

    def encode(pil: Image.Image) -> torch.Tensor:
        x = torch.from_numpy(np.array(pil.convert("RGB"))).float() / 255.0
        x = x.permute(2, 0, 1)[None] * 2.0 - 1.0
        return pipe.vae.encode(x).latent_dist.mean * sf

    def run_ours(tag: str, *extra: str) -> tuple[Path, Path]:
        png, lat = work / f"{tag}-sdxl.png", work / f"{tag}-sdxl.npy"
        r = subprocess.run([a.binary, "generate", "--model", a.model, "--prompt", PROMPT, "--negative", NEGATIVE,
                            "--seed", str(SEED), "--cfg", str(CFG), *extra, "--out", str(png), "--save-latents", str(lat),
                            "--threads", "1"], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{tag}: sdxl-batch failed ({r.returncode}):\n{r.stderr}")
        return png, lat

    def img2img_ref(sampler, schedule, latents, steps, strength):
        i2i.scheduler = make_scheduler(base_config, sampler, schedule)
        cap = {}

        def on_end(p, i, t, kw):
            cap["latents"] = kw["latents"].detach().clone()
            return kw

        out = i2i(**embeds, image=latents, strength=strength, num_inference_steps=steps, guidance_scale=CFG,
                  generator=[torch.Generator("cpu").manual_seed(SEED)], output_type="pil",
                  callback_on_step_end=on_end, callback_on_step_end_tensor_inputs=["latents"])
        return out.images[0], cap["latents"].float().numpy()

    rows, failed = [], False

    def record(kind, name, ours_png, ours_lat, ref_img, ref_lat, size):
        nonlocal failed
        ref_png = ours_png.with_name(ours_png.name.replace("-sdxl.png", "-ref.png"))
        ref_img.save(ref_png)
        ia = load_rgb(str(ours_png))
        la = np.load(ours_lat)
        ok_size = (ia.shape[1], ia.shape[0]) == size
        p = psnr(ia, load_rgb(str(ref_png))) if ok_size else 0.0
        d = float(np.abs(la - ref_lat).max()) if la.shape == ref_lat.shape else float("inf")
        rows.append({"kind": kind, "case": name, "size": f"{ia.shape[1]}x{ia.shape[0]}", "latent_max_abs": d,
                     "latent_absmax_ref": float(np.abs(ref_lat).max()), "psnr_db": p})
        failed |= not ok_size or not (p >= a.min_psnr)
        print(f"{kind:8} {name:26} {rows[-1]['size']:8} latent max|d| {d:.3e}  PSNR {p:6.2f} dB", flush=True)

    # The init image: a txt2img result of sdxl-batch itself.
    init_png, _ = run_ours("init", "--steps", "6", "--width", str(W), "--height", str(H))
    init_pil = Image.open(init_png).convert("RGB")
    t0 = time.time()
    with torch.inference_mode():
        init_lat = encode(init_pil)
        for sampler, schedule in IMG2IMG:
            tag = f"i2i-{sampler}-{schedule}".replace(" ", "_").replace("+", "p")
            png, lat = run_ours(tag, "--init-image", str(init_png), "--strength", str(STRENGTH), "--steps",
                                str(IMG2IMG_STEPS), "--sampler", sampler, "--schedule", schedule)
            img, ref_lat = img2img_ref(sampler, schedule, init_lat, IMG2IMG_STEPS, STRENGTH)
            record("img2img", f"{sampler} {schedule}", png, lat, img, ref_lat, (W, H))

        # Hires fix with DPM++ 2M SDE Karras: its noise comes from the generator in both passes.
        pipe.scheduler = make_scheduler(base_config, "DPM++ 2M SDE", "Karras")
        first = pipe(**embeds, num_inference_steps=BASE_STEPS, guidance_scale=CFG, width=W, height=H,
                     generator=[torch.Generator("cpu").manual_seed(SEED)], output_type="latent").images
        W2, H2 = int(W * HIRES_SCALE) // 8 * 8, int(H * HIRES_SCALE) // 8 * 8
        for upscaler, mode, aa in HIRES:
            tag = f"hires-{upscaler}".replace(" ", "_").replace("(", "").replace(")", "")
            png, lat = run_ours(tag, "--steps", str(BASE_STEPS), "--width", str(W), "--height", str(H), "--sampler",
                                "DPM++ 2M SDE", "--schedule", "Karras", "--hires-scale", str(HIRES_SCALE),
                                "--hires-upscaler", upscaler, "--hires-steps", str(HIRES_STEPS), "--hires-denoise",
                                str(HIRES_DENOISE))
            if mode is not None:
                up = F.interpolate(first, size=(H2 // 8, W2 // 8), mode=mode, antialias=aa)
            else:
                decoded = pipe.image_processor.postprocess(pipe.vae.decode(first / sf).sample, output_type="pil")[0]
                up = encode(decoded.resize((W2, H2), Image.NEAREST if upscaler == "Nearest" else Image.LANCZOS))
            img, ref_lat = img2img_ref("DPM++ 2M SDE", "Karras", up, HIRES_STEPS, HIRES_DENOISE)
            record("hires", upscaler, png, lat, img, ref_lat, (W2, H2))
    print(f"\nreference time {time.time() - t0:.1f} s")
    return finish(rows, [("kind", "kind", "<8"), ("case", "case", "<26"), ("size", "size", "<8"),
                         ("latent max|d|", "latent_max_abs", ">14.3e"), ("PSNR dB", "psnr_db", ">8.2f")],
                  work / "parity_img2img.json", failed, "a case is below {min_psnr} dB or has the wrong size", "",
                  a.min_psnr)


if __name__ == "__main__":
    sys.exit(main())
