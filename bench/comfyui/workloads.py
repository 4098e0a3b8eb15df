#!/usr/bin/env python3
"""The two workloads of issue 58, written once for both tools from one task list:
sdxl-batch batch files and, per panel, the ComfyUI API-format prompt (the JSON its /prompt
queue takes, as "Save (API)" exports it) with the nodes a user's workflow has.

  workloads.py --out DIR --models DIR [--size 1024] [--steps 28] [--panels 16] [--mixed 8]
               [--finish 12] [--comfy-batch 8]

DIR gets, for each workload W in w1, mixed, finish: W.json (the batch file) and W.comfy.json
(a list of prompts in queue order), plus w1-batch.comfy.json (W1 with ComfyUI's batch size set
to --comfy-batch: one prompt per that many panels) and control/*.png (the ControlNet images).

--models DIR holds what both tools load, by these names:
  sdxl-batch: controlnets/pose (export folder), up/rrdbnet_x4 (export folder), and the LoRAs
              full_a.safetensors and full_b.safetensors in --loras (default DIR/lora)
  ComfyUI:    the same LoRA files, controlnet.safetensors (diffusers layout), rrdbnet_x4.pth
The ComfyUI side names them relative to its model folders (run by comfy_queue.py).

W1: --panels panels of size², --steps steps, CFG 7, Euler, one prompt per panel (four prompts in
turn, fixed seeds). mixed: gpu_runtime.sh's mixed batch (bench/lib/runtime.sh mkbatch): --mixed
panels of size² and --mixed of the portrait size (832x1216 scaled like size), priorities
high/mid/low, three LoRA sets (none, a at 0.8, b at 0.8); ComfyUI gets them in file order (it has
no priorities). finish: --finish panels of the mixed batch (half each size) with the hires fix on
a third, all of them square (1.5x of 832x1216 is over the model's 1536 limit) (Latent bilinear, 1.5x, half the steps at denoise 0.5: the same UNet calls in both
tools, see below), an upscaler-model frame on all (the 4x model's pass, then LANCZOS, cover and
centre crop to 1080x1920, scaled like size), and a ControlNet on every second (strength 0.8).

Hires steps: sdxl-batch runs int(hires steps x denoise) steps of the second pass (diffusers'
img2img); ComfyUI's KSampler at denoise d runs exactly its steps on a stretched schedule (as
A1111). Both run max(1, steps // 2) second-pass steps here (sdxl-batch's hires steps twice that).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

NEGATIVE = "blurry, lowres"
W1_PROMPTS = ["comic panel, a lighthouse keeper with a red scarf arrives on a stormy island at dusk, bold ink lines",
              "comic panel, close-up of the keeper lighting the great brass lamp, warm glow on her face",
              "comic panel, a fishing boat caught in huge waves, lightning, dramatic angle",
              "comic panel, morning calm, the keeper drinks tea on the rocks, seagulls"]
PRIOS = ["high", "mid", "low"]
LORA_SETS = [None, ("a", 0.8), ("b", 0.8)]


def hires_steps(steps: int) -> int:
    """The second pass's steps in both tools: half the first pass's, at least one."""
    return max(1, steps // 2)


def scaled(v: int, size: int) -> int:
    """A 1024-based length scaled to --size, a multiple of 8."""
    return max(64, (v * size // 1024) // 8 * 8)


def mixed_tasks(n_sq: int, n_pt: int, size: int) -> list[dict]:
    """bench/lib/runtime.sh's mkbatch with LoRAs: the same ids, prompts, seeds, priorities, sets."""
    tasks = []
    for i in range(n_sq):
        tasks.append({"id": f"sq{i:02d}", "prompt": f"comic panel {i}, a lighthouse keeper in a storm, bold ink lines",
                      "seed": 1000 + i, "priority": PRIOS[i % 3], "lora": LORA_SETS[i % 3],
                      "width": size, "height": size})
    for i in range(n_pt):
        tasks.append({"id": f"pt{i:02d}", "prompt": f"comic panel {i}, a girl with a red umbrella in the rain, portrait",
                      "seed": 2000 + i, "priority": PRIOS[(i + 1) % 3], "lora": LORA_SETS[(i + 2) % 3],
                      "width": scaled(832, size), "height": scaled(1216, size)})
    return tasks


