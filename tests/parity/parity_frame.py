#!/usr/bin/env python3
"""Parity (ctest parity_frame_cpu): a task's final upscale ("upscale", the frame) in `sdxl-batch run`.

ONE `run` process (tiny model, CPU) makes one plain image and the same image (same seed and settings)
brought to four frames: an upscaler model (Real-ESRGAN Compact x4, random weights, exported by
export_sdxl.py --upscaler) by 2, the model to a 200x120 frame with crop, to 120x200 with pad, and
Lanczos by 1.5. Each frame is compared with the reference made from the plain PNG of the same run:
spandrel's module on the original file through ComfyUI's tiling (reference.upscaler_fixtures), the
8-bit conversion, A1111's passes, PIL's LANCZOS and the crop or pad: PSNR >= --min-psnr (LANCZOS
alone must be exact). Each frame's parameters end with A1111's Postprocess fields, as `sdxl-batch
upscale` writes them; the manifest records the settings and the weights' sha256.
Then: an unchanged rerun skips every image; the same batch with another upscaler folder (Real-ESRGAN
x2) for one task makes that frame again (and only it), and its frame matches its reference;
`generate` with the same settings and --upscale-model/--upscale writes the same PNG pixels as the run;
`validate` (and `run`) refuse a batch of bad "upscale" keys with exit 2, naming each task's pointer.

The hires fix with an upscaler model (issue 40) rides in the same run: task "hires" has
"hires": {"upscaler": "models/up/compact_x4", "scale": 2.5, ...}. Its reference is A1111's hires
semantics on diffusers: StableDiffusionXLPipeline's first pass (output latents), the VAE decode to 8
bits, the model's passes through ComfyUI's tiling until the target size (reference.upscaler_fixtures
a1111_upscale), PIL LANCZOS to 240x320, the VAE encode (the latents' mean), and
StableDiffusionXLImg2ImgPipeline at the hires denoise with a fresh generator of the seed: PSNR >=
--min-psnr. Its parameters say "Hires upscaler: compact_x4"; the manifest records the weights' sha256.
The changed rerun also gives it realesrgan_x2 (two x2 passes, then LANCZOS down): made again, checked
against its reference; `generate --hires-upscaler DIR` writes the run's pixels. Bad hires folders (a
missing one, a model folder) are refused by validate and run (exit 2, the task's pointer) and by
generate (exit 2); `run --skip-invalid` makes the good task of that batch (exit 3).
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from parity_common import parse_args
from reference.upscaler_fixtures import a1111_upscale, compact, realesrgan
from safetensors.torch import save_file
from testkit import parameters, pixels, read_manifest, read_report, run

EXPORT = Path(__file__).resolve().parents[2] / "scripts" / "export_sdxl.py"
W, H, SEED, STEPS = 96, 128, 4242, 3
PROMPT = "a lighthouse keeper at dusk, comic panel"
TASKS = {  # task id -> its "upscale" ("up/..." folders under the batch file's folder)
    "x2": {"model": "models/up/compact_x4", "scale": 2},
    "crop": {"model": "models/up/compact_x4", "size": "200x120", "fit": "crop"},
    "pad": {"model": "models/up/compact_x4", "size": "120x200", "fit": "pad"},
    "lanczos": {"model": "Lanczos", "scale": 1.5},
}
HIRES = {"scale": 2.5, "upscaler": "models/up/compact_x4", "steps": 3, "denoise": 0.5}  # task "hires"
HW, HH = int(W * 2.5) // 8 * 8, int(H * 2.5) // 8 * 8
CFG = 5


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def reference_frame(model, scale: int, u8: np.ndarray, up: dict) -> np.ndarray:
    """A1111's upscale_with_model + the frame: model passes (ComfyUI's tiling, 8-bit truncation) while
    smaller than the resize size on either side (at most 3), PIL LANCZOS to it, then the crop or pad."""
    h, w = u8.shape[:2]
    if "scale" in up:
        fw, fh = max(1, round(w * up["scale"])), max(1, round(h * up["scale"]))
        rw, rh, fit = fw, fh, "stretch"
    else:
        fw, fh = map(int, up["size"].split("x"))
        fit = up.get("fit", "stretch")
        k = {"crop": max, "pad": min}.get(fit, max)(fw / w, fh / h)
        clamp = {"crop": max, "pad": min}.get(fit)
        rw, rh = (fw, fh) if fit == "stretch" else (clamp(max(1, round(w * k)), fw), clamp(max(1, round(h * k)), fh))
    img = a1111_upscale(model, scale, u8, rw, rh)
    if fit == "crop":
        sx, sy = (rw - fw) // 2, (rh - fh) // 2
        return img[sy:sy + fh, sx:sx + fw]
    if fit == "pad":
        out = np.zeros((fh, fw, 3), np.uint8)
        oy, ox = (fh - rh) // 2, (fw - rw) // 2
        out[oy:oy + rh, ox:ox + rw] = img
        return out
    return img


def batch_text(model_dir: str, tasks: dict, hires: dict | None = None) -> str:
    """The plain task, one task per `tasks` entry (its "upscale"), then one per `hires` entry (its "hires")."""
    base = {"prompt": PROMPT, "seed": SEED}
    items = [dict(base, id="plain")] + [dict(base, id=k, upscale=v) for k, v in tasks.items()]
    items += [dict(base, id=k, hires=v) for k, v in (hires or {}).items()]
    return json.dumps({"version": 1, "model": model_dir, "output": {"dir": "out"},
                       "defaults": {"width": W, "height": H, "steps": STEPS, "cfg": CFG}, "tasks": items}, indent=1)


class HiresReference:
    """A1111's hires fix with an upscaler model on diffusers (the tiny model, CPU fp32): the first pass
    and its decode once, then per upscaler the passes + LANCZOS, the encode and the img2img pass."""

    def __init__(self, diffusers_dir: str):
        from diffusers import StableDiffusionXLImg2ImgPipeline
        from parity_common import reference_pipeline
        from reference.a1111_schedulers import make_scheduler
        from reference.reference_sdxl import a1111_embeds

        self.pipe = reference_pipeline(diffusers_dir)
        self.pipe.scheduler = make_scheduler(dict(self.pipe.scheduler.config), "Euler", "Automatic")
        self.i2i = StableDiffusionXLImg2ImgPipeline(**self.pipe.components, add_watermarker=False)
        self.i2i.set_progress_bar_config(disable=True)
        self.sf = self.pipe.vae.config.scaling_factor
        with torch.inference_mode():
            self.embeds = a1111_embeds(self.pipe, PROMPT, "", True)
            first = self.pipe(**self.embeds, num_inference_steps=STEPS, guidance_scale=CFG, width=W, height=H,
                              generator=[torch.Generator("cpu").manual_seed(SEED)], output_type="latent").images
            decoded = self.pipe.image_processor.postprocess(self.pipe.vae.decode(first / self.sf).sample, "pil")[0]
        self.first_u8 = np.array(decoded.convert("RGB"))  # writable: torch.from_numpy takes it

    def image(self, model, scale: int, hires: dict) -> np.ndarray:
        big = a1111_upscale(model, scale, self.first_u8, HW, HH)
        with torch.inference_mode():
            x = torch.from_numpy(big).float().permute(2, 0, 1)[None] / 255.0 * 2.0 - 1.0
            latents = self.pipe.vae.encode(x).latent_dist.mean * self.sf
            out = self.i2i(**self.embeds, image=latents, strength=hires["denoise"], num_inference_steps=hires["steps"],
                           guidance_scale=CFG, generator=[torch.Generator("cpu").manual_seed(SEED)], output_type="pil")
        return np.asarray(out.images[0].convert("RGB"))


def check_hires(a, work: Path, out: Path, ref: HiresReference, models: dict, hires: dict) -> tuple[list[dict], list[str]]:
    """Task "hires" against the reference of its upscaler; its parameters and manifest line."""
    png = files_of(out)["hires"]
    stem = Path(hires["upscaler"]).name
    model, scale = models[stem]
    want = ref.image(model, scale, hires)
    got = pixels(png).astype(np.uint8)
    p = psnr(got, want) if got.shape == want.shape else float("-inf")
    print(f"hires    {stem:14} {got.shape[1]}x{got.shape[0]}: {p:.2f} dB")
    errors = [] if p >= a.min_psnr else [f"hires {stem}: PSNR {p:.2f} dB < {a.min_psnr} (ours {got.shape}, "
                                         f"reference {want.shape})"]
    params = parameters(png)
    tail = f"Hires upscale: 2.5, Hires steps: {hires['steps']}, Hires upscaler: {stem}"
    if tail not in params or f"Size: {W}x{H}" not in params:
        errors.append(f"hires {stem}: parameters {params!r} should hold {tail!r} and the first pass's size")
    mh = next(e for e in read_manifest(out)[::-1] if e["task"] == "hires")["params"].get("hires", {})
    if len(mh.get("weights_sha256", "")) != 64 or mh.get("upscaler") != str(work / hires["upscaler"]):
        errors.append(f"hires {stem}: manifest hires {mh}")
    return [{"task": "hires", "upscaler": stem, "frame": f"{got.shape[1]}x{got.shape[0]}", "psnr_db": p}], errors


def files_of(out: Path) -> dict[str, Path]:
    """task id -> its PNG, from the newest manifest line of each task."""
    return {e["task"]: out / e["file"] for e in read_manifest(out)}


def check_frames(a, work: Path, out: Path, models: dict, tasks: dict) -> tuple[list[dict], list[str]]:
    """Each task's frame against the reference made from the plain image; parameters and manifest."""
    files = files_of(out)
    plain = pixels(files["plain"]).astype(np.uint8)
    manifest = {e["task"]: e for e in read_manifest(out)}
    rows, errors = [], []
    for tid, up in tasks.items():
        stem = Path(up["model"]).name
        model, scale = models.get(stem, (None, 1))
        ref = reference_frame(model, scale, plain, up)
        got = pixels(files[tid]).astype(np.uint8)
        p = psnr(got, ref) if got.shape == ref.shape else float("-inf")
        need = float("inf") if model is None else a.min_psnr
        rows.append({"task": tid, "upscaler": stem, "frame": f"{got.shape[1]}x{got.shape[0]}", "psnr_db": p})
        print(f"{tid:8} {stem:14} {got.shape[1]}x{got.shape[0]}: {p:.2f} dB")
        if p < need:
            errors.append(f"{tid}: PSNR {p:.2f} dB < {need} (ours {got.shape}, reference {ref.shape})")
        what = (f"Postprocess upscale by: {up['scale']:g}" if "scale" in up else
                f"Postprocess upscale to: {up['size']}, Postprocess upscale fit: {up.get('fit', 'stretch')}")
        want = f"Size: {W}x{H}, Model: " 
        params = parameters(files[tid])
        tail = f"{what}, Postprocess upscaler: {stem if model is not None else 'Lanczos'}"
        if not params.endswith(tail) or want not in params:
            errors.append(f"{tid}: parameters {params[-220:]!r} should end with {tail!r} and keep {want!r}")
        mu = manifest[tid]["params"].get("upscale", {})
        if model is not None and (len(mu.get("weights_sha256", "")) != 64 or mu.get("model") != str(work / up["model"])):
            errors.append(f"{tid}: manifest upscale {mu}")
    return rows, errors


