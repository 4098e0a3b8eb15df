#!/usr/bin/env python3
"""Parity (ctest label parity): IP-Adapters vs diffusers on the tiny model, CPU.

reference.ip_adapter_fixture makes a tiny random plain IP-Adapter and a tiny random plus one, each with its
own tiny CLIP vision encoder, in the original single-file layout, and files the export must refuse. Then:
  - export_sdxl.py --ip-adapter FILE --image-encoder DIR (fp32, cpu) of each; its model.json adapter.layers
    and cross_attention_dim equal the model's unet.ip_adapter (what sdxl-batch checks at load);
  - the fixture's bad files (SD 1.x / 2.x adapters, FaceID, full-face, a LoRA, a ControlNet, a whole
    checkpoint, other tensors, truncated, a pickle, a missing layer / Resampler tensor, an encoder of
    another width, an encoder with pickle weights only): exit code 1, a message naming what is wrong, no
    output folder and no temporary folder left;
  - Python only (no sdxl-batch needed; --python-only runs just these and the two above):
      * clip_pixels, the CLIP preprocessing sdxl-batch implements, equals transformers'
        CLIPImageProcessor(size=S, crop_size=S) (what load_ip_adapter makes) bit for bit, on the
        reference images and a sweep of sizes;
      * image_encoder.ts on those pixels equals diffusers' image encoder output (encode_image);
      * unet.ts forward_ip / forward_control_ip with ip_kv from ip_adapter.ts(image_encoder.ts(pixels))
        (assemble_ip_kv: v times the scale, several images' tokens concatenated along dim 1, the negative
        rows as diffusers' encode_image makes them) equal diffusers' UNet with the adapter loaded
        (load_ip_adapter, set_ip_adapter_scale) on prepare_ip_adapter_image_embeds' embeddings, in a CFG
        batch of 2 rows: plain and plus, 1 and 2 images, scales 0.3 and 1.0; max |diff| <= 1e-4 (fp32);
        and the adapter changes the UNet's output;
  - sdxl-batch vs StableDiffusionXLPipeline (Img2Img, ControlNet) built from the tiny model's components
    with the fixture's encoder and the adapter loaded (Euler, A1111 prompt embeddings, the same seed, CFG,
    steps, size), every case a task of ONE `sdxl-batch run` with a per-task "ip_adapter": {"model",
    "images", "scale"}: PSNR >= --min-psnr (40 dB) for plain 0.3 / 1.0, plus 0.3 / 1.0, two reference
    images (plain and plus), plain with a LoRA (kohya_unet at 0.8, fused by reference.lora_reference),
    plus with a ControlNet (reference.controlnet_fixture, strength 0.8), img2img (strength 0.6); the
    two-image case also through `sdxl-batch generate --ip-adapter DIR --ip-image PNG --ip-image PNG2
    --ip-scale X` (image and latents); the adapter acts:
    with vs without it, PSNR < 30 dB (ours and the reference). The reference images (90x61, 70x110) are
    of another size and aspect than the encoders' (32, 64): resize and centre crop are exercised.

    PYTHONPATH=tests parity_ip_adapter.py --binary B --model TINY --diffusers TINY_DIFFUSERS --work DIR [--loras DIR]
        [--side-modules DIR]   (ctest's fixture side_modules: the adapters, the ControlNet and their exports)
    PYTHONPATH=tests parity_ip_adapter.py --python-only --model TINY --diffusers TINY_DIFFUSERS --work DIR
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from parity_common import (finish, image_row, meta_of, parse_args_python_only, residuals, run_ours, run_ours_batch,
                           unet_inputs)
from testkit import run_ok as run
from PIL import Image, ImageDraw

from reference.a1111_schedulers import make_scheduler
from reference.compare_images import load_rgb, psnr
from reference.reference_sdxl import a1111_embeds

EXPORT = Path(__file__).resolve().parents[2] / "scripts" / "export_sdxl.py"
PROMPT, NEGATIVE, SEED, CFG, STEPS, W, H = "comic panel, a lighthouse on a cliff", "blurry", 13, 5.0, 8, 256, 256
I2I_STRENGTH, CN_STRENGTH = 0.6, 0.8
ACTS_MAX_PSNR = 30.0
UNET_TOL = 1e-4
VARIANTS = ("plain", "plus")


def reference_images(work: Path) -> dict[str, Path]:
    """Deterministic reference images: A 90x61 (landscape), B 70x110 (portrait): gradients, ellipses, lines."""
    rng = np.random.RandomState(11)
    out = {}
    for name, (w, h), base in (("A", (90, 61), (40, 90, 200)), ("B", (70, 110), (220, 120, 30))):
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        arr = np.stack([base[0] + 50 * np.sin(xx / 7), base[1] + 60 * yy / h, base[2] - 40 * xx / w], -1)
        im = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
        d = ImageDraw.Draw(im)
        for _ in range(5):
            x, y, r = (int(v) for v in (rng.randint(0, w), rng.randint(0, h), rng.randint(5, 20)))
            d.ellipse((x - r, y - r, x + r, y + r), fill=tuple(int(c) for c in rng.randint(0, 256, 3)))
        d.line([(0, h - 1), (w - 1, 0)], fill=(255, 255, 255), width=3)
        out[name] = work / f"ip-image-{name}-{w}x{h}.png"
        im.save(out[name])
    return out


def side_modules(a) -> Path | None:
    """--side-modules as a Path (None: the script makes its adapters and ControlNet itself)."""
    return Path(a.side_modules) if a.side_modules else None


def make_adapters(work: Path, diffusers: str, shared: Path | None) -> tuple[Path, dict[str, Path]]:
    """The fixture (work/fixture) and each variant exported: (fixture dir, {variant: export dir}).
    shared: the ctest fixture side_modules' folder, which holds them (ip-adapter/, ip-plain/, ip-plus/)."""
    if shared:
        return shared / "ip-adapter", {v: shared / f"ip-{v}" for v in VARIANTS}
    fx = work / "fixture"
    run([sys.executable, "-m", "reference.ip_adapter_fixture", "--diffusers", diffusers, "--out", str(fx)],
        "reference.ip_adapter_fixture")
    exports = {}
    for v in VARIANTS:
        exports[v] = work / f"ip-{v}"
        run([sys.executable, str(EXPORT), "--ip-adapter", str(fx / v / f"ip-adapter-{v}.safetensors"),
             "--image-encoder", str(fx / v / "image_encoder"), "--out", str(exports[v]), "--force", "--dtype", "fp32",
             "--device", "cpu", "--threads", "1"], f"export --ip-adapter {v}")
    return fx, exports



