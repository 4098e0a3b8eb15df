#!/usr/bin/env python3
"""How far the FP8 UNet (export_sdxl.py --fp8, sdxl-batch --precision fp8) is from the model-dtype
UNet, in diffusers, on the exported weights and scales themselves:

  (i)  per step: along the fp16 pipeline's trajectory, each step's UNet inputs also go through the
       FP8 UNet; the CFG-combined noise predictions e8 and e16 are compared: relative L2
       ||e8 - e16|| / ||e16|| and cosine (also the relative L2 of the raw 2-row UNet output, before
       the combine: CFG amplifies the error of cond - uncond, so the combined one is the larger);
       a table of the steps (mean / max over the prompts) and the overall mean / max;
  (ii) final images: the fp16 pipeline vs the FP8 pipeline, each on its own trajectory from the same
       seed, decoded by the pipeline's VAE (upcast as diffusers does): PSNR (dB, uint8 RGB) and SSIM
       (luminance BT.601, 11x11 Gaussian window sigma 1.5, K1 0.01, K2 0.03, data range 255, valid
       region), per image.

The FP8 UNet is the diffusers UNet with scripts/export/fp8_conv.load_quantized_state given the tensors of
--model's unet_fp8.ts (so the exact e4m3 weights and calibrated scales the export wrote; on CUDA its
layers are torch._scaled_mm, as in the traced unet_fp8.ts); every other tensor of unet_fp8.ts is
checked against the diffusers UNet's. Euler (diffusers' EulerDiscreteScheduler), fixed seeds (a
CPU generator per image: seed, seed + 1, ...), the prompts below (not the calibration prompts).

    PYTHONPATH=tests bench/fp8_fidelity.py --model EXPORT --diffusers DIFF [--json out.json] [--prompts 4] [--png-dir DIR]
        EXPORT from: scripts/export_sdxl.py --random-full --fp8 --device cuda --save-diffusers DIFF --out EXPORT
    PYTHONPATH=tests bench/fp8_fidelity.py --model /tmp/tiny8 --diffusers /tmp/tiny8-diff --device cpu --prompts 2
        (the CPU smoke test: fp32, 256x256, 8 steps, CFG 5 unless given)

Writes --json (config, per-prompt steps and image metrics, summary) and prints markdown tables.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from export import fp8_conv, fp8_quant  # noqa: E402  (scripts/export/, the export's package)
from reference.compare_images import psnr  # noqa: E402  (tests/ on PYTHONPATH: bench/lib/gpu_prepare.sh)

# Comic prompts of their own (configs/fp8-calibration-prompts.txt calibrated the scales: not those).
PROMPTS = [
    "comic panel, an old fisherman hauling a glowing net onto a boat at dusk, heavy ink hatching",
    "comic panel, a girl with a red umbrella jumping over puddles in a city street, rain, motion lines",
    "comic panel, a giant mech towering over a burning harbour, low angle, explosions, halftone dots",
    "comic panel, two chefs arguing in a steamy restaurant kitchen, exaggerated expressions, speech bubbles",
    "comic panel, a lone astronaut planting a flag on an icy moon, earthrise, cold blue palette",
    "comic panel, a masked thief leaping between rooftops under a full moon, silhouette, dramatic contrast",
    "comic panel, a village festival with paper lanterns and dancers, warm light, crowded background",
    "comic panel, a tiny dragon sleeping on a pile of books in a library, soft watercolour tones",
]
NEGATIVE = "blurry, lowres, watermark"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


# --- image metrics --------------------------------------------------------------------------------------
def _gaussian_window(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2.0
    g = torch.exp(-(x ** 2) / (2 * sigma ** 2))
    g = g / g.sum()
    return (g[:, None] * g[None, :])[None, None]


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """SSIM (Wang et al. 2004) of two uint8 RGB images on their luminance (BT.601), Gaussian 11x11
    sigma 1.5, K1 0.01, K2 0.03, L 255, mean over the valid region (no padding)."""
    def luma(im):
        t = torch.from_numpy(im.astype(np.float64))
        return (0.299 * t[..., 0] + 0.587 * t[..., 1] + 0.114 * t[..., 2])[None, None]

    x, y, w = luma(a), luma(b), _gaussian_window()
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    mx, my = F.conv2d(x, w), F.conv2d(y, w)
    sxx = F.conv2d(x * x, w) - mx * mx
    syy = F.conv2d(y * y, w) - my * my
    sxy = F.conv2d(x * y, w) - mx * my
    s = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
    return float(s.mean())


# --- the two UNets ---------------------------------------------------------------------------------------
def fp8_tensors(model: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """unet_fp8.ts's named parameters and buffers (CPU) and model.json's unet.fp8."""
    meta = json.loads((model / "model.json").read_text())
    fp8 = meta.get("unet", {}).get("fp8")
    if not fp8:
        raise SystemExit(f"{model}: model.json has no unet.fp8; export it with scripts/export_sdxl.py --fp8")
    m = torch.jit.load(str(model / fp8["file"]), map_location="cpu")
    t = {n: v.detach() for n, v in m.named_parameters()}
    t.update({n: v.detach() for n, v in m.named_buffers()})
    return t, fp8


@torch.no_grad()
def build_fp8_unet(unet16, tensors: dict[str, torch.Tensor]) -> tuple[torch.nn.Module, int, float, list[str]]:
    """A copy of the diffusers UNet turned into the export's FP8 UNet. Returns (unet8, layers, max |diff|
    of the other tensors vs unet_fp8.ts's, names missing on one side)."""
    unet8 = copy.deepcopy(unet16)
    n = fp8_conv.load_quantized_state(unet8, tensors)
    own = dict(unet8.named_parameters())
    own.update(dict(unet8.named_buffers()))
    worst, missing = 0.0, sorted(set(own) ^ set(tensors))
    for k, v in tensors.items():
        if k in own and not k.endswith(("weight_scale", "input_scale")) and v.dtype != fp8_quant.FP8:
            worst = max(worst, float((own[k].float() - v.to(own[k].device).float()).abs().max()))
    return unet8.eval(), n, worst, missing