def bad_batch(model_dir: str, work: Path) -> tuple[str, list[str]]:
    """A batch of bad "upscale" keys and the pointers validate must name."""
    bad = {
        "missing": {"model": "models/up/nowhere", "scale": 2},
        "not_upscaler": {"model": model_dir, "scale": 2},
        "too_big": {"model": "Lanczos", "size": "20000x1920"},
        "scale_big": {"model": "Lanczos", "scale": 200},
        "zero": {"model": "Lanczos", "scale": 0},
        "negative": {"model": "Lanczos", "scale": -1},
        "both": {"model": "Lanczos", "scale": 2, "size": "100x100"},
        "fit": {"model": "Lanczos", "size": "100x100", "fit": "zoom"},
    }
    bad_hires = {"hires_missing": {"scale": 2, "upscaler": "models/up/nowhere"},
                 "hires_not_upscaler": {"scale": 2, "upscaler": model_dir}}
    want = ["/tasks/1/upscale/model", "/tasks/2/upscale/model", "/tasks/3/upscale/size", "/tasks/4/upscale/scale",
            "/tasks/5/upscale/scale", "/tasks/6/upscale/scale", "/tasks/7/upscale/scale", "/tasks/8/upscale/fit",
            "/tasks/9/hires/upscaler", "/tasks/10/hires/upscaler"]
    text = json.loads(batch_text(model_dir, bad, bad_hires))
    return json.dumps(text), want