def layout_rows(exports: dict[str, Path], model: Path) -> list[dict]:
    """Each export's layers and text width are the model's unet.ip_adapter (sdxl-batch's load check)."""
    want = meta_of(model)["unet"]["ip_adapter"]
    rows = []
    for v, d in exports.items():
        m = meta_of(d)
        ad = m["adapter"]
        same = ad["layers"] == want["layers"] and ad["cross_attention_dim"] == want["cross_attention_dim"]
        rows.append({"case": f"{v}: layers = unet.ip_adapter", "what": f"{len(ad['layers'])} layers, {ad['tokens']} "
                     f"tokens, text width {ad['cross_attention_dim']}, variant {m['variant']}", "value": float(same),
                     "ok": same and m["variant"] == v and m["kind"] == "ip_adapter"})
    return rows


BAD = {"sd1.safetensors": "SD 1.x IP-Adapter", "sd2.safetensors": "SD 2.x IP-Adapter",
       "faceid.safetensors": "FaceID", "faceid-plus.safetensors": "FaceID", "full-face.safetensors": "not supported",
       "lora.safetensors": "a LoRA", "controlnet.safetensors": "a ControlNet", "checkpoint.safetensors": "a whole checkpoint",
       "other.safetensors": "not an IP-Adapter", "truncated.safetensors": "truncated", "pickle.safetensors": "a pickle",
       "missing-tensor.safetensors": "ip_adapter.5.to_v_ip.weight",
       "missing-resampler-tensor.safetensors": "layers.2.attn.to_q.weight"}


