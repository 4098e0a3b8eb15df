#!/usr/bin/env python3
"""Parity (ctest label parity): ControlNet vs diffusers on the tiny model, CPU.

reference.controlnet_fixture makes two tiny random SDXL ControlNets (seeds differ) from the
tiny model's UNet, each as a diffusers folder, a diffusers-keys .safetensors file and an
original-layout .safetensors file (bare and under "control_model."). Then:
  - export_sdxl.py --controlnet (fp32, cpu) of each layout (of the first ControlNet; the second is
    exported from its folder only) gives the same controlnet.ts, bit for bit: the same parameters and
    the same outputs on the same inputs; its residual layout (of both) is the model's unet.control;
  - `sdxl-batch generate --controlnet DIR --control-image PNG ...` vs
    StableDiffusionXLControlNetPipeline / StableDiffusionXLControlNetImg2ImgPipeline built from the
    tiny model's components (Euler, A1111 prompt embeddings, the same seed, CFG, steps, size):
    PSNR >= --min-psnr (40 dB) for one ControlNet (strength 0.8), two ControlNets with
    windows (strengths 0.7 / 0.5, start/end 0.0-0.6 and 0.3-1.0), img2img (strength 0.6) with
    one ControlNet, a control image of another size than the task (200x320 for 256x256:
    diffusers stretches it with PIL LANCZOS), and one ControlNet with a LoRA (kohya_unet at 0.8,
    fused into the reference's UNet and text encoders by reference.lora_reference);
  - the ControlNet acts: with vs without it, PSNR < 30 dB (ours and the reference);
  - a Union ControlNet (the fixture's union/, ProMax's 8 types): its folder and its diffusers-keys file
    export the same controlnet.ts (the folder's export checks the trace against diffusers' own
    forward with 1, 2 and 3 images); `generate --control-type` vs StableDiffusionXLControlNetUnionPipeline
    at PSNR >= UNION_MIN_PSNR (65 dB) with one type (canny, 0.8) and with two types in one call
    (canny 0.7 over 0.0-0.6 and depth 0.5 over 0.3-1.0: diffusers' control_mode list, scaled inside);
    a type on a plain ControlNet, a Union ControlNet without a type and a type it lacks are refused by
    generate (exit 2) and by validate at their JSON pointers, with the batch file's "images" rules;
  - the fixture's bad files (SD 1.x ControlNets, a T2I-Adapter, a Control-LoRA, a ControlLLLite, a
    LoRA, a whole checkpoint, a Union ControlNet, truncated, pickle, a missing tensor): exit code 1, a
    message naming what is wrong, no output folder and no temporary folder left.

    PYTHONPATH=tests parity_controlnet.py --binary B --model TINY --diffusers TINY_DIFFUSERS --work DIR [--loras DIR]
        [--side-modules DIR]   (ctest's fixture side_modules: cn-a and its folder's export, made once)
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from parity_common import finish, image_row, parse_args, reference_pipeline, run_ours
from testkit import run_ok as run
from PIL import Image, ImageDraw

from reference.a1111_schedulers import make_scheduler
from reference.compare_images import load_rgb, psnr
from reference.reference_sdxl import a1111_embeds

EXPORT = Path(__file__).resolve().parents[2] / "scripts" / "export_sdxl.py"
PROMPT, NEGATIVE, SEED, CFG, STEPS, W, H = "comic panel, a lighthouse on a cliff", "blurry", 13, 5.0, 8, 256, 256
I2I_STRENGTH = 0.6
ACTS_MAX_PSNR = 30.0
UNION_MIN_PSNR = 65.0  # issue 61's bar for the Union ControlNet's images
UNION_TYPES = {"canny": 3, "depth": 1}
LAYOUTS = (("folder", "diffusers", False), ("keys", "diffusers-keys.safetensors", True),
           ("original", "original.safetensors", True), ("original-prefixed", "original-prefixed.safetensors", True))


def control_images(work: Path) -> dict[str, Path]:
    """Deterministic control images: random white strokes on black (a line drawing), circles on a
    gradient, and a line drawing of another size than the task (200 wide, 320 high)."""
    rng = np.random.RandomState(5)
    out = {}
    for name, (w, h) in (("lines", (W, H)), ("lines-200x320", (200, 320))):
        im = Image.new("RGB", (w, h), "black")
        d = ImageDraw.Draw(im)
        for _ in range(14):
            pts = [tuple(int(v) for v in (rng.randint(0, w), rng.randint(0, h))) for _ in range(3)]
            d.line(pts, fill="white", width=int(rng.randint(2, 6)))
        out[name] = work / f"control-{name}.png"
        im.save(out[name])
    x = np.linspace(0, 255, W, dtype=np.float32)[None, :, None]
    y = np.linspace(255, 0, H, dtype=np.float32)[:, None, None]
    im = Image.fromarray(np.concatenate([np.broadcast_to(x, (H, W, 1)), np.broadcast_to(y, (H, W, 1)),
                                         np.full((H, W, 1), 96, np.float32)], axis=2).astype(np.uint8))
    d = ImageDraw.Draw(im)
    for _ in range(6):
        cx, cy, r = (int(v) for v in (rng.randint(0, W), rng.randint(0, H), rng.randint(15, 60)))
        d.ellipse((cx - r, cy - r, cx + r, cy + r), outline="white", width=4)
    out["circles"] = work / "control-circles.png"
    im.save(out["circles"])
    return out


def make_controlnets(work: Path, diffusers: str,
                     shared: Path | None) -> tuple[dict[str, Path], dict[str, dict[str, Path]]]:
    """Two fixture ControlNets, cn-a exported from every layout, cn-b from its folder:
    ({name: fixture dir}, {name: {layout: export dir}}). shared: the ctest fixture side_modules' folder,
    whose controlnet/ is cn-a (seed 21, every layout) and controlnet-export/ its folder's export."""
    fixtures, exports = {}, {}
    for name, seed in (("cn-a", 21), ("cn-b", 22)):
        from_fixture = shared is not None and name == "cn-a"
        fx = shared / "controlnet" if from_fixture else work / name
        fixtures[name], exports[name] = fx, {}
        if not from_fixture:
            run([sys.executable, "-m", "reference.controlnet_fixture", "--diffusers", diffusers, "--out", str(fx),
                 "--seed", str(seed), "--name", name], f"reference.controlnet_fixture {name}")
        for layout, src, single in LAYOUTS:
            if layout != "folder" and name != "cn-a":
                continue  # cn-a proves every layout; cn-b (the second net of "two-windows") needs its folder only
            if from_fixture and layout == "folder":  # exported with --check quick, as below
                exports[name][layout] = shared / "controlnet-export"
                continue
            out = work / f"export-{name}-{layout}"
            # The folder's export checks the trace against eager; the others must equal it bit for bit.
            run([sys.executable, str(EXPORT), "--controlnet", str(fx / src), *(["--config", str(fx / "diffusers")]
                 if single else []), "--out", str(out), "--force", "--dtype", "fp32", "--device", "cpu",
                 "--check", "quick" if layout == "folder" else "none"], f"export --controlnet {name} {layout}")
            exports[name][layout] = out
    for layout, src, single in (("folder", "union", False), ("keys", "union.safetensors", True)):
        out = work / f"export-union-{layout}"
        run([sys.executable, str(EXPORT), "--controlnet", str(fixtures["cn-a"] / src),
             *(["--config", str(fixtures["cn-a"] / "union")] if single else []), "--out", str(out), "--force", "--dtype",
             "fp32", "--device", "cpu", "--check", "quick" if layout == "folder" else "none"], f"export union {layout}")
        exports.setdefault("union", {})[layout] = out
    return fixtures, exports