def check_bad(a, work: Path) -> list[str]:
    text, want = bad_batch(str(Path(a.model).resolve()), work)
    path = work / "bad" / "bad.json"  # its own output folder (bad/out)
    path.parent.mkdir()
    path.write_text(text)
    errors = []
    for cmd in (["validate", path, "--model", a.model], ["run", path, "--device", "cpu"]):
        r = run([a.binary, *cmd], timeout=120)
        said = r.stdout + r.stderr
        missing = [p for p in want if f"{p}:" not in said and f"{p} (line" not in said]
        print(f"{cmd[0]} of the bad batch: exit {r.returncode}, {len(want) - len(missing)}/{len(want)} pointers named")
        if r.returncode != 2 or missing:
            errors.append(f"{cmd[0]} bad batch: exit {r.returncode}, missing {missing}:\n{said[-1500:]}")
    if "nowhere" not in said or "upscaler" not in said:
        errors.append(f"the missing folder's message does not name it:\n{said[-800:]}")
    # --skip-invalid: the good task of the same batch is made, the bad ones reported (exit 3).
    r = run([a.binary, "run", path, "--device", "cpu", "--skip-invalid"], timeout=300)
    bad_out = path.parent / "out"
    made = sorted(e["task"] for e in read_manifest(bad_out)) if (bad_out / "manifest.jsonl").exists() else []
    print(f"run --skip-invalid of the bad batch: exit {r.returncode}, made {made}")
    if r.returncode != 3 or made != ["plain"]:
        errors.append(f"run --skip-invalid: exit {r.returncode}, made {made} (want 3, ['plain'])")
    # generate refuses the same folders (exit 2, naming the flag and the folder).
    for folder in (work / "models/up/nowhere", Path(a.model)):
        r = run([a.binary, "generate", "--model", a.model, "--device", "cpu", "--prompt", PROMPT, "--width", W,
                 "--height", H, "--hires-scale", 2, "--hires-upscaler", folder, "--out", work / "never.png"], timeout=120)
        said = r.stdout + r.stderr
        print(f"generate --hires-upscaler {folder.name}: exit {r.returncode}")
        if r.returncode != 2 or "--hires-upscaler" not in said or str(folder) not in said:
            errors.append(f"generate --hires-upscaler {folder}: exit {r.returncode}:\n{said[-800:]}")
    return errors