def refused_rows(work: Path, fx: Path) -> list[dict]:
    """The fixture's bad files (and two encoder mismatches): exit code 1, a message naming what is wrong,
    nothing left behind."""
    plain, plus = fx / "plain", fx / "plus"
    cases = [(n, fx / "bad" / n, plain / "image_encoder", words) for n, words in BAD.items()]
    cases += [("encoder-width", plain / "ip-adapter-plain.safetensors", plus / "image_encoder",
               "not the encoder it was trained with"),
              ("encoder-bin", plain / "ip-adapter-plain.safetensors", fx / "bad" / "encoder-bin", "no model.safetensors")]
    rows = []
    for name, src, enc, words in cases:
        out = work / f"refused-{Path(name).stem}"
        r = subprocess.run([sys.executable, str(EXPORT), "--ip-adapter", str(src), "--image-encoder", str(enc),
                            "--out", str(out), "--dtype", "fp32", "--threads", "1"], capture_output=True, text=True)
        message = (r.stderr.strip().splitlines() or [""])[-1]
        leftovers = [p.name for p in work.glob(f".{out.name}*")] + ([out.name] if out.exists() else [])
        ok = r.returncode == 1 and words in message and not leftovers
        rows.append({"case": f"refused: {Path(name).stem}", "what": message[-76:], "value": float(r.returncode), "ok": ok})
    return rows


# --- what sdxl-batch does, in Python ------------------------------------------------------------
def clip_pixels(png: Path, enc_meta: dict) -> torch.Tensor:
    """transformers 5's CLIPImageProcessor(size=S, crop_size=S) (its torchvision backend): the RGB uint8
    image resized with torch's antialiased bicubic on uint8 (F.interpolate, align_corners=False) so the
    shortest side is S and the other int(S * long / short) (not resized when that is its size already),
    centre crop S x S at top = int((h - S) / 2), left = int((w - S) / 2), then in float32
    (x - mean * 255) / (std * 255) with mean * 255 and std * 255 rounded to float32. -> [1, 3, S, S]."""
    s = enc_meta["image_size"]
    x = torch.from_numpy(np.array(Image.open(png).convert("RGB"))).permute(2, 0, 1)[None].contiguous()
    h, w = x.shape[-2:]
    short, long = (w, h) if w <= h else (h, w)
    new_long = int(s * long / short)
    nh, nw = (new_long, s) if w <= h else (s, new_long)
    if (nh, nw) != (h, w):
        x = F.interpolate(x, size=[nh, nw], mode="bicubic", align_corners=False, antialias=True)
    top, left = int((nh - s) / 2.0), int((nw - s) / 2.0)
    x = x[..., top:top + s, left:left + s].float()
    mean = torch.tensor(enc_meta["mean"], dtype=torch.float32) * 255.0
    std = torch.tensor(enc_meta["std"], dtype=torch.float32) * 255.0
    return (x - mean[:, None, None]) / std[:, None, None]


def assemble_ip_kv(enc_ts, ad_ts, meta: dict, pngs: list[Path], scale: float, rows_per_half: int = 1) -> tuple:
    """unet.ts's ip_kv for a CFG batch [negative rows; positive rows] of one adapter and its images:
    ip_adapter.ts on each image's encoder output (negative: zeros of image_embeds for plain, the encoder
    on all-zero pixel_values for plus), each layer's tokens of the images concatenated along dim 1
    (image after image), v multiplied by the scale."""
    px = torch.cat([clip_pixels(p, meta["image_encoder"]) for p in pngs])
    with torch.no_grad():
        pos = enc_ts(px)
        neg = torch.zeros_like(pos) if meta["image_encoder"]["negative"] == "zero_embeds" else enc_ts(torch.zeros_like(px))
        kv_pos, kv_neg = ad_ts(pos), ad_ts(neg)
    out = []
    for j, (p, n) in enumerate(zip(kv_pos, kv_neg)):
        p, n = (t.reshape(1, -1, t.shape[-1]).expand(rows_per_half, -1, -1) for t in (p, n))
        both = torch.cat([n, p])
        out.append(both * scale if j % 2 else both)
    return tuple(out)


