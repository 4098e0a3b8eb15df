"""What the parity scripts (tests/parity/parity_*.py) share: their command line,
the reference pipeline, sdxl-batch's image of a case, and the closing table, JSON and verdict.
What they share with the e2e scripts (running a command, PNG parameters, model.json) is
tests/testkit.py.

The references come from the package tests/reference: ctest runs every parity
script with PYTHONPATH=<repo>/tests (`from reference import ...`, and
`python -m reference.<module>` for the ones run as programs)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from testkit import meta_of, run_ok


def parse_args(doc: str, extra=None, binary_required: bool = True) -> tuple[argparse.Namespace, Path]:
    """The options every parity script takes (plus `extra(ap)`'s); makes --work.
    binary_required=False: --binary may be left out (a script's Python-only mode).
    Returns (args, work)."""
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--binary", required=binary_required, help="the sdxl-batch executable")
    ap.add_argument("--model", required=True, help="the exported model directory")
    ap.add_argument("--diffusers", required=True, help="the same weights as a diffusers pipeline")
    ap.add_argument("--work", required=True, help="scratch directory (images, latents, the JSON)")
    ap.add_argument("--min-psnr", type=float, default=40.0)
    if extra:
        extra(ap)
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    return a, work


def parse_args_python_only(doc: str, python_only_help: str, more=None) -> tuple[argparse.Namespace, Path]:
    """parse_args plus --loras DIR (existing reference.make_test_loras output), --python-only
    (then --binary may be left out) and more(ap)'s options."""
    def extra(ap):
        ap.add_argument("--loras", help="existing reference.make_test_loras output (default: make them under --work)")
        ap.add_argument("--python-only", action="store_true", help=python_only_help)
        if more:
            more(ap)

    return parse_args(doc, extra, binary_required="--python-only" not in sys.argv)


def reference_pipeline(diffusers_dir: str):
    """diffusers' StableDiffusionXLPipeline in fp32 on the CPU, one thread, no
    watermark, no progress bar: the reference every parity test compares with."""
    import torch
    from diffusers import StableDiffusionXLPipeline

    torch.set_num_threads(1)
    pipe = StableDiffusionXLPipeline.from_pretrained(diffusers_dir, dtype=torch.float32, local_files_only=True,
                                                     add_watermarker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def finish(rows: list[dict], columns: list[tuple[str, str, str]], json_path: Path, failed: bool, fail_why: str,
           ok_what: str, min_psnr: float) -> int:
    """Prints rows as a table (columns: header, key, format spec such as '>8.2f'),
    writes them to json_path, and returns the exit code with a FAIL / all-passed line."""
    def width(spec: str) -> str:
        digits = "".join(c for c in spec.split(".")[0] if c.isdigit())
        return ("<" if spec.startswith("<") else ">") + digits

    print(" ".join(f"{h:{width(s)}}" for h, _, s in columns))
    for r in rows:
        print(" ".join(f"{r[k]:{s}}" for _, k, s in columns) + ("" if r.get("ok", True) else "  FAIL"))
    json_path.write_text(json.dumps(rows, indent=1))
    if failed:
        print(f"FAIL: {fail_why.format(min_psnr=min_psnr)}")
        return 1
    print(f"all {len(rows)} cases >= {min_psnr} dB{ok_what}")
    return 0


def cli_args(settings: dict) -> list[str]:
    """{"seed": 42, "width": 256} -> ["--seed", "42", "--width", "256"]: the same settings for
    sdxl-batch's command line and reference_image's keywords."""
    return [x for k, v in settings.items() for x in (f"--{k.replace('_', '-')}", str(v))]


def run_ours(a, work: Path, tag: str, args: list[str]) -> tuple[Path, Path]:
    """`sdxl-batch generate` on --model with `args` (the case's settings), one thread -> the PNG
    work/TAG-sdxl.png and its final latents work/TAG-sdxl.npy."""
    png, lat = work / f"{tag}-sdxl.png", work / f"{tag}-sdxl.npy"
    run_ok([a.binary, "generate", "--model", a.model, *args, "--out", str(png), "--save-latents", str(lat),
            "--threads", "1"], f"sdxl-batch {tag}")
    return png, lat


def run_ours_batch(a, work: Path, cases: dict[str, dict], top: dict | None = None,
                   extra: list[str] = ()) -> dict[str, Path]:
    """Every case (tag -> its task's batch-file keys: prompt, seed, sampler, ...) as one task of
    one batch file, made by ONE `sdxl-batch run` on --model with one thread (the model is loaded
    once, and cases of one shape share UNet calls: the batching that the determinism promise
    says changes no image). top: more top-level keys (loras, embeddings_dir, ...); extra: more
    run flags. The output folder is made afresh (a kept manifest would resume old images).
    -> {tag: its PNG}."""
    import re
    import shutil

    bad = [t for t in cases if not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]*", t)]
    assert not bad, f"case tags must be file-name safe: {bad}"
    out = work / "ours-batch"
    shutil.rmtree(out, ignore_errors=True)
    batch = {"version": 1, "output": {"template": "{id}-{index}.png"}, **(top or {}),
             "tasks": [dict(id=tag, **keys) for tag, keys in cases.items()]}
    bf = work / "ours-batch.json"
    bf.write_text(json.dumps(batch, indent=1))
    run_ok([a.binary, "run", str(bf), "--model", a.model, "--out", str(out), "--threads", "1", "--no-progress",
            *extra], f"sdxl-batch run {bf.name}")
    return {tag: out / f"{tag}-0.png" for tag in cases}


def image_row(case: str, png: Path, lat: Path | None, ref_png: Path, ref_lat, min_psnr: float) -> dict:
    """A case's row: PSNR of sdxl-batch's PNG (and, where written, .npy latents) vs the
    reference's (ref_lat: an array), ok at >= min_psnr."""
    import numpy as np

    from reference.compare_images import load_rgb, psnr

    what = "PSNR dB vs diffusers"
    if lat is not None:
        ours_lat = np.load(lat)
        d = float(np.abs(ours_lat - ref_lat).max()) if ours_lat.shape == ref_lat.shape else float("inf")
        what += f" (latent max|diff| {d:.3g})"
    p = psnr(load_rgb(str(png)), load_rgb(str(ref_png)))
    return {"case": case, "what": what, "value": p, "ok": p >= min_psnr}


def reference_image(diffusers: str, png: Path, loras: list[tuple[str, float]] = (), embeddings: list[str] = (),
                    **settings) -> tuple:
    """reference.reference_sdxl's image in this process, saved as `png`: what `python -m
    reference.reference_sdxl` makes, without starting Python, torch and diffusers again for each
    image. The pipeline is loaded once per folder and set of embeddings, and afresh for each set
    of `loras` (fused into its weights). settings are reference_sdxl.generate's (prompt, negative,
    seed, steps, cfg, width, height, ...). One torch thread. -> (the final latents, the LoRA
    layer counts)."""
    import torch

    from reference.reference_sdxl import generate, load_pipeline

    torch.set_num_threads(1)
    key = (str(diffusers), tuple(embeddings))
    if loras:
        pipe, counts = load_pipeline(str(diffusers), loras=list(loras), embeddings=list(embeddings))
    else:
        if key not in _PIPES:
            _PIPES[key] = load_pipeline(str(diffusers), embeddings=list(embeddings))
        pipe, counts = _PIPES[key]
    img, lat = generate(pipe, **settings)
    png.parent.mkdir(parents=True, exist_ok=True)
    img.save(png)
    return lat, counts


_PIPES: dict = {}


def unet_inputs(model: Path, gen, width: int = 256, height: int = 256) -> tuple:
    """A CFG batch of 2 rows for `model`'s UNet: latent, timestep (601), context, text_embeds, time_ids."""
    import torch

    u = meta_of(model)["unet"]
    return (torch.randn(2, 4, height // 8, width // 8, generator=gen), torch.tensor([601.0, 601.0]),
            torch.randn(2, 77, u["context_dim"], generator=gen), torch.randn(2, u["pooled_dim"], generator=gen),
            torch.tensor([[float(height), float(width), 0.0, 0.0, float(height), float(width)]] * 2))


def residuals(model: Path, gen, width: int = 256, height: int = 256) -> tuple:
    """Random ControlNet residuals (times 0.5) of `model`'s unet.control layout, 2 rows."""
    import torch

    c = meta_of(model)["unet"]["control"]
    return tuple(torch.randn(2, ch, height // 8 // d, width // 8 // d, generator=gen) * 0.5
                 for ch, d in zip(c["channels"], c["downscales"]))