class StepProbe:
    """A forward hook on the fp16 UNet: each call's inputs also go through the FP8 UNet; records the
    CFG-combined predictions' relative L2 and cosine, and the raw output's relative L2."""

    def __init__(self, unet8, cfg: float):
        self.unet8, self.cfg, self.rows = unet8, cfg, []

    def __call__(self, module, args, kwargs, output):
        out16 = output[0] if isinstance(output, tuple) else output.sample
        out8 = self.unet8(*args, **kwargs)
        out8 = out8[0] if isinstance(out8, tuple) else out8.sample
        a, b = out16.float(), out8.float()
        if a.shape[0] % 2 == 0 and self.cfg > 1.0:  # [uncond; cond] rows, as the pipeline batches them
            u16, c16 = a.chunk(2)
            u8, c8 = b.chunk(2)
            e16, e8 = u16 + self.cfg * (c16 - u16), u8 + self.cfg * (c8 - u8)
        else:
            e16, e8 = a, b
        t = args[1] if len(args) > 1 else kwargs.get("timestep")
        self.rows.append(torch.stack([
            (e8 - e16).norm() / e16.norm().clamp_min(1e-12),
            F.cosine_similarity(e8.flatten(), e16.flatten(), dim=0),
            (b - a).norm() / a.norm().clamp_min(1e-12),
            torch.as_tensor(t, dtype=torch.float32, device=a.device).flatten()[0]]))

    def take(self) -> list[dict]:
        vals = torch.stack(self.rows).cpu().tolist() if self.rows else []
        self.rows = []
        return [{"step": i, "timestep": v[3], "rel_l2": v[0], "cosine": v[1], "raw_rel_l2": v[2]}
                for i, v in enumerate(vals)]