def load_modules(folder: Path) -> tuple:
    return tuple(torch.jit.load(str(folder / f)) for f in ("image_encoder.ts", "ip_adapter.ts"))


# --- the reference -------------------------------------------------------------------------------------
class Reference:
    """diffusers' SDXL pipelines on the tiny model's components with one fixture IP-Adapter loaded as
    load_ip_adapter does (its encoder given as image_encoder, CLIPImageProcessor(size=S, crop_size=S) as
    load_ip_adapter would make it), fp32, CPU, Euler."""

    def __init__(self, diffusers: str, fx: Path, variant: str):
        from diffusers import StableDiffusionXLPipeline
        from transformers import CLIPImageProcessor, CLIPVisionModelWithProjection

        torch.set_num_threads(1)
        enc = CLIPVisionModelWithProjection.from_pretrained(str(fx / variant / "image_encoder"), dtype=torch.float32,
                                                            local_files_only=True).eval()
        s = enc.config.image_size
        self.pipe = StableDiffusionXLPipeline.from_pretrained(
            diffusers, dtype=torch.float32, local_files_only=True, add_watermarker=False, image_encoder=enc,
            feature_extractor=CLIPImageProcessor(size=s, crop_size=s))
        self.pipe.set_progress_bar_config(disable=True)
        self.pipe.scheduler = make_scheduler(dict(self.pipe.scheduler.config), "Euler", "Automatic")
        self.pipe.load_ip_adapter(str(fx / variant), subfolder="", weight_name=f"ip-adapter-{variant}.safetensors",
                                  image_encoder_folder=None)
        with torch.inference_mode():
            self.embeds = a1111_embeds(self.pipe, PROMPT, NEGATIVE, True)

    def generate(self, pngs: list[Path] | None, scale: float, init_latents: torch.Tensor | None = None,
                 lora: tuple[str, float] | None = None, control: tuple | None = None):
        """One image (and its final latents) with the adapter at `scale` on these reference images (None: no
        adapter: scale 0, which diffusers' IPAdapterAttnProcessor2_0 skips); img2img from init_latents; a LoRA
        fused into the UNet and text encoders for the call; control = (ControlNetModel, control PNG)."""
        from reference.lora_reference import fuse_lora_files, restore_originals

        originals: dict = {}
        saved = self.embeds
        if lora:
            fuse_lora_files(self.pipe, [lora], originals)
        try:
            with torch.inference_mode():
                if lora:
                    self.embeds = a1111_embeds(self.pipe, PROMPT, NEGATIVE, True)
                self.pipe.set_ip_adapter_scale(scale if pngs else 0.0)
                # no adapter: any image; at scale 0 the processors add nothing (they skip the image attention)
                pils = [Image.open(p).convert("RGB") for p in pngs] if pngs else [Image.new("RGB", (64, 64), "gray")]
                return self._call([pils], init_latents, control)
        finally:
            restore_originals(originals)
            self.embeds = saved

    def _call(self, ip_images, init_latents, control):
        from diffusers import (StableDiffusionXLControlNetPipeline, StableDiffusionXLImg2ImgPipeline,
                               StableDiffusionXLPipeline)

        cap = {}

        def on_end(p, i, t, kw):
            cap["latents"] = kw["latents"].detach().clone()
            return kw

        kw = dict(**self.embeds, num_inference_steps=STEPS, guidance_scale=CFG, width=W, height=H,
                  generator=[torch.Generator("cpu").manual_seed(SEED)], output_type="pil", ip_adapter_image=ip_images,
                  callback_on_step_end=on_end, callback_on_step_end_tensor_inputs=["latents"])
        parts = dict(self.pipe.components)
        if control is not None:
            pipe = StableDiffusionXLControlNetPipeline(**parts, controlnet=control[0], add_watermarker=False)
            kw.update(image=Image.open(control[1]).convert("RGB"), controlnet_conditioning_scale=CN_STRENGTH)
        elif init_latents is not None:
            pipe = StableDiffusionXLImg2ImgPipeline(**parts, add_watermarker=False)
            kw.update(image=init_latents, strength=I2I_STRENGTH)
        else:
            pipe = self.pipe
        assert isinstance(self.pipe, StableDiffusionXLPipeline)
        pipe.set_progress_bar_config(disable=True)
        out = pipe(**kw)
        return out.images[0], cap["latents"].float().numpy()

    def encode(self, png: Path) -> torch.Tensor:
        """The mean of the VAE's latent distribution, scaled: what sdxl-batch starts img2img from."""
        x = torch.from_numpy(np.array(Image.open(png).convert("RGB"))).float() / 255.0
        with torch.inference_mode():
            lat = self.pipe.vae.encode(x.permute(2, 0, 1)[None] * 2.0 - 1.0).latent_dist.mean
        return lat * self.pipe.vae.config.scaling_factor

    def image_embeds(self, pngs: list[Path]) -> list[torch.Tensor]:
        """prepare_ip_adapter_image_embeds for one adapter and these images, CFG on: [[neg], [pos]]."""
        pils = [Image.open(p).convert("RGB") for p in pngs]
        with torch.no_grad():
            return self.pipe.prepare_ip_adapter_image_embeds([pils], None, torch.device("cpu"), 1, True)


