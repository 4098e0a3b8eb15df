"""Golden images of PIL's Image.resize with LANCZOS and NEAREST (what diffusers'
control image processor and the hires fix's "Nearest" upscaler use), for
image/resize.cpp: seeded random RGB images, shrunk, enlarged and stretched
along one axis; pixels as flat lists of 8-bit values. And ("clip") the
pixel_values transformers' CLIPImageProcessor(size=S, crop_size=S) makes of
such images, as diffusers' IP-Adapter loading builds it (control/clip_image.cpp).

    PYTHONPATH=tests python -m reference.gen_resize_goldens --out resize.json
"""
from __future__ import annotations

import argparse
import json

import numpy as np
from PIL import Image

# (input width, height) -> (output width, height): shrink, enlarge, odd ratios, one axis only.
CASES = [((37, 23), (16, 16)), ((16, 16), (37, 23)), ((64, 48), (64, 20)), ((30, 50), (71, 50)),
         ((200, 320), (96, 96)), ((9, 7), (1, 1)), ((5, 40), (64, 8))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rng = np.random.default_rng(21)
    cases = []
    for (w, h), (ow, oh) in CASES:
        # Random pixels with smooth and sharp parts, so ringing and clipping both show.
        base = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        base[: h // 2, : w // 2] = np.linspace(0, 255, w // 2 or 1, dtype=np.uint8)[None, :, None]
        img = Image.fromarray(base, "RGB")
        for name, mode in (("lanczos", Image.LANCZOS), ("nearest", Image.NEAREST)):
            out = np.array(img.resize((ow, oh), resample=mode))
            cases.append({"filter": name, "width": w, "height": h, "out_width": ow, "out_height": oh,
                          "input": base.reshape(-1).tolist(), "output": out.reshape(-1).tolist()})
    with open(a.out, "w") as f:
        json.dump({"pillow": Image.__version__, "cases": cases, "clip": clip_cases(rng)}, f)


# (input width, height, S): wider, taller, square, enlarging, odd sizes.
CLIP_CASES = [(96, 64, 32), (64, 96, 32), (300, 200, 224), (32, 32, 32), (33, 70, 48), (20, 12, 64)]


def clip_cases(rng) -> list[dict]:
    import transformers
    from transformers import CLIPImageProcessor

    out = []
    for w, h, size in CLIP_CASES:
        base = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        base[: h // 2] = np.linspace(0, 255, w, dtype=np.uint8)[None, :, None]
        proc = CLIPImageProcessor(size=size, crop_size=size)
        px = proc(Image.fromarray(base, "RGB"), return_tensors="pt").pixel_values[0].numpy()
        out.append({"width": w, "height": h, "size": size, "mean": list(proc.image_mean), "std": list(proc.image_std),
                    "input": base.reshape(-1).tolist(), "pixel_values": px.reshape(-1).astype(float).tolist(),
                    "transformers": transformers.__version__})
    return out


if __name__ == "__main__":
    main()