# --- the run ------------------------------------------------------------------------------------------------
def run_pipe(pipe, prompt: str, seed: int, a) -> tuple[np.ndarray, float]:
    if a.device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = pipe(prompt=prompt, negative_prompt=NEGATIVE, num_inference_steps=a.steps, guidance_scale=a.cfg,
               width=a.size, height=a.size, generator=torch.Generator("cpu").manual_seed(seed), output_type="np")
    if a.device.startswith("cuda"):
        torch.cuda.synchronize()
    img = (np.clip(out.images[0], 0.0, 1.0) * 255.0).round().astype(np.uint8)  # as numpy_to_pil rounds
    return img, time.perf_counter() - t0


def summarize(per_prompt: list[dict]) -> tuple[list[dict], dict]:
    steps = len(per_prompt[0]["steps"])
    table = []
    for i in range(steps):
        rl = [p["steps"][i]["rel_l2"] for p in per_prompt]
        cs = [p["steps"][i]["cosine"] for p in per_prompt]
        raw = [p["steps"][i]["raw_rel_l2"] for p in per_prompt]
        table.append({"step": i, "timestep": per_prompt[0]["steps"][i]["timestep"], "rel_l2_mean": float(np.mean(rl)),
                      "rel_l2_max": float(np.max(rl)), "cosine_mean": float(np.mean(cs)),
                      "cosine_min": float(np.min(cs)),
                      "raw_rel_l2_mean": float(np.mean(raw))})
    all_rl = [s["rel_l2"] for p in per_prompt for s in p["steps"]]
    all_cs = [s["cosine"] for p in per_prompt for s in p["steps"]]
    all_raw = [s["raw_rel_l2"] for p in per_prompt for s in p["steps"]]
    ps = [p["image"]["psnr_db"] for p in per_prompt]
    ss = [p["image"]["ssim"] for p in per_prompt]
    summary = {"step_rel_l2_mean": float(np.mean(all_rl)), "step_rel_l2_max": float(np.max(all_rl)),
               "step_cosine_mean": float(np.mean(all_cs)), "step_cosine_min": float(np.min(all_cs)),
               "step_raw_rel_l2_mean": float(np.mean(all_raw)), "step_raw_rel_l2_max": float(np.max(all_raw)),
               "image_psnr_db_mean": float(np.mean(ps)), "image_psnr_db_min": float(np.min(ps)),
               "image_ssim_mean": float(np.mean(ss)), "image_ssim_min": float(np.min(ss))}
    return table, summary