# --- Python-only equivalence ------------------------------------------------------------------------
def preprocess_rows(work: Path, images: dict[str, Path], exports: dict[str, Path]) -> list[dict]:
    """clip_pixels == CLIPImageProcessor(size=S, crop_size=S) bit for bit: the reference images and random
    images of a sweep of sizes (down and up, both aspects, already S on the short side, odd crop offsets)."""
    from transformers import CLIPImageProcessor

    rng = np.random.RandomState(3)
    pngs = list(images.values())
    for w, h in ((32, 32), (33, 32), (64, 71), (31, 17), (17, 40), (300, 1000), (640, 480), (97, 64), (225, 224)):
        pngs.append(work / f"pre-{w}x{h}.png")
        Image.fromarray(rng.randint(0, 256, (h, w, 3)).astype(np.uint8)).save(pngs[-1])
    rows = []
    for v, d in exports.items():
        enc = meta_of(d)["image_encoder"]
        s = enc["image_size"]
        fe = CLIPImageProcessor(size=s, crop_size=s)
        worst = max(float((clip_pixels(p, enc) - fe(Image.open(p).convert("RGB"), return_tensors="pt")
                           .pixel_values).abs().max()) for p in pngs)
        rows.append({"case": f"{v}: CLIP preprocessing (S={s})", "what": f"max |clip_pixels - CLIPImageProcessor| over "
                     f"{len(pngs)} images", "value": worst, "ok": worst == 0.0})
    return rows


def encoder_rows(refs: dict, images: dict[str, Path], exports: dict[str, Path]) -> list[dict]:
    """image_encoder.ts (and its negative) == diffusers' encode_image, on the two reference images."""
    rows = []
    pngs = [images["A"], images["B"]]
    for v, d in exports.items():
        meta = meta_of(d)
        enc_ts, _ = load_modules(d)
        px = torch.cat([clip_pixels(p, meta["image_encoder"]) for p in pngs])
        with torch.no_grad():
            pos, neg = refs[v].pipe.encode_image([Image.open(p).convert("RGB") for p in pngs], torch.device("cpu"), 1,
                                                 v == "plus")
            got = enc_ts(px)
            got_neg = torch.zeros_like(got) if v == "plain" else enc_ts(torch.zeros_like(px))
        d_pos, d_neg = float((got - pos).abs().max()), float((got_neg - neg).abs().max())
        rows.append({"case": f"{v}: image_encoder.ts", "what": f"max |diff| vs encode_image {tuple(got.shape)} "
                     f"(negative {d_neg:.3g})", "value": max(d_pos, d_neg), "ok": max(d_pos, d_neg) <= 1e-5})
    return rows