def export_rows(exports: dict, model: Path) -> list[dict]:
    """Every layout's controlnet.ts equals the folder's: parameters and outputs, bit for bit."""
    rows = []
    control = json.loads((model / "model.json").read_text())["unet"]["control"]
    for name, by_layout in exports.items():
        if name == "union":
            rows.append(union_export_row(by_layout, control))
            continue
        ref = torch.jit.load(str(by_layout["folder"] / "controlnet.ts"))
        meta = json.loads((by_layout["folder"] / "model.json").read_text())["controlnet"]
        gen = torch.Generator().manual_seed(3)
        inp = (torch.randn(2, 4, 32, 40, generator=gen), torch.tensor([999.0, 501.0]),
               torch.randn(2, 77, meta["context_dim"], generator=gen), torch.randn(2, meta["pooled_dim"], generator=gen),
               torch.tensor([[256.0, 320, 0, 0, 256, 320]] * 2), torch.rand(2, 3, 256, 320, generator=gen))
        want_p, want_o = dict(ref.named_parameters()), ref(*inp)
        same = all(meta[k] == control[k] for k in ("residuals", "channels", "downscales"))
        rows.append({"case": f"{name}: layout = unet.control", "what": f"{meta['residuals']} + 1 residuals, channels "
                     f"{meta['channels']}", "value": float(same), "ok": same and len(want_o) == meta["residuals"] + 1})
        for layout, d in by_layout.items():
            if layout == "folder":
                continue
            ts = torch.jit.load(str(d / "controlnet.ts"))
            got_p, got_o = dict(ts.named_parameters()), ts(*inp)
            dp = (max(float((want_p[k] - got_p[k]).abs().max()) for k in want_p) if set(got_p) == set(want_p)
                  else float("inf"))
            do = max(float((x - y).abs().max()) for x, y in zip(want_o, got_o)) if len(got_o) == len(want_o) else 1e9
            rows.append({"case": f"{name}: {layout} == folder", "what": "max |diff| of parameters, outputs "
                         f"({do:.3g})", "value": max(dp, do), "ok": dp == 0 and do == 0})
    return rows