def batch_file(tasks: list[dict], steps: int, models: Path, loras: Path | None) -> dict:
    out = []
    for t in tasks:
        o = {"id": t["id"], "prompt": t["prompt"] + (f" <lora:{t['lora'][0]}:{t['lora'][1]}>" if t.get("lora") else ""),
             "seed": t["seed"], "width": t["width"], "height": t["height"]}
        if "priority" in t:
            o["priority"] = t["priority"]
        if t.get("hires"):
            o["hires"] = {"scale": 1.5, "upscaler": "Latent", "steps": 2 * hires_steps(steps), "denoise": 0.5}
        if t.get("frame"):
            o["upscale"] = {"model": str(models / "up" / "rrdbnet_x4"), "size": "{}x{}".format(*t["frame"]), "fit": "crop"}
        if t.get("control"):
            o["controlnets"] = [{"model": str(models / "controlnets" / "pose"), "image": t["control"], "strength": 0.8}]
        out.append(o)
    b = {"version": 1, "defaults": {"negative": NEGATIVE, "steps": steps, "cfg": 7.0, "sampler": "Euler"}, "tasks": out}
    if loras:
        b["loras"] = {"a": {"path": str(loras / "full_a.safetensors"), "pin": True},
                      "b": {"path": str(loras / "full_b.safetensors")}}
    return b