def diffusers_unet(ref, inp: tuple, embeds: list | None, res: tuple | None = None) -> torch.Tensor:
    lat, t, ctx, te, tid = inp
    cond = {"text_embeds": te, "time_ids": tid}
    if embeds is not None:
        cond["image_embeds"] = embeds
    extra = {} if res is None else {"down_block_additional_residuals": [r.clone() for r in res[:-1]],
                                    "mid_block_additional_residual": res[-1].clone()}
    with torch.no_grad():
        return ref.pipe.unet(lat, t, encoder_hidden_states=ctx, added_cond_kwargs=cond, return_dict=False, **extra)[0]


def unet_rows(model: Path, refs: dict, images: dict[str, Path], exports: dict[str, Path]) -> list[dict]:
    """unet.ts forward_ip / forward_control_ip == diffusers' UNet with the adapter loaded, and the adapter acts."""
    unet = torch.jit.load(str(model / "unet.ts"))
    gen = torch.Generator().manual_seed(17)
    rows = []
    for v, d in exports.items():
        meta, (enc_ts, ad_ts), ref = meta_of(d), load_modules(d), refs[v]
        for names in (["A"], ["A", "B"]):
            pngs = [images[n] for n in names]
            for scale in (0.3, 1.0):
                ref.pipe.set_ip_adapter_scale(scale)
                inp, kv = unet_inputs(model, gen), assemble_ip_kv(enc_ts, ad_ts, meta, pngs, scale)
                with torch.no_grad():
                    got = unet.forward_ip(*inp, kv)
                dif = float((got - diffusers_unet(ref, inp, ref.image_embeds(pngs))).abs().max())
                rows.append({"case": f"{v}: forward_ip {'+'.join(names)} x{scale}", "what": f"max |diff| vs diffusers' "
                             f"UNet, {kv[0].shape[1]} tokens", "value": dif, "ok": dif <= UNET_TOL})
        ref.pipe.set_ip_adapter_scale(0.7)
        inp, res = unet_inputs(model, gen), residuals(model, gen)
        kv = assemble_ip_kv(enc_ts, ad_ts, meta, [images["B"]], 0.7)
        with torch.no_grad():
            got = unet.forward_control_ip(*inp, res, kv)
            plain = unet(*inp)
        dif = float((got - diffusers_unet(ref, inp, ref.image_embeds([images["B"]]), res)).abs().max())
        rows.append({"case": f"{v}: forward_control_ip B x0.7", "what": "max |diff| vs diffusers' UNet with residuals",
                     "value": dif, "ok": dif <= UNET_TOL})
        ref.pipe.set_ip_adapter_scale(1.0)
        with torch.no_grad():
            with_ip = unet.forward_ip(*inp, assemble_ip_kv(enc_ts, ad_ts, meta, [images["B"]], 1.0))
        rel = float((with_ip - plain).abs().max() / plain.abs().max())
        rows.append({"case": f"{v}: the adapter acts (UNet)", "what": "max |forward_ip x1.0 - forward| / max |forward|",
                     "value": rel, "ok": rel > 0.05})
    return rows


def python_rows(a, work: Path, refs: dict, images: dict[str, Path], exports: dict[str, Path]) -> list[dict]:
    rows = preprocess_rows(work, images, exports) + encoder_rows(refs, images, exports)
    rows += unet_rows(Path(a.model), refs, images, exports)
    for r in rows:
        print(f"  {r['case']:40s} {r['value']:.3g} {'ok' if r['ok'] else 'FAIL'}", flush=True)
    return rows


