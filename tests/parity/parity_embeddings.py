#!/usr/bin/env python3
"""Parity (ctest label parity): SDXL textual-inversion embeddings loaded by
sdxl-batch (--embedding-dir) vs diffusers' load_textual_inversion (both
encoders, diffusers' prompt conversion) on the tiny model, CPU.

Random embedding files with the tiny encoders' widths are made here: one of one
vector, one of three, and one used in the negative prompt. Each case runs
`sdxl-batch generate` and reference.reference_sdxl with the embeddings loaded (in this
process), and prints
PSNR against the reference and against the image without the embedding's name
in the prompt (which must be at least 10 dB lower, or the comparison proves
nothing: the tiny model's images depend little on the text), and that the PNG's
parameters name the embeddings used with A1111's short hashes ("TI hashes").

The same process checks A1111 prompt editing and alternation ([from:to:when], [a|b]):
one `sdxl-batch run` of EDIT_CASES sharing UNet calls (rows that switch their text at
different steps; the long one, of two chunks, in a call of its own) against diffusers
with each step's embeddings swapped in by callback_on_step_end, the schedules being
those A1111's grammar gives (tests/reference/prompt_schedule_goldens.json), at >= 65 dB;
and the first case's image against the reference that never switches, which must be
below 65 dB (or the check proves nothing).

    PYTHONPATH=tests parity_embeddings.py --binary B --model TINY --diffusers TINY_DIFFUSERS --work DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from parity_common import cli_args, finish, parse_args, reference_image, run_ours_batch
from testkit import run_ok

from reference.compare_images import load_rgb, psnr

# name, prompt, negative; the embeddings are sdxlhero (1 vector), inkstyle (3) and BadHands (1, matched in
# any case). (diffusers expands a name of several vectors only when the prompt writes it as the file does in
# lower case; sdxl-batch always uses all of its vectors, as A1111 does: the cases keep to what both do.)
CASES = [
    ("one-vector", "comic panel, sdxlhero in a storm", "blurry"),
    ("three-vectors", "comic panel, a lighthouse, inkstyle", "blurry"),
    ("negative-any-case", "comic panel, a lighthouse in a storm", "blurry, badhands"),
    ("two-in-one-prompt", "sdxlhero at dusk, inkstyle", "BADHANDS"),
]
USED = {  # the embeddings each case's PNG names in "TI hashes", in order of first use (prompt, then negative)
    "one-vector": ["sdxlhero"],
    "three-vectors": ["inkstyle"],
    "negative-any-case": ["BadHands"],
    "two-in-one-prompt": ["sdxlhero", "inkstyle", "BadHands"],
}
BASE = {  # the same prompts without the embeddings' names
    "one-vector": ("comic panel, in a storm", "blurry"),
    "three-vectors": ("comic panel, a lighthouse,", "blurry"),
    "negative-any-case": ("comic panel, a lighthouse in a storm", "blurry,"),
    "two-in-one-prompt": ("at dusk,", ""),
}


EDIT_MIN_PSNR = 65.0
EDIT_STEPS = 6
# tag -> (prompt, negative): every prompt and edited negative is in the goldens' corpus at 6 steps. The first
# switches to an embedding (sdxlhero), which changes the tiny model's image far more than words do.
EDIT_CASES = {
    "edit-fraction": ("comic panel, a [lighthouse:sdxlhero:0.5] in a storm", "blurry"),
    "alternate-both": ("comic panel, a [cat|dog] at dusk", "[blurry|lowres]"),
    "nested-steps": ("[sunny:[rainy:snowy:4]:2] harbour", ""),
    "two-chunks": ("[" + "red house, " * 30 + "by the sea:a short prompt:0.5] at noon", "blurry"),
}


def golden_schedule(text: str, steps: int) -> list:
    """A1111's schedule of `text` from the goldens (lark and A1111's grammar)."""
    goldens = Path(__file__).resolve().parents[1] / "reference" / "prompt_schedule_goldens.json"
    for c in json.loads(goldens.read_text(encoding="utf-8"))["cases"]:
        if c["prompt"] == text and c["steps"] == steps and c["hires_steps"] is None:
            return c["schedule"]
    return [[steps, text]]  # no edit: one text


def prompt_editing_rows(a, work: Path, files: list[str]) -> list[dict]:
    settings = {"seed": 11, "steps": EDIT_STEPS, "cfg": 5.0, "width": 128, "height": 128}
    tasks = {tag: {"prompt": p, "negative": n, **settings} for tag, (p, n) in EDIT_CASES.items()}
    pngs = run_ours_batch(a, work, tasks, top={"embeddings_dir": "embeddings"}, extra=["--max-batch", "4"])
    rows = []
    for tag, (prompt, negative) in EDIT_CASES.items():
        ref_png = work / f"{tag}-ref.png"
        reference_image(a.diffusers, ref_png, embeddings=files, prompt=prompt, negative=negative, **settings,
                        prompt_steps=golden_schedule(prompt, EDIT_STEPS),
                        negative_steps=golden_schedule(negative, EDIT_STEPS))
        p = psnr(load_rgb(str(pngs[tag])), load_rgb(str(ref_png)))
        rows.append({"case": "edit: " + tag, "prompt": prompt[:40], "negative": negative, "psnr_db": p,
                     "psnr_vs_without_db": float("nan"), "ti_hashes": "-", "ok": p >= EDIT_MIN_PSNR})
    tag, (prompt, negative) = "edit-fraction", EDIT_CASES["edit-fraction"]
    still_png = work / "edit-never-switches-ref.png"
    first = golden_schedule(prompt, EDIT_STEPS)[0][1]
    reference_image(a.diffusers, still_png, embeddings=files, prompt=first, negative=negative, **settings)
    p = psnr(load_rgb(str(pngs[tag])), load_rgb(str(still_png)))
    rows.append({"case": "edit: never switches", "prompt": first[:40], "negative": negative, "psnr_db": p,
                 "psnr_vs_without_db": float("nan"), "ti_hashes": "-", "ok": p < EDIT_MIN_PSNR})
    return rows


def make_embeddings(diffusers: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    w1 = json.loads((diffusers / "text_encoder" / "config.json").read_text())["hidden_size"]
    w2 = json.loads((diffusers / "text_encoder_2" / "config.json").read_text())["hidden_size"]
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(7)
    for name, n in (("sdxlhero", 1), ("inkstyle", 3), ("BadHands", 1)):  # scaled: a change the tiny model shows
        save_file({"clip_l": 4 * torch.randn(n, w1, generator=g), "clip_g": 4 * torch.randn(n, w2, generator=g)},
                  str(out / f"{name}.safetensors"))


def ti_hashes_ok(png: Path, names: list[str], emb: Path) -> bool:
    """The PNG's parameters carry A1111's `TI hashes: "NAME: HASH, ..."` (the first 12 hex digits of each
    file's sha256) for exactly the embeddings used, or no such item when none was."""
    import hashlib

    from PIL import Image

    with Image.open(png) as im:
        params = im.info["parameters"]
    if not names:
        return "TI hashes" not in params
    items = [f"{n}: {hashlib.sha256((emb / f'{n}.safetensors').read_bytes()).hexdigest()[:12]}" for n in names]
    return f', TI hashes: "{", ".join(items)}", Version:' in params


def main() -> int:
    a, work = parse_args(__doc__)
    emb = work / "embeddings"
    make_embeddings(Path(a.diffusers), emb)
    files = sorted(str(p) for p in emb.glob("*.safetensors"))
    settings = {"seed": 42, "steps": 6, "cfg": 5.0, "width": 256, "height": 256}
    common = cli_args(settings)

    def ours(name, prompt, negative, with_embeddings=True):
        png = work / f"{name}-sdxl.png"
        args = [a.binary, "generate", "--model", a.model, "--prompt", prompt, "--negative", negative, *common,
                "--out", str(png), "--threads", "1"] + (["--embedding-dir", str(emb)] if with_embeddings else [])
        run_ok(args, f"{name}: sdxl-batch")
        return load_rgb(str(png))

    def ref(name, prompt, negative):
        png = work / f"{name}-ref.png"
        reference_image(a.diffusers, png, embeddings=files, prompt=prompt, negative=negative, **settings)
        return load_rgb(str(png))

    rows, failed = [], False
    for name, prompt, negative in CASES:
        ia, ib = ours(name, prompt, negative), ref(name, prompt, negative)
        base = ours(name + "-without", *BASE[name], with_embeddings=False)
        p, p_base = psnr(ia, ib), psnr(ia, base)
        ok = p >= a.min_psnr and p_base <= p - 10  # the embedding changes the image far more than the gap
        hashes = ti_hashes_ok(work / f"{name}-sdxl.png", USED[name], emb)
        failed |= not (ok and hashes)
        rows.append({"case": name, "prompt": prompt, "negative": negative, "psnr_db": p, "psnr_vs_without_db": p_base,
                     "ti_hashes": "ok" if hashes else "wrong", "ok": ok and hashes})
    ours("unused", "comic panel, a lighthouse", "blurry")  # embeddings loaded, none used: no TI hashes item
    unused_ok = ti_hashes_ok(work / "unused-sdxl.png", [], emb)
    failed |= not unused_ok
    rows += prompt_editing_rows(a, work, files)
    failed |= not all(r["ok"] for r in rows[-len(EDIT_CASES) - 1:])
    rows.append({"case": "loaded-not-used", "prompt": "comic panel, a lighthouse", "negative": "blurry",
                 "psnr_db": float("nan"), "psnr_vs_without_db": float("nan"),
                 "ti_hashes": "ok" if unused_ok else "wrong", "ok": unused_ok})
    return finish(rows, [("case", "case", "<26"), ("prompt", "prompt", "<40"), ("negative", "negative", "<16"),
                         ("PSNR dB", "psnr_db", ">8.2f"), ("vs without", "psnr_vs_without_db", ">10.2f"),
                         ("TI hashes", "ti_hashes", ">9")],
                  work / "parity_embeddings.json", failed,
                  "a case is below {min_psnr} dB, its embedding did not change the image, or its PNG's TI hashes "
                  "are wrong; or a prompt edit is below 65 dB, or its never-switching control is not", " and changed by their embeddings, TI hashes right", a.min_psnr)


if __name__ == "__main__":
    sys.exit(main())
