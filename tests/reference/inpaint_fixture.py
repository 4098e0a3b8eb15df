"""A 9-channel SDXL inpainting model for the tests, made from the tiny model.

The tiny diffusers pipeline with its UNet's conv_in widened from 4 to 9 input channels
(diffusers' inpainting layout: the latents, the mask, the masked image's latents): the
first 4 input channels keep the tiny model's weights, the 5 new ones get seeded random
weights of the same spread, so the mask and the masked image change the result. Written
as a diffusers folder and as one single-file checkpoint in the original Stability layout
(reference.single_file_fixture's conversion, the inverse of diffusers' from_single_file).

  python -m reference.inpaint_fixture --diffusers TINY_DIFFUSERS --out DIR [--seed 9]

DIR gets diffusers/ (the pipeline, in_channels 9) and inpaint9.safetensors.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from reference.single_file_fixture import pipeline_to_original


def widen_unet(unet, seed: int):
    """A copy of `unet` whose conv_in takes 9 channels: the old weights for the first 4, seeded
    random ones (the old weights' standard deviation) for the mask and the masked image latents."""
    from diffusers import UNet2DConditionModel

    config = dict(unet.config)
    config["in_channels"] = 9
    wide = UNet2DConditionModel.from_config(config).eval().requires_grad_(False)
    sd = dict(unet.state_dict())
    w = sd["conv_in.weight"]
    gen = torch.Generator().manual_seed(seed)
    extra = torch.randn(w.shape[0], 5, *w.shape[2:], generator=gen, dtype=torch.float32) * float(w.float().std())
    sd["conv_in.weight"] = torch.cat([w, extra.to(w.dtype)], dim=1).contiguous()
    wide.load_state_dict(sd, strict=True)
    return wide


def make(diffusers: Path, out: Path, seed: int = 9):
    """Writes out/diffusers and out/inpaint9.safetensors; returns the pipeline."""
    from diffusers import StableDiffusionXLPipeline
    from safetensors.torch import save_file

    pipe = StableDiffusionXLPipeline.from_pretrained(str(diffusers), dtype=torch.float32, local_files_only=True,
                                                     add_watermarker=False)
    pipe.register_modules(unet=widen_unet(pipe.unet, seed))
    out.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(str(out / "diffusers"), safe_serialization=True)
    save_file(pipeline_to_original(pipe, torch.float32), str(out / "inpaint9.safetensors"))
    return pipe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--diffusers", required=True, help="the tiny model's diffusers folder")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=9)
    a = ap.parse_args()
    make(Path(a.diffusers), Path(a.out), a.seed)
    print(f"wrote {a.out}/diffusers and {a.out}/inpaint9.safetensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