def union_export_row(by_layout: dict[str, Path], control: dict) -> dict:
    """The Union ControlNet's file export equals its folder's, bit for bit, on two images in one call;
    its residual layout is the model's and model.json lists ProMax's types."""
    meta = json.loads((by_layout["folder"] / "model.json").read_text())["controlnet"]
    gen = torch.Generator().manual_seed(4)
    inp = (torch.randn(2, 4, 32, 40, generator=gen), torch.tensor([999.0, 999.0]),
           torch.randn(2, 77, meta["context_dim"], generator=gen), torch.randn(2, meta["pooled_dim"], generator=gen),
           torch.tensor([[256.0, 320, 0, 0, 256, 320]] * 2), torch.rand(2, 2, 3, 256, 320, generator=gen),
           torch.zeros(2, 8).index_fill_(1, torch.tensor([1, 3]), 1.0), torch.tensor([3, 1]), torch.tensor([0.7, 0.5]))
    want, got = (torch.jit.load(str(by_layout[k] / "controlnet.ts"))(*inp) for k in ("folder", "keys"))
    d = max(float((x - y).abs().max()) for x, y in zip(want, got))
    same = all(meta[k] == control[k] for k in ("residuals", "channels", "downscales"))
    types = meta.get("union", {}).get("types", {})
    ok = d == 0 and same and types.get("tile") == 6 and types.get("repaint") == 7 and types.get("canny") == 3
    return {"case": "union: keys == folder", "what": f"max |diff| of outputs ({d:.3g}), layout, {len(types)} type names",
            "value": d, "ok": ok}


BAD = {"sd1.safetensors": "SD 1.x ControlNet", "sd1-folder": "SD 1.x ControlNet", "t2i-adapter.safetensors": "T2I-Adapter",
       "control-lora.safetensors": "Control-LoRA", "lllite.safetensors": "ControlLLLite", "lora.safetensors": "a LoRA",
       "checkpoint.safetensors": "a whole checkpoint", "union.safetensors": "missing",
       "truncated.safetensors": "truncated", "pickle.safetensors": "a pickle", "missing-tensor.safetensors": "1 missing"}