def markdown(a, table: list[dict], per_prompt: list[dict], summary: dict, info: dict) -> str:
    lines = [f"## FP8 UNet fidelity: {info['model_name']}, {a.size}x{a.size}, {a.steps} steps Euler, CFG {a.cfg:g}, "
             f"{len(per_prompt)} prompts, {a.device} {a.dtype}",
             "",
             f"{info['fp8_layers']} FP8 layers ({info['fp8_format']}); other tensors vs unet_fp8.ts max |diff| "
             f"{info['other_tensors_max_abs_diff']:.3g}",
             "",
             f"### (i) per step, along the {a.dtype} trajectory: CFG-combined noise prediction, FP8 vs {a.dtype}",
             "",
             "| step | timestep | rel. L2 mean | rel. L2 max | cosine mean | cosine min | raw rel. L2 mean |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in table:
        lines.append(f"| {r['step']} | {r['timestep']:.0f} | {r['rel_l2_mean']:.4f} | {r['rel_l2_max']:.4f} | "
                     f"{r['cosine_mean']:.5f} | {r['cosine_min']:.5f} | {r['raw_rel_l2_mean']:.4f} |")
    lines += ["", f"over all steps and prompts: rel. L2 mean {summary['step_rel_l2_mean']:.4f}, max "
              f"{summary['step_rel_l2_max']:.4f}; cosine mean {summary['step_cosine_mean']:.5f}, min "
              f"{summary['step_cosine_min']:.5f}; raw UNet output (both CFG rows, before the combine) rel. L2 mean "
              f"{summary['step_raw_rel_l2_mean']:.4f}, max {summary['step_raw_rel_l2_max']:.4f}",
              "", f"### (ii) final images: {a.dtype} pipeline vs FP8 pipeline (own trajectories, same seed)", "",
              f"| # | seed | PSNR dB | SSIM | s {a.dtype} (+probe) | s fp8 | prompt |",
              "|---:|---:|---:|---:|---:|---:|---|"]
    for i, p in enumerate(per_prompt):
        lines.append(f"| {i} | {p['seed']} | {p['image']['psnr_db']:.2f} | {p['image']['ssim']:.4f} | "
                     f"{p['seconds_model_dtype_with_probe']:.2f} | {p['seconds_fp8']:.2f} | {p['prompt'][:60]} |")
    lines += ["", f"(seconds: one eager call each, the first with the FP8 UNet run beside the {a.dtype} one each step: "
              "not a speed measurement)", "",
              f"images: PSNR mean {summary['image_psnr_db_mean']:.2f} dB (min {summary['image_psnr_db_min']:.2f}), "
              f"SSIM mean {summary['image_ssim_mean']:.4f} (min {summary['image_ssim_min']:.4f})"]
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the export with unet_fp8.ts (export_sdxl.py --fp8)")
    ap.add_argument("--diffusers", required=True, help="the same weights as a diffusers folder (--save-diffusers)")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (a smoke test)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), help="pipeline dtype (default fp16 on CUDA, fp32 on the CPU)")
    ap.add_argument("--size", type=int, help="width = height (default 1024; 256 on the CPU)")
    ap.add_argument("--steps", type=int, help="Euler steps (default 28; 8 on the CPU)")
    ap.add_argument("--cfg", type=float, help="CFG scale (default 7; 5 on the CPU)")
    ap.add_argument("--prompts", type=int, default=4, help=f"how many of the built-in prompts (1 .. {len(PROMPTS)})")
    ap.add_argument("--seed", type=int, default=1000, help="prompt i runs with seed + i")
    ap.add_argument("--threads", type=int, help="torch threads (default 1 on the CPU)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--png-dir", help="save each prompt's fp16 and FP8 image here")
    a = ap.parse_args()
    cpu = a.device == "cpu"
    a.dtype = a.dtype or ("fp32" if cpu else "fp16")
    a.size = a.size or (256 if cpu else 1024)
    a.steps = a.steps or (8 if cpu else 28)
    a.cfg = a.cfg if a.cfg is not None else (5.0 if cpu else 7.0)
    if not 1 <= a.prompts <= len(PROMPTS):
        ap.error(f"--prompts must be 1 .. {len(PROMPTS)}")
    if a.size % 8 or a.steps < 1:
        ap.error("--size must be a multiple of 8 and --steps >= 1")
    if cpu:
        torch.set_num_threads(a.threads or 1)
    elif a.threads:
        torch.set_num_threads(a.threads)
    if not cpu and not torch.cuda.is_available():
        ap.error(f"--device {a.device}: no CUDA device visible to torch")
    return a


