#!/usr/bin/env python3
"""Parity (ctest label parity): single-file checkpoints and VAE files, CPU.

reference.single_file_fixture writes a tiny SDXL pipeline (second text encoder wider
than the first) as a diffusers folder and as one .safetensors file in the original
Stability layout (checked there against diffusers' from_single_file), a second VAE as a
bare original-layout file and as a diffusers folder, and seven files that must be
refused. Then:
  - export_sdxl.py --from FILE --config DIR gives the same tensors, bit for bit, as
    --from the diffusers folder; --vae FILE and --vae DIR give the same VAE;
  - sdxl-batch on those exports vs diffusers on the folders: PSNR >= 40 dB, with the
    checkpoint's VAE and with the other one (which must change the image), and the
    PNG's Model hash / VAE hash are the files' A1111 short hashes;
  - the SD 1.x, refiner, truncated, missing-tensor, 8-input-channel UNet, LoRA and Flux files:
    exit code 1, a message
    naming what is wrong, no output folder and no temporary folder left;
  - VAE switching at run time: the second VAE exported alone (--vae-only) and given to
    `generate --vae` gives the pixels of the export that baked it in; one `run` of a
    batch whose tasks use the model's VAE and the other one ("vae", batched together)
    gives each task its single-VAE image (>= 60 dB: batched vs alone), records the VAE in the
    manifest (a rerun skips both) and loads the VAE folder once; a task naming a
    folder that is not a VAE is refused by validate with its JSON pointer.

    PYTHONPATH=tests parity_single_file.py --binary B --model TINY --diffusers TINY_DIFFUSERS --work DIR
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from parity_common import cli_args, finish, parse_args, reference_image
from testkit import parameters
from testkit import run_ok as run

from reference.compare_images import load_rgb, psnr

EXPORT = Path(__file__).resolve().parents[2] / "scripts" / "export_sdxl.py"
BAD = {"sd1": "SD 1.x", "refiner": "refiner", "truncated": "truncated", "missing-tensor": "1 missing",
       "channels8": "a UNet with 8 input channels", "lora": "a LoRA", "flux": "Flux"}
SETTINGS = {"seed": 11, "steps": 6, "cfg": 5.0, "width": 256, "height": 256}
COMMON = cli_args(SETTINGS)
PROMPT = "comic panel, a lighthouse in a storm"


def export(work: Path, name: str, *args: str) -> Path:
    out = work / name
    run([sys.executable, str(EXPORT), *args, "--out", str(out), "--force", "--check", "none", "--dtype", "fp32"],
        f"export {name}")
    return out


def same_tensors(a: Path, b: Path, files: tuple[str, ...]) -> float:
    """The largest difference between the parameters of two exports (inf if names differ)."""
    import torch

    worst = 0.0
    for f in files:
        pa = dict(torch.jit.load(str(a / f)).named_parameters())
        pb = dict(torch.jit.load(str(b / f)).named_parameters())
        if set(pa) != set(pb):
            return float("inf")
        worst = max(worst, max(float((pa[k] - pb[k]).abs().max()) for k in pa))
    return worst


def short_hash(path: Path, n: int = 10) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:n]


def bad_file_rows(work: Path, fx: Path) -> list[dict]:
    rows = []
    for name, words in BAD.items():
        out = work / f"refused-{name}"
        r = subprocess.run([sys.executable, str(EXPORT), "--from", str(fx / f"{name}.safetensors"), "--config",
                            str(fx / "diffusers"), "--out", str(out), "--check", "none"], capture_output=True, text=True)
        message = (r.stderr.strip().splitlines() or [""])[-1]
        leftovers = [p.name for p in work.glob(f".refused-{name}*")] + ([out.name] if out.exists() else [])
        ok = r.returncode == 1 and words in message and not leftovers
        rows.append({"case": f"refused: {name}", "what": message[-110:], "value": float(r.returncode), "ok": ok})
    return rows


def pixels_equal(a: Path, b: Path) -> bool:
    import numpy as np

    return bool(np.array_equal(load_rgb(str(a)), load_rgb(str(b))))


def vae_switch_rows(a, work: Path, model: Path, vae_dir: Path, with_vae: Path) -> list[dict]:
    """generate --vae and a mixed batch against the images of single-VAE exports."""
    base_png, vae_png = work / f"{model.name}-sdxl.png", work / "generate-vae.png"
    run([a.binary, "generate", "--model", str(model), "--vae", str(vae_dir), "--prompt", PROMPT, *COMMON, "--out",
         str(vae_png), "--threads", "1"], "generate --vae")
    rows = [{"case": "generate --vae DIR", "what": "same pixels as the export with --vae FILE baked in",
             "value": float(pixels_equal(vae_png, with_vae)), "ok": pixels_equal(vae_png, with_vae)}]
    task = {"prompt": PROMPT, "seed": 11, "steps": 6, "cfg": 5.0, "width": 256, "height": 256}
    batch = work / "mixed-vae.json"
    batch.write_text(json.dumps({"version": 1, "tasks": [dict(task, id="own-vae"),
                                           dict(task, id="other-vae", vae=os.path.relpath(vae_dir, work))]}))
    out = work / "mixed-vae-out"
    shutil.rmtree(out, ignore_errors=True)
    run_args = [a.binary, "run", str(batch), "--model", str(model), "--out", str(out), "--max-batch", "2",
                "--threads", "1", "--no-progress"]
    run(run_args, "run (mixed VAEs)")
    lines = {json.loads(x)["task"]: json.loads(x) for x in (out / "manifest.jsonl").read_text().splitlines()}
    own, other = out / lines["own-vae"]["file"], out / lines["other-vae"]["file"]
    # Batched (2 images per UNet call) vs one at a time: the same up to rounding, and far from the other VAE's.
    p_own, p_other = psnr(load_rgb(str(own)), load_rgb(str(base_png))), psnr(load_rgb(str(other)), load_rgb(str(with_vae)))
    ok = min(p_own, p_other) >= 60.0
    rows.append({"case": "one run, two VAEs", "what": f"PSNR dB of each task vs its single-VAE image (own {p_own:.1f})",
                 "value": p_other, "ok": ok})
    report = json.loads((out / "report.json").read_text())
    loads = report["devices"][0].get("engine", {}).get("vae_cache_loads", 0)
    recorded = lines["other-vae"]["params"].get("vae") == str(vae_dir.resolve()) and "vae" not in lines["own-vae"]["params"]
    rerun = run(run_args, "rerun (mixed VAEs)")
    again = json.loads((out / "report.json").read_text())
    skipped = again.get("images_skipped")
    ok = loads == 1 and recorded and skipped == 2 and rerun.returncode == 0
    rows.append({"case": "VAE cache, manifest, resume", "what": f"VAE folder loads {loads}, vae recorded {recorded}, "
                 f"rerun skipped {skipped} of 2", "value": float(loads), "ok": ok})
    bad = work / "bad-vae.json"
    bad.write_text(json.dumps({"version": 1, "tasks": [dict(task, id="wrong", vae=str(model))]}))
    r = subprocess.run([a.binary, "validate", str(bad), "--model", str(model)], capture_output=True, text=True)
    text = r.stdout + r.stderr
    ok = r.returncode != 0 and "/tasks/0/vae" in text and "not a VAE folder" in text
    rows.append({"case": "task vae = a model folder", "what": (text.strip().splitlines() or [""])[-1][-110:],
                 "value": float(r.returncode), "ok": ok})
    return rows


def main() -> int:
    a, work = parse_args(__doc__)
    fx = work / "fixture"
    run([sys.executable, "-m", "reference.single_file_fixture", "--out", str(fx), "--tokenizers", a.diffusers,
         "--dtype", "fp16"], "reference.single_file_fixture")
    ckpt, vae_file = fx / "checkpoint.safetensors", fx / "vae.safetensors"
    m_dir = export(work, "from-folder", "--from", str(fx / "diffusers"))
    m_file = export(work, "from-file", "--from", str(ckpt), "--config", str(fx / "diffusers"))
    m_vae = export(work, "from-file-vae", "--from", str(ckpt), "--config", str(fx / "diffusers"), "--vae", str(vae_file))
    rows = []
    all_ts = ("text_encoder.ts", "text_encoder_2.ts", "unet.ts", "vae_decoder.ts", "vae_encoder.ts")
    d = same_tensors(m_file, m_dir, all_ts)
    rows.append({"case": "file == folder (tensors)", "what": "max |diff| of every parameter", "value": d, "ok": d == 0})
    # The VAE alone (--vae-only) from the bare file and from the diffusers folder: the same tensors, and the
    # file's also the ones baked into the whole export with --vae FILE.
    vae_dir = export(work, "vae-only", "--vae-only", "--vae", str(vae_file), "--config", str(fx / "diffusers"))
    vae_from_dir = export(work, "vae-only-folder", "--vae-only", "--vae", str(fx / "vae-diffusers"))
    vae_ts = ("vae_decoder.ts", "vae_encoder.ts")
    d = max(same_tensors(vae_from_dir, vae_dir, vae_ts), same_tensors(m_vae, vae_dir, vae_ts))
    rows.append({"case": "--vae FILE == --vae DIR", "what": "max |diff| of the VAE (and of the one baked in)",
                 "value": d, "ok": d == 0})

    images = {}
    for case, model, ref_dir in (("checkpoint", m_file, fx / "diffusers"), ("checkpoint + --vae", m_vae,
                                                                             fx / "diffusers-vae2")):
        ours, ref = work / f"{model.name}-sdxl.png", work / f"{model.name}-ref.png"
        run([a.binary, "generate", "--model", str(model), "--prompt", PROMPT, *COMMON, "--out", str(ours),
             "--threads", "1"], f"sdxl-batch on {model.name}")
        reference_image(ref_dir, ref, prompt=PROMPT, **SETTINGS)
        images[case] = load_rgb(str(ours))
        p = psnr(images[case], load_rgb(str(ref)))
        params = parameters(ours)
        want = [f"Model hash: {short_hash(ckpt)}"] + ([f"VAE hash: {short_hash(vae_file)}"] if "vae" in case else [])
        hashes = all(w in params for w in want)
        rows.append({"case": case, "what": "PSNR dB vs diffusers; " + ", ".join(want), "value": p,
                     "ok": p >= a.min_psnr and hashes})
    p = psnr(images["checkpoint"], images["checkpoint + --vae"])
    rows.append({"case": "the other VAE changes it", "what": "PSNR dB between the two", "value": p,
                 "ok": p < a.min_psnr - 10})
    rows += bad_file_rows(work, fx)
    rows += vae_switch_rows(a, work, m_file, vae_dir, work / f"{m_vae.name}-sdxl.png")
    failed = not all(r["ok"] for r in rows)
    return finish(rows, [("case", "case", "<28"), ("what", "what", "<112"), ("value", "value", ">10.3g")],
                  work / "parity_single_file.json", failed,
                  "a single-file export differs from the folder's, is below {min_psnr} dB, has wrong hashes, or a "
                  "bad file was not refused cleanly", ": single files and VAE files load exactly", a.min_psnr)


if __name__ == "__main__":
    sys.exit(main())