def refused_rows(work: Path, fx: Path) -> list[dict]:
    """The bad files of the fixture fx (cn-a): exit code 1, a message naming what the file is, nothing left behind."""
    rows = []
    for name, words in BAD.items():
        out = work / f"refused-{Path(name).stem}"
        config = ["--config", str(fx / "diffusers")] if name.endswith(".safetensors") else []
        r = subprocess.run([sys.executable, str(EXPORT), "--controlnet", str(fx / "bad" / name), *config, "--out",
                            str(out), "--dtype", "fp32"], capture_output=True, text=True)
        message = (r.stderr.strip().splitlines() or [""])[-1]
        leftovers = [p.name for p in work.glob(f".{out.name}*")] + ([out.name] if out.exists() else [])
        ok = r.returncode == 1 and words in message and not leftovers
        rows.append({"case": f"refused: {Path(name).stem}", "what": message[-76:], "value": float(r.returncode), "ok": ok})
    return rows


def union_refused_rows(a, work: Path, exports: dict, images: dict[str, Path]) -> list[dict]:
    """The new keys' hostile cases: generate's flags (exit 2 before the model loads) and validate's
    problems at their JSON pointers (validate = run: the same rules)."""
    plain, union = str(exports["cn-a"]["folder"]), str(exports["union"]["folder"])
    lines, circles = str(images["lines"]), str(images["circles"])
    rows = []
    base = [a.binary, "generate", "--model", a.model, "--prompt", PROMPT, "--steps", "2", "--out",
            str(work / "refused.png")]
    for tag, extra, words in (
            ("type on a plain ControlNet", ["--controlnet", plain, "--control-image", lines, "--control-type", "canny"],
             "is no Union ControlNet"),
            ("union without a type", ["--controlnet", union, "--control-image", lines], "needs the control type"),
            ("a type the union lacks", ["--controlnet", union, "--control-image", lines, "--control-type", "sketch"],
             "has no such control type"),
            ("two images, plain ControlNet", ["--controlnet", plain, "--control-image", lines, "--control-image",
                                              circles], "only a Union ControlNet")):
        r = subprocess.run(base + extra, capture_output=True, text=True)
        message = (r.stderr.strip().splitlines() or [""])[-1]
        rows.append({"case": f"generate refuses: {tag}", "what": message[-76:], "value": float(r.returncode),
                     "ok": r.returncode == 2 and words in message})
    cn = lambda **kw: {"id": f"t{len(tasks)}", "prompt": PROMPT, "controlnets": [kw]}  # noqa: E731
    tasks: list = []
    for kw in ({"model": plain, "image": lines, "type": "canny"}, {"model": union, "image": lines},
               {"model": union, "image": lines, "type": "sketch"},
               {"model": union, "images": [{"image": lines, "type": "canny"}, {"image": circles, "type": "sketch"}]},
               {"model": union, "images": [{"image": lines, "type": "canny"}]},
               {"model": union, "image": lines, "images": [{"image": lines, "type": "canny"},
                                                           {"image": circles, "type": "depth"}]},
               {"model": union, "images": [{"image": lines, "type": "canny"}, {"image": circles}]},
               {"model": union, "images": [{"image": lines, "type": "canny"}, {"image": circles, "type": "depth"}]}):
        tasks.append(cn(**kw))
    batch = work / "union-validate.json"
    batch.write_text(json.dumps({"version": 1, "defaults": {"steps": 2, "width": W, "height": H}, "tasks": tasks}))
    r = subprocess.run([a.binary, "validate", str(batch), "--model", a.model], capture_output=True, text=True)
    want = (("/tasks/0/controlnets/0/type", "is no Union ControlNet"), ("/tasks/1/controlnets/0/type", "is missing"),
            ("/tasks/2/controlnets/0/type", "no such control type"),
            ("/tasks/3/controlnets/0/images/1/type", "no such control type"),
            ("/tasks/4/controlnets/0/images", "2 or more"), ("/tasks/5/controlnets/0/image", "goes with"),
            ("/tasks/6/controlnets/0/images/1/type", "is missing"))
    out = r.stdout + r.stderr
    for pointer, words in want:
        hit = [ln for ln in out.splitlines() if pointer + ":" in ln and words in ln]
        rows.append({"case": f"validate: {pointer.removeprefix('/tasks/')}", "what": (hit or ["(not reported)"])[0][-76:],
                     "value": float(r.returncode), "ok": r.returncode == 2 and bool(hit)})
    clean = "/tasks/7" not in out
    rows.append({"case": "validate: two types in one call", "what": "no problem reported for /tasks/7",
                 "value": float(clean), "ok": clean})
    return rows