# --- sdxl-batch vs the reference ---------------------------------------------------------------------
def make_controlnet(work: Path, diffusers: str, shared: Path | None) -> tuple[Path, Path, Path]:
    """(the fixture ControlNet's diffusers folder, its export, a line-drawing control image).
    shared: the ctest fixture side_modules' folder, which holds both (controlnet/, controlnet-export/)."""
    if shared:
        src, out = shared / "controlnet", shared / "controlnet-export"
    else:
        src, out = work / "cn-src", work / "cn-export"
        run([sys.executable, "-m", "reference.controlnet_fixture", "--diffusers", diffusers, "--out", str(src),
             "--diffusers-only"], "reference.controlnet_fixture")
        run([sys.executable, str(EXPORT), "--controlnet", str(src / "diffusers"), "--out", str(out), "--force",
             "--dtype", "fp32", "--device", "cpu", "--check", "none", "--threads", "1"], "export --controlnet")
    rng = np.random.RandomState(5)
    im = Image.new("RGB", (W, H), "black")
    d = ImageDraw.Draw(im)
    for _ in range(14):
        d.line([tuple(int(v) for v in (rng.randint(0, W), rng.randint(0, H))) for _ in range(3)], fill="white",
               width=int(rng.randint(2, 6)))
    im.save(work / "control-lines.png")
    return src / "diffusers", out, work / "control-lines.png"


def cases(images: dict[str, Path]) -> list[dict]:
    """The generate cases: variant, reference images, scale, and what else the task has."""
    A, B = images["A"], images["B"]
    return [dict(tag="plain-0.3", v="plain", pngs=[A], scale=0.3), dict(tag="plain-1.0", v="plain", pngs=[A], scale=1.0),
            dict(tag="plus-0.3", v="plus", pngs=[B], scale=0.3), dict(tag="plus-1.0", v="plus", pngs=[B], scale=1.0),
            dict(tag="plain-two-images", v="plain", pngs=[A, B], scale=0.7),
            dict(tag="plus-two-images", v="plus", pngs=[A, B], scale=0.7),
            dict(tag="plain-lora", v="plain", pngs=[A], scale=0.8, lora=True),
            dict(tag="plus-controlnet", v="plus", pngs=[B], scale=0.6, control=True),
            dict(tag="plain-img2img", v="plain", pngs=[B], scale=0.8, init=True)]


def ours_args(c: dict, exports: dict[str, Path]) -> list[str]:
    """The `generate` flags of case c's adapter (the generate row: no LoRA, ControlNet or init image)."""
    args = ["--ip-adapter", str(exports[c["v"]])]
    for p in c["pngs"]:
        args += ["--ip-image", str(p)]
    return args + ["--ip-scale", str(c["scale"])]


def ours_image(a, work: Path, tag: str, extra: list[str]) -> tuple[Path, Path]:
    """sdxl-batch generate's image of the case `tag`: the common settings and `extra`."""
    return run_ours(a, work, tag, ["--prompt", PROMPT, "--negative", NEGATIVE, "--seed", str(SEED), "--cfg", str(CFG),
                                   "--steps", str(STEPS), "--sampler", "Euler", "--width", str(W), "--height", str(H),
                                   *extra])


def batch_task(c: dict | None, exports: dict[str, Path], lora: Path, cn: Path, control_png: Path,
               init_png: Path) -> dict:
    """Case c as a batch-file task (None: the task without an adapter)."""
    t = {"prompt": PROMPT, "negative": NEGATIVE, "seed": SEED, "cfg": CFG, "steps": STEPS, "sampler": "Euler",
         "width": W, "height": H}
    if c is None:
        return t
    t["ip_adapter"] = {"model": str(exports[c["v"]]), "images": [str(p) for p in c["pngs"]], "scale": c["scale"]}
    if c.get("lora"):
        t["loras"] = [{"path": str(lora), "weight": 0.8}]
    if c.get("control"):
        t["controlnets"] = [{"model": str(cn), "image": str(control_png), "strength": CN_STRENGTH}]
    if c.get("init"):
        t.update(init_image=str(init_png), strength=I2I_STRENGTH)
    return t


