#!/usr/bin/env python3
"""Parity (ctest label parity): LoRAs applied by sdxl-batch vs the same files
fused into diffusers' StableDiffusionXLPipeline (reference.lora_reference:
diffusers' key conversion, peft's merge math) on the tiny model, CPU.

Random LoRA files in each format come from reference.make_test_loras. Each
case runs `sdxl-batch generate --lora ...` and reference.reference_sdxl with the
LoRAs fused (in this process), and prints PSNR against the reference and against the image
without LoRA (which must be clearly lower: the LoRA has to change the image,
or the comparison proves nothing). Fails when a PSNR < --min-psnr (40 dB) or a
LoRA leaves the image unchanged.

    PYTHONPATH=tests parity_lora.py --binary B --model TINY --diffusers TINY_DIFFUSERS --work DIR [--loras DIR]
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from parity_common import cli_args, finish, parse_args, reference_image
from testkit import run_ok

from reference.compare_images import load_rgb, psnr

PROMPT = "comic panel, a lighthouse keeper in a storm, bold ink lines"
SETTINGS = {"negative": "blurry", "seed": 42, "steps": 6, "cfg": 5.0, "width": 256, "height": 256}
# name, [(file stem, weight)], prompt suffix with tags (resolved with --lora-dir)
CASES = [
    ("kohya-unet-sgm", [("kohya_unet", 1.0)], ""),
    ("kohya-unet-diffusers", [("kohya_unet_dn", 0.8)], ""),
    ("kohya-te1+te2", [("kohya_te", 1.0)], ""),
    ("peft-unet+te", [("peft", 1.0)], ""),
    ("diffusers-lora.down", [("diffusers_old", 1.0)], ""),
    ("kohya-locon-conv", [("locon", 1.0)], ""),
    ("stacked-3", [("kohya_unet", 0.7), ("peft", -0.6), ("kohya_te", 0.5)], ""),
    ("prompt-tags", [], " <lora:locon:0.9>, <lora:kohya_te:1.2>"),
]


def main() -> int:
    a, work = parse_args(__doc__, lambda ap: ap.add_argument(
        "--loras", help="existing reference.make_test_loras output (default: make them under --work)"))

    loras = Path(a.loras) if a.loras else work / "loras"
    if not a.loras:
        subprocess.run([sys.executable, "-m", "reference.make_test_loras", "--out", str(loras)], check=True,
                       capture_output=True)
    common = cli_args(SETTINGS)

    def ours(name, prompt, specs):
        png = work / f"{name}-sdxl.png"
        args = [a.binary, "generate", "--model", a.model, "--prompt", prompt, *common, "--out", str(png), "--threads", "1",
                "--lora-dir", str(loras), "--strict-lora"]
        for stem, w in specs:
            args += ["--lora", f"{loras / (stem + '.safetensors')}:{w}"]
        run_ok(args, f"{name}: sdxl-batch")
        return png

    def ref(name, prompt, specs):
        png = work / f"{name}-ref.png"
        _, layers = reference_image(a.diffusers, png, [(str(loras / (stem + ".safetensors")), w) for stem, w in specs],
                                    prompt=prompt, **SETTINGS)
        return png, layers

    base = load_rgb(str(ours("base", PROMPT, [])))
    rows, failed = [], False
    for name, specs, tags in CASES:
        tag_specs = []
        for t in tags.split("<lora:")[1:]:
            stem, w = t.split(">")[0].split(":")
            tag_specs.append((stem, float(w)))
        ia = load_rgb(str(ours(name, PROMPT + tags, specs)))
        # The reference gets the text without the tags (A1111 removes them) and the tags' LoRAs fused.
        ref_prompt = PROMPT + "".join(t.split(">", 1)[1] if ">" in t else t for t in tags.split("<lora:"))
        ref_png, layers = ref(name, ref_prompt, specs + tag_specs)
        ib = load_rgb(str(ref_png))
        p, p_base = psnr(ia, ib), psnr(ia, base)
        ok = p >= a.min_psnr and p_base < a.min_psnr  # without the LoRA it would fail parity
        failed |= not ok
        rows.append({"case": name, "loras": ", ".join(f"{s}:{w}" for s, w in specs + tag_specs),
                     "ref_layers": sum(layers.values()), "psnr_db": p, "psnr_vs_no_lora_db": p_base, "ok": ok})
    return finish(rows, [("case", "case", "<22"), ("LoRAs (file:weight)", "loras", "<44"), ("layers", "ref_layers", ">6"),
                         ("PSNR dB", "psnr_db", ">8.2f"), ("vs no-LoRA", "psnr_vs_no_lora_db", ">10.2f")],
                  work / "parity_lora.json", failed, "a case is below {min_psnr} dB, or its LoRA did not change the image",
                  " and changed by their LoRAs", a.min_psnr)


if __name__ == "__main__":
    sys.exit(main())