class Reference:
    """diffusers' ControlNet pipelines on the tiny model's components (fp32, CPU, Euler)."""

    def __init__(self, diffusers: str, exports_src: dict[str, Path]):
        from diffusers import (ControlNetModel, StableDiffusionXLControlNetImg2ImgPipeline,
                               StableDiffusionXLControlNetPipeline)

        self.pipe = reference_pipeline(diffusers)
        self.pipe.scheduler = make_scheduler(dict(self.pipe.scheduler.config), "Euler", "Automatic")
        self.cns = {n: ControlNetModel.from_pretrained(str(p), dtype=torch.float32, local_files_only=True,
                                                       low_cpu_mem_usage=False).eval() for n, p in exports_src.items()}
        parts = dict(self.pipe.components)
        self.t2i = StableDiffusionXLControlNetPipeline(**parts, controlnet=self.cns["cn-a"], add_watermarker=False)
        self.i2i = StableDiffusionXLControlNetImg2ImgPipeline(**parts, controlnet=self.cns["cn-a"],
                                                              add_watermarker=False)
        from diffusers import ControlNetUnionModel, StableDiffusionXLControlNetUnionPipeline

        union = ControlNetUnionModel.from_pretrained(str(Path(exports_src["cn-a"]).parent / "union"), dtype=torch.float32,
                                                     local_files_only=True, low_cpu_mem_usage=False).eval()
        self.union = StableDiffusionXLControlNetUnionPipeline(**parts, controlnet=union, add_watermarker=False)
        for p in (self.t2i, self.i2i, self.union):
            p.set_progress_bar_config(disable=True)
        with torch.inference_mode():
            self.embeds = a1111_embeds(self.pipe, PROMPT, NEGATIVE, True)

    def _common(self):
        cap = {}

        def on_end(p, i, t, kw):
            cap["latents"] = kw["latents"].detach().clone()
            return kw

        return cap, dict(**self.embeds, num_inference_steps=STEPS, guidance_scale=CFG, width=W, height=H,
                         generator=[torch.Generator("cpu").manual_seed(SEED)], output_type="pil",
                         callback_on_step_end=on_end, callback_on_step_end_tensor_inputs=["latents"])

    def plain(self):
        cap, kw = self._common()
        with torch.inference_mode():
            return self.pipe(**kw).images[0], cap["latents"].float().numpy()

    def control(self, nets: list[str], images: list[Path], scales: list[float], starts: list[float],
                ends: list[float], init_latents: torch.Tensor | None = None):
        cap, kw = self._common()
        pils = [Image.open(p).convert("RGB") for p in images]
        one = len(nets) == 1
        args = dict(controlnet_conditioning_scale=scales[0] if one else scales,
                    control_guidance_start=starts[0] if one else starts, control_guidance_end=ends[0] if one else ends)
        pipe = self.t2i if init_latents is None else self.i2i
        pipe.controlnet = self.cns[nets[0]] if one else _multi([self.cns[n] for n in nets])
        with torch.inference_mode():
            if init_latents is None:
                out = pipe(**kw, image=pils[0] if one else pils, **args)
            else:
                out = pipe(**kw, image=init_latents, control_image=pils[0] if one else pils, strength=I2I_STRENGTH,
                           **args)
        return out.images[0], cap["latents"].float().numpy()

    def control_union(self, images: list[Path], types: list[str], scales: list[float], starts: list[float],
                      ends: list[float]):
        """StableDiffusionXLControlNetUnionPipeline: one call of the Union ControlNet with every image."""
        cap, kw = self._common()
        one = len(images) == 1
        with torch.inference_mode():
            out = self.union(**kw, control_image=[Image.open(p).convert("RGB") for p in images],
                             control_mode=[UNION_TYPES[t] for t in types],
                             controlnet_conditioning_scale=scales[0] if one else scales,
                             control_guidance_start=starts[0] if one else starts,
                             control_guidance_end=ends[0] if one else ends)
        return out.images[0], cap["latents"].float().numpy()

    def control_with_lora(self, lora: tuple[str, float], **kw):
        """control() with a LoRA fused into the shared UNet and text encoders (and the prompt
        embeddings made again), then every weight put back."""
        from reference.lora_reference import fuse_lora_files, restore_originals

        originals: dict = {}
        saved = self.embeds
        fuse_lora_files(self.pipe, [lora], originals)
        try:
            with torch.inference_mode():
                self.embeds = a1111_embeds(self.pipe, PROMPT, NEGATIVE, True)
            return self.control(**kw)
        finally:
            restore_originals(originals)
            self.embeds = saved

    def encode(self, png: Path) -> torch.Tensor:
        """The mean of the VAE's latent distribution, scaled: what sdxl-batch starts img2img from."""
        x = torch.from_numpy(np.array(Image.open(png).convert("RGB"))).float() / 255.0
        with torch.inference_mode():
            lat = self.pipe.vae.encode(x.permute(2, 0, 1)[None] * 2.0 - 1.0).latent_dist.mean
        return lat * self.pipe.vae.config.scaling_factor