def comfy_prompt(t: dict, steps: int, batch: int = 1) -> dict:
    """One panel as ComfyUI's API format: the default text-to-image graph, plus LoraLoader,
    ControlNetLoader + LoadImage + ControlNetApplyAdvanced, LatentUpscaleBy + a second KSampler,
    UpscaleModelLoader + ImageUpscaleWithModel + ImageScale where the task has them."""
    g = {"ckpt": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sdxl-random.safetensors"}}}
    model, clip = ["ckpt", 0], ["ckpt", 1]
    if t.get("lora"):
        g["lora"] = {"class_type": "LoraLoader", "inputs": {"lora_name": f"full_{t['lora'][0]}.safetensors",
                     "strength_model": t["lora"][1], "strength_clip": t["lora"][1], "model": model, "clip": clip}}
        model, clip = ["lora", 0], ["lora", 1]
    g["pos"] = {"class_type": "CLIPTextEncode", "inputs": {"text": t["prompt"], "clip": clip}}
    g["neg"] = {"class_type": "CLIPTextEncode", "inputs": {"text": NEGATIVE, "clip": clip}}
    pos, neg = ["pos", 0], ["neg", 0]
    if t.get("control"):
        g["cn"] = {"class_type": "ControlNetLoader", "inputs": {"control_net_name": "controlnet.safetensors"}}
        g["hint"] = {"class_type": "LoadImage", "inputs": {"image": Path(t["control"]).name}}
        g["apply"] = {"class_type": "ControlNetApplyAdvanced", "inputs": {
            "positive": pos, "negative": neg, "control_net": ["cn", 0], "image": ["hint", 0], "strength": 0.8,
            "start_percent": 0.0, "end_percent": 1.0, "vae": ["ckpt", 2]}}
        pos, neg = ["apply", 0], ["apply", 1]
    g["latent"] = {"class_type": "EmptyLatentImage", "inputs": {"width": t["width"], "height": t["height"],
                                                                "batch_size": batch}}
    sampler = {"seed": t["seed"], "steps": steps, "cfg": 7.0, "sampler_name": "euler", "scheduler": "normal",
               "denoise": 1.0, "model": model, "positive": pos, "negative": neg, "latent_image": ["latent", 0]}
    g["sample"] = {"class_type": "KSampler", "inputs": sampler}
    latent = ["sample", 0]
    if t.get("hires"):
        g["hires_up"] = {"class_type": "LatentUpscaleBy", "inputs": {"upscale_method": "bilinear", "scale_by": 1.5,
                                                                     "samples": latent}}
        g["hires"] = {"class_type": "KSampler", "inputs": dict(sampler, steps=hires_steps(steps), denoise=0.5,
                                                               latent_image=["hires_up", 0])}
        latent = ["hires", 0]
    g["decode"] = {"class_type": "VAEDecode", "inputs": {"samples": latent, "vae": ["ckpt", 2]}}
    image = ["decode", 0]
    if t.get("frame"):
        g["up_model"] = {"class_type": "UpscaleModelLoader", "inputs": {"model_name": "rrdbnet_x4.pth"}}
        g["up"] = {"class_type": "ImageUpscaleWithModel", "inputs": {"upscale_model": ["up_model", 0], "image": image}}
        g["frame"] = {"class_type": "ImageScale", "inputs": {"image": ["up", 0], "upscale_method": "lanczos",
                                                             "width": t["frame"][0], "height": t["frame"][1],
                                                             "crop": "center"}}
        image = ["frame", 0]
    g["save"] = {"class_type": "SaveImage", "inputs": {"filename_prefix": t["id"], "images": image}}
    return g


def control_images(folder: Path, tasks: list[dict]) -> None:
    """Stick figures (white-ish lines on black, as pose maps are drawn), one per ControlNet task at its size."""
    import numpy as np
    from PIL import Image, ImageDraw
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(4)
    for t in tasks:
        if not t.get("control"):
            continue
        w, h = t["width"], t["height"]
        im = Image.new("RGB", (w, h))
        d = ImageDraw.Draw(im)
        pts = np.stack([rng.integers(w // 10, w - w // 10, 12), rng.integers(h // 10, h - h // 10, 12)], axis=1)
        for a, b in zip(pts[:-1], pts[1:]):
            d.line([tuple(int(x) for x in a), tuple(int(x) for x in b)],
                   fill=tuple(int(c) for c in rng.integers(80, 256, 3)), width=max(2, w // 85))
        im.save(t["control"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--models", required=True, type=Path)
    ap.add_argument("--loras", type=Path, help="sdxl-batch's LoRA folder (default: --models/lora)")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=28)
    ap.add_argument("--panels", type=int, default=16, help="W1's panels")
    ap.add_argument("--mixed", type=int, default=8, help="the mixed batch's panels of each size")
    ap.add_argument("--finish", type=int, default=12, help="the finished comic night's panels (half each size)")
    ap.add_argument("--comfy-batch", type=int, default=8, help="ComfyUI's batch size in W1's second run")
    a = ap.parse_args()
    if min(a.panels, a.mixed, a.finish, a.comfy_batch, a.steps) < 1 or a.panels % a.comfy_batch:
        ap.error("--panels, --mixed, --finish, --comfy-batch and --steps must be positive, "
                 "and --panels a multiple of --comfy-batch")
    a.out.mkdir(parents=True, exist_ok=True)
    s = a.size
    w1 = [{"id": f"w1-{i:02d}", "prompt": W1_PROMPTS[i % 4], "seed": 5000 + i, "width": s, "height": s}
          for i in range(a.panels)]
    mixed = mixed_tasks(a.mixed, a.mixed, s)
    finish = mixed_tasks((a.finish + 1) // 2, a.finish // 2, s)
    n_sq = (a.finish + 1) // 2
    for i, t in enumerate(finish):
        t["id"] = "fin-" + t["id"]
        # A third of the panels, all square: 1.5x of 832x1216 is over the model's 1536 limit.
        t["hires"] = i < n_sq and (i % 3 != 2 or n_sq == 1)
        t["frame"] = (scaled(1080, s), scaled(1920, s))
        if i % 2 == 0:
            t["control"] = str(a.out / "control" / f"pose-{t['id']}.png")
    control_images(a.out / "control", finish)
    loras = a.loras or a.models / "lora"
    for name, tasks, lo in (("w1", w1, None), ("mixed", mixed, loras), ("finish", finish, loras)):
        (a.out / f"{name}.json").write_text(json.dumps(batch_file(tasks, a.steps, a.models, lo), indent=1))
        (a.out / f"{name}.comfy.json").write_text(json.dumps([comfy_prompt(t, a.steps) for t in tasks]))
    batched = [comfy_prompt(dict(t, id=f"w1b-{i:02d}"), a.steps, a.comfy_batch) for i, t in enumerate(w1[::a.comfy_batch])]
    (a.out / "w1-batch.comfy.json").write_text(json.dumps(batched))
    print(f"workloads in {a.out}: w1 {len(w1)} panels ({len(batched)} prompts at batch {a.comfy_batch}), "
          f"mixed {len(mixed)}, finish {len(finish)} ({sum(bool(t['hires']) for t in finish)} hires, "
          f"{sum(bool(t.get('control')) for t in finish)} ControlNet, all framed) at {s}², {a.steps} steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