def check_story_config(a, work: Path) -> list[str]:
    """configs/story-frames.json (768x1344 panels, 1080x1920 frames) validates where its upscaler folder is."""
    cfg = work / "configs" / "story-frames.json"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(EXPORT.parents[1] / "configs" / "story-frames.json", cfg)
    story = json.loads(cfg.read_text())
    up = story["defaults"]["upscale"]
    r = run([a.binary, "validate", cfg, "--model", a.model], timeout=120)
    print(f"validate configs/story-frames.json: exit {r.returncode}")
    errors = [] if r.returncode == 0 else [f"story-frames.json: exit {r.returncode}\n{(r.stdout + r.stderr)[-1200:]}"]
    if (story["defaults"]["width"], story["defaults"]["height"], up["size"], up.get("fit")) != (768, 1344, "1080x1920", "crop"):
        errors.append(f"story-frames.json: defaults {story['defaults']}")
    return errors


def main() -> int:
    a, work = parse_args(__doc__)
    from spandrel import ModelLoader

    torch.set_num_threads(1)
    t0 = time.time()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    src = work / "files"
    src.mkdir()
    g = torch.Generator().manual_seed(40)  # the published key layouts (reference.upscaler_fixtures), random weights
    torch.save({"params": compact(16, 4, 4, 3, g)}, src / "compact_x4.pth")
    torch.save({"params_ema": realesrgan(16, 32, 1, 12, g)}, src / "realesrgan_x2.pth")
    anime = src / "RealESRGAN_x4plus_anime_6B.safetensors"  # the folder configs/story-frames.json names
    save_file(realesrgan(16, 32, 6, 3, g), str(anime))
    r = run([sys.executable, EXPORT, "--upscaler", src / "compact_x4.pth", src / "realesrgan_x2.pth", anime,
             "--out", work / "models/up"], timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"export failed ({r.returncode}):\n{r.stderr[-3000:]}")
    models = {Path(f).stem: (ModelLoader("cpu").load_from_file(src / f).model.eval().float(), s)
              for f, s in (("compact_x4.pth", 4), ("realesrgan_x2.pth", 2))}
    print(f"fixtures and export: {time.time() - t0:.1f} s")

    model_dir = str(Path(a.model).resolve())
    batch = work / "story.json"
    batch.write_text(batch_text(model_dir, TASKS, {"hires": HIRES}))
    out = work / "out"
    cmd = [a.binary, "run", batch, "--device", "cpu"]
    t = time.time()
    r = run(cmd, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"run failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    print(f"run, 6 images: {time.time() - t:.1f} s")
    rows, errors = check_frames(a, work, out, models, TASKS)
    t = time.time()
    ref = HiresReference(a.diffusers)
    more, more_errors = check_hires(a, work, out, ref, models, HIRES)
    rows += more
    errors += more_errors
    print(f"hires reference: {time.time() - t:.1f} s")

    # An unchanged rerun skips everything; another upscaler for one task makes that frame only.
    r = run(cmd, timeout=300)
    rep = read_report(out)
    skipped = rep.get("images_skipped")
    print(f"unchanged rerun: exit {r.returncode}, skipped {skipped}")
    if r.returncode != 0 or skipped != 6:
        errors.append(f"unchanged rerun: exit {r.returncode}, skipped {skipped} (want 6): {json.dumps(rep)[:600]}")
    changed = dict(TASKS, x2={"model": "models/up/realesrgan_x2", "scale": 2})
    hires_x2 = dict(HIRES, upscaler="models/up/realesrgan_x2")
    batch.write_text(batch_text(model_dir, changed, {"hires": hires_x2}))
    before = {k: p.stat().st_mtime_ns for k, p in files_of(out).items()}
    r = run(cmd, timeout=300)
    after = {k: p.stat().st_mtime_ns for k, p in files_of(out).items()}
    remade = sorted(k for k in after if after[k] != before.get(k))
    print(f"rerun with another upscaler for x2 and hires: exit {r.returncode}, remade {remade}")
    if r.returncode != 0 or remade != ["hires", "x2"]:
        errors.append(f"changed upscaler rerun: exit {r.returncode}, remade {remade} (want ['hires', 'x2'])")
    more, more_errors = check_frames(a, work, out, models, {"x2": changed["x2"]})
    rows += [dict(x, task="x2 (rerun)") for x in more]
    errors += more_errors
    more, more_errors = check_hires(a, work, out, ref, models, hires_x2)
    rows += [dict(x, task="hires (rerun)") for x in more]
    errors += more_errors

    # generate --hires-upscaler DIR makes the run's hires image.
    gen = work / "generate-hires.png"
    r = run([a.binary, "generate", "--model", a.model, "--device", "cpu", "--prompt", PROMPT, "--seed", SEED,
             "--width", W, "--height", H, "--steps", STEPS, "--cfg", CFG, "--hires-scale", HIRES["scale"],
             "--hires-upscaler", work / hires_x2["upscaler"], "--hires-steps", HIRES["steps"], "--hires-denoise",
             HIRES["denoise"], "--out", gen], timeout=300)
    same = r.returncode == 0 and np.array_equal(pixels(gen), pixels(files_of(out)["hires"]))
    print(f"generate --hires-upscaler realesrgan_x2: {'same pixels as the run' if same else 'DIFFERENT'}")
    if not same:
        errors.append(f"generate --hires-upscaler: exit {r.returncode}, same pixels {same}: {r.stderr[-800:]}")

    # generate's flags make the same frame as the run.
    gen = work / "generate-x2.png"
    r = run([a.binary, "generate", "--model", a.model, "--device", "cpu", "--prompt", PROMPT, "--seed", SEED,
             "--width", W, "--height", H, "--steps", STEPS, "--cfg", 5, "--upscale-model", work / "models/up/realesrgan_x2",
             "--upscale", 2, "--out", gen], timeout=300)
    same = r.returncode == 0 and np.array_equal(pixels(gen), pixels(files_of(out)["x2"]))
    print(f"generate --upscale-model realesrgan_x2 --upscale 2: {'same pixels as the run' if same else 'DIFFERENT'}")
    if not same:
        errors.append(f"generate --upscale: exit {r.returncode}, same pixels {same}: {r.stderr[-800:]}")
    if r.returncode == 0 and not parameters(gen).endswith("Postprocess upscale by: 2, Postprocess upscaler: realesrgan_x2"):
        errors.append(f"generate parameters: {parameters(gen)[-200:]!r}")

    errors += check_bad(a, work)
    errors += check_story_config(a, work)
    (work / "parity_frame.json").write_text(json.dumps({"rows": rows, "errors": errors}, indent=1))
    print(f"total {time.time() - t0:.1f} s")
    for e in errors:
        print("FAIL:", e)
    print("PASS" if not errors else "FAIL")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