def _multi(nets):
    from diffusers.models.controlnets.multicontrolnet import MultiControlNetModel

    return MultiControlNetModel(nets)


def cases(exports: dict, images: dict[str, Path], init_png: Path, lora: Path) -> list[dict]:
    """The generate cases: ours' extra arguments and the reference's call."""
    a, b, u = (str(exports[n]["folder"]) for n in ("cn-a", "cn-b", "union"))
    one = lambda img, s: ["--controlnet", a, "--control-image", str(img), "--control-strength", str(s)]  # noqa: E731
    return [
        dict(tag="lora", ours=[*one(images["lines"], 0.8), "--lora", f"{lora}:0.8"],
             ref=dict(nets=["cn-a"], images=[images["lines"]], scales=[0.8], starts=[0.0], ends=[1.0]),
             lora=(str(lora), 0.8)),
        dict(tag="one", ours=one(images["lines"], 0.8),
             ref=dict(nets=["cn-a"], images=[images["lines"]], scales=[0.8], starts=[0.0], ends=[1.0])),
        dict(tag="two-windows",
             ours=[*one(images["lines"], 0.7), "--control-start", "0.0", "--control-end", "0.6",
                   "--controlnet", b, "--control-image", str(images["circles"]), "--control-strength", "0.5",
                   "--control-start", "0.3", "--control-end", "1.0"],
             ref=dict(nets=["cn-a", "cn-b"], images=[images["lines"], images["circles"]], scales=[0.7, 0.5],
                      starts=[0.0, 0.3], ends=[0.6, 1.0])),
        dict(tag="img2img", ours=[*one(images["lines"], 0.8), "--init-image", str(init_png), "--strength",
                                  str(I2I_STRENGTH)],
             ref=dict(nets=["cn-a"], images=[images["lines"]], scales=[0.8], starts=[0.0], ends=[1.0]), init=True),
        dict(tag="resized-200x320", ours=one(images["lines-200x320"], 0.8),
             ref=dict(nets=["cn-a"], images=[images["lines-200x320"]], scales=[0.8], starts=[0.0], ends=[1.0])),
        dict(tag="union-one", union=True, ours=["--controlnet", u, "--control-image", str(images["lines"]),
                                                "--control-type", "canny", "--control-strength", "0.8"],
             ref=dict(images=[images["lines"]], types=["canny"], scales=[0.8], starts=[0.0], ends=[1.0])),
        dict(tag="union-two", union=True,
             ours=["--controlnet", u, "--control-image", str(images["lines"]), "--control-type", "canny",
                   "--control-strength", "0.7", "--control-end", "0.6", "--control-image", str(images["circles"]),
                   "--control-type", "depth", "--control-strength", "0.5", "--control-start", "0.3"],
             ref=dict(images=[images["lines"], images["circles"]], types=["canny", "depth"], scales=[0.7, 0.5],
                      starts=[0.0, 0.3], ends=[0.6, 1.0])),
    ]