def load(a):
    """The fp16 pipeline from --diffusers, its UNet, the FP8 UNet from --model's unet_fp8.ts, and the run's info."""
    cpu = a.device == "cpu"
    dtype = DTYPES[a.dtype]
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline
    import diffusers.utils.logging
    import transformers.utils.logging

    diffusers.utils.logging.disable_progress_bar()
    diffusers.utils.logging.set_verbosity_error()  # the VAE upcast's notes, once per image
    warnings.filterwarnings("ignore", category=FutureWarning)
    transformers.utils.logging.disable_progress_bar()
    model = Path(a.model)
    t0 = time.perf_counter()
    pipe = StableDiffusionXLPipeline.from_pretrained(a.diffusers, dtype=dtype, local_files_only=True,
                                                     add_watermarker=False).to(a.device)
    pipe.scheduler = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    tensors, fp8_meta = fp8_tensors(model)
    unet16 = pipe.unet
    unet8, n_layers, other_diff, missing = build_fp8_unet(unet16, tensors)
    del tensors
    t_load = time.perf_counter() - t0
    if missing:
        print(f"warning: tensors in only one of unet_fp8.ts / the diffusers UNet: {missing[:4]}", file=sys.stderr)
    meta = json.loads((model / "model.json").read_text())
    info = {"model_name": meta.get("name", model.name), "model_dtype": meta.get("dtype"), "fp8_layers": n_layers,
            "fp8_format": fp8_meta.get("format", ""), "fp8_calibration": fp8_meta.get("calibration"),
            "other_tensors_max_abs_diff": other_diff, "tensors_in_one_only": missing[:20],
            "gpu": torch.cuda.get_device_name(torch.device(a.device)) if not cpu else "cpu",
            "torch": torch.__version__, "load_s": round(t_load, 1)}
    print(f"loaded in {t_load:.1f}s: {n_layers} FP8 layers; other tensors vs unet_fp8.ts max |diff| {other_diff:.3g}",
          file=sys.stderr, flush=True)
    return pipe, unet16, unet8, info


def measure(a, pipe, unet16, unet8) -> list[dict]:
    """Each prompt: the per-step probe along the fp16 trajectory, then both images."""
    probe = StepProbe(unet8, a.cfg)
    per_prompt = []
    png_dir = Path(a.png_dir) if a.png_dir else None
    if png_dir:
        png_dir.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode():
        for i, prompt in enumerate(PROMPTS[: a.prompts]):
            seed = a.seed + i
            pipe.unet = unet16
            handle = unet16.register_forward_hook(probe, with_kwargs=True)
            try:
                img16, s16 = run_pipe(pipe, prompt, seed, a)
            finally:
                handle.remove()
            steps = probe.take()
            pipe.unet = unet8
            img8, s8 = run_pipe(pipe, prompt, seed, a)
            pipe.unet = unet16
            rec = {"prompt": prompt, "seed": seed, "steps": steps,
                   "image": {"psnr_db": psnr(img16, img8), "ssim": ssim(img16, img8)},
                   "seconds_model_dtype_with_probe": round(s16, 3), "seconds_fp8": round(s8, 3)}
            per_prompt.append(rec)
            if png_dir:
                from PIL import Image

                Image.fromarray(img16).save(png_dir / f"{i}-fp16.png")
                Image.fromarray(img8).save(png_dir / f"{i}-fp8.png")
            print(f"prompt {i}: steps rel. L2 mean {np.mean([s['rel_l2'] for s in steps]):.4f}, image PSNR "
                  f"{rec['image']['psnr_db']:.2f} dB, SSIM {rec['image']['ssim']:.4f} ({s16:.1f}s + {s8:.1f}s)",
                  file=sys.stderr, flush=True)
    return per_prompt


def main() -> int:
    t_start = time.perf_counter()
    a = parse_args()
    cpu = a.device == "cpu"
    pipe, unet16, unet8, info = load(a)
    model = Path(a.model)
    per_prompt = measure(a, pipe, unet16, unet8)
    table, summary = summarize(per_prompt)
    info["total_s"] = round(time.perf_counter() - t_start, 1)
    if not cpu:
        info["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)
    result = {"config": {"model": str(model), "diffusers": a.diffusers, "device": a.device, "dtype": a.dtype,
                         "size": a.size, "steps": a.steps, "cfg": a.cfg, "sampler": "Euler", "negative": NEGATIVE,
                         "seeds": [a.seed + i for i in range(a.prompts)]},
              "info": info, "summary": summary, "per_step": table, "per_prompt": per_prompt}
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(result, indent=1))
    print(markdown(a, table, per_prompt, summary, info))
    print(f"\ntotal {info['total_s']}s (load {info['load_s']}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