def references(a, work: Path, refs: dict, images: dict[str, Path], lora: Path, cn_src: Path, control_png: Path):
    """Every case's reference image and latents, the no-adapter image (also img2img's start) -> dict."""
    from diffusers import ControlNetModel

    cn = ControlNetModel.from_pretrained(str(cn_src), dtype=torch.float32, local_files_only=True,
                                         low_cpu_mem_usage=False).eval()
    none_img, _ = refs["plain"].generate(None, 0.0)
    init_png = work / "init-ref.png"
    none_img.save(init_png)
    init_lat = refs["plain"].encode(init_png)
    out = {"none": init_png}
    for c in cases(images):
        img, lat = refs[c["v"]].generate(c["pngs"], c["scale"], init_lat if c.get("init") else None,
                                         (str(lora), 0.8) if c.get("lora") else None,
                                         (cn, control_png) if c.get("control") else None)
        img.save(work / f"{c['tag']}-ref.png")
        out[c["tag"]] = (work / f"{c['tag']}-ref.png", lat)
        print(f"  reference {c['tag']} written", flush=True)
    return out


def image_rows(a, work: Path, refs: dict, images: dict[str, Path], exports: dict[str, Path], lora: Path) -> list[dict]:
    """Every case as a task of ONE `sdxl-batch run` (one task per UNet call, so each image is the
    one `generate` makes), and one case through `generate`'s flags, against diffusers."""
    cn_src, cn, control_png = make_controlnet(work, a.diffusers, side_modules(a))
    ref = references(a, work, refs, images, lora, cn_src, control_png)
    p = psnr(load_rgb(str(ref["plain-1.0"][0])), load_rgb(str(ref["none"])))
    rows = [{"case": "reference: the adapter acts", "what": "PSNR dB of diffusers with (plain x1.0) vs without",
             "value": p, "ok": p < ACTS_MAX_PSNR}]
    tasks = {"none": batch_task(None, exports, lora, cn, control_png, ref["none"])}
    tasks.update({c["tag"]: batch_task(c, exports, lora, cn, control_png, ref["none"]) for c in cases(images)})
    pngs = run_ours_batch(a, work, tasks)
    for c in cases(images):
        rows.append(image_row(c["tag"], pngs[c["tag"]], None, *ref[c["tag"]], a.min_psnr))
    c = next(c for c in cases(images) if c["tag"] == "plain-two-images")
    png, lat = ours_image(a, work, c["tag"], ours_args(c, exports))
    rows.append(image_row(f"generate: {c['tag']}", png, lat, *ref[c["tag"]], a.min_psnr))
    p = psnr(load_rgb(str(pngs["plain-1.0"])), load_rgb(str(pngs["none"])))
    rows.append({"case": "ours: the adapter acts", "what": "PSNR dB of sdxl-batch with (plain x1.0) vs without",
                 "value": p, "ok": p < ACTS_MAX_PSNR})
    return rows


def main() -> int:
    a, work = parse_args_python_only(__doc__, "only the checks that need no sdxl-batch: the exports, the refusals, "
                                     "the CLIP preprocessing, and unet.ts forward_ip / forward_control_ip vs "
                                     "diffusers' UNet", lambda ap: ap.add_argument(
                                         "--side-modules", help="the ctest fixture side_modules' folder (default: "
                                         "make the adapters and the ControlNet under --work)"))
    torch.set_num_threads(1)
    images = reference_images(work)
    fx, exports = make_adapters(work, a.diffusers, side_modules(a))
    rows = layout_rows(exports, Path(a.model)) + refused_rows(work, fx)
    refs = {v: Reference(a.diffusers, fx, v) for v in VARIANTS}
    rows += python_rows(a, work, refs, images, exports)
    if not a.python_only:
        loras = Path(a.loras) if a.loras else work / "loras"
        if not a.loras:
            run([sys.executable, "-m", "reference.make_test_loras", "--out", str(loras)], "reference.make_test_loras")
        rows += image_rows(a, work, refs, images, exports, loras / "kohya_unet.safetensors")
    failed = not all(r["ok"] for r in rows)
    return finish(rows, [("case", "case", "<40"), ("what", "what", "<76"), ("value", "value", ">10.3g")],
                  work / "parity_ip_adapter.json", failed,
                  "an IP-Adapter export or refusal is wrong, unet.ts differs from diffusers' UNet, an image is below "
                  "{min_psnr} dB, or the adapter does not change the image", ": IP-Adapters match diffusers",
                  a.min_psnr)


if __name__ == "__main__":
    sys.exit(main())