def ours_image(a, work: Path, tag: str, extra: list[str]) -> tuple[Path, Path]:
    """sdxl-batch's image of the case `tag`: the common settings and `extra`."""
    return run_ours(a, work, tag, ["--prompt", PROMPT, "--negative", NEGATIVE, "--seed", str(SEED), "--cfg", str(CFG),
                                   "--steps", str(STEPS), "--sampler", "Euler", "--width", str(W), "--height", str(H),
                                   *extra])


def image_rows(a, work: Path, fixtures: dict[str, Path], exports: dict, images: dict[str, Path],
               lora: Path) -> list[dict]:
    ref = Reference(a.diffusers, {n: fixtures[n] / "diffusers" for n in exports if n != "union"})
    plain_img, _ = ref.plain()
    init_png = work / "init-ref.png"  # the img2img start: the reference's image without ControlNet
    plain_img.save(init_png)
    init_lat = ref.encode(init_png)
    refs = {}
    for c in cases(exports, images, init_png, lora):
        init = init_lat if c.get("init") else None
        img, lat = (ref.control_with_lora(c["lora"], **c["ref"], init_latents=init) if c.get("lora")
                    else ref.control_union(**c["ref"]) if c.get("union") else ref.control(**c["ref"], init_latents=init))
        img.save(work / f"{c['tag']}-ref.png")
        np.save(work / f"{c['tag']}-ref.npy", lat)
        refs[c["tag"]] = (work / f"{c['tag']}-ref.png", lat)
    p = psnr(load_rgb(str(refs["one"][0])), load_rgb(str(init_png)))
    rows = [{"case": "reference: ControlNet acts", "what": "PSNR dB of diffusers with vs without the ControlNet",
             "value": p, "ok": p < ACTS_MAX_PSNR}]
    print(f"reference images written; with vs without ControlNet {p:.2f} dB", flush=True)
    plain_png, _ = ours_image(a, work, "plain", [])
    for c in cases(exports, images, init_png, lora):
        png, lat = ours_image(a, work, c["tag"], c["ours"])
        rows.append(image_row(c["tag"], png, lat, *refs[c["tag"]],
                              max(a.min_psnr, UNION_MIN_PSNR) if c.get("union") else a.min_psnr))
    p = psnr(load_rgb(str(work / "one-sdxl.png")), load_rgb(str(plain_png)))
    rows.append({"case": "ours: ControlNet acts", "what": "PSNR dB of sdxl-batch with vs without the ControlNet",
                 "value": p, "ok": p < ACTS_MAX_PSNR})
    return rows


def main() -> int:
    def extra(ap):
        ap.add_argument("--loras", help="existing reference.make_test_loras output (default: make them under --work)")
        ap.add_argument("--side-modules", help="the ctest fixture side_modules' folder (default: make cn-a under --work)")

    a, work = parse_args(__doc__, extra)
    torch.set_num_threads(1)
    loras = Path(a.loras) if a.loras else work / "loras"
    if not a.loras:
        subprocess.run([sys.executable, "-m", "reference.make_test_loras", "--out", str(loras)], check=True,
                       capture_output=True)
    fixtures, exports = make_controlnets(work, a.diffusers, Path(a.side_modules) if a.side_modules else None)
    rows = export_rows(exports, Path(a.model)) + refused_rows(work, fixtures["cn-a"])
    images = control_images(work)
    rows += union_refused_rows(a, work, exports, images)
    rows += image_rows(a, work, fixtures, exports, images, loras / "kohya_unet.safetensors")
    failed = not all(r["ok"] for r in rows)
    return finish(rows, [("case", "case", "<34"), ("what", "what", "<76"), ("value", "value", ">10.3g")],
                  work / "parity_controlnet.json", failed,
                  "a ControlNet export differs between layouts, an image is below {min_psnr} dB, or the ControlNet "
                  "does not change the image", ": ControlNets match diffusers", a.min_psnr)


if __name__ == "__main__":
    sys.exit(main())
