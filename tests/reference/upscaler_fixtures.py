"""Upscaler files with random weights in the key layouts they are published in, and files the export
must refuse; and ComfyUI's tiled upscale (ImageUpscaleWithModel over comfy.utils.tiled_scale)
reimplemented, the reference sdxl-batch's upscaler runtime is compared with.

Layouts (small widths; the key names and the shapes' relations are the published ones):
  esrgan_old_x4      ESRGAN (xinntao's original): model.0, model.1.sub.N.RDBk.convj.0, model.3/6/8/10 (.pth)
  realesrgan_x4      Real-ESRGAN RealESRGAN_x4plus: conv_first, body.N.rdbk.convj, conv_body, conv_up1/2,
                     conv_hr, conv_last, under "params_ema" (.pth)
  realesrgan_x2      RealESRGAN_x2plus: the same with pixel-unshuffle x2 (conv_first takes 12 channels)
  realesrgan_x1      pixel-unshuffle x4 into the x4 body: scale 1 (48 channels in)
  anime6b_x4         RealESRGAN_x4plus_anime_6B: 6 RRDB blocks (.safetensors)
  compact_x4         realesr-animevideov3 / general-x4v3 SRVGGNetCompact: body.0 conv, PReLUs, convs (.pth)
  swinir_x2          SwinIR classical SR, pixelshuffle upsampler, window 8 (.pth, "params")
Refused:
  truncated.pth      realesrgan_x4's bytes cut in half
  truncated.safetensors  anime6b_x4's bytes cut
  unknown_layout.pth keys no architecture has
  gray_compact.pth   a 1-channel Compact (not RGB -> RGB)
"""
from __future__ import annotations

import itertools
from pathlib import Path

import torch
from safetensors.torch import save_file


def _conv(sd: dict, key: str, cout: int, cin: int, g: torch.Generator, k: int = 3, bias: float = 0.0) -> None:
    """He-scaled random weights (the signal keeps its size through the LeakyReLUs); `bias` added to the
    bias, 0.5 on the last conv so that the output spans [0, 1] rather than sitting clamped at 0."""
    sd[f"{key}.weight"] = torch.randn(cout, cin, k, k, generator=g) * (1.4 / (cin * k * k) ** 0.5)
    sd[f"{key}.bias"] = torch.randn(cout, generator=g) * 0.02 + bias


def realesrgan(nf: int, gc: int, nb: int, in_nc: int, g: torch.Generator) -> dict:
    """basicsr RRDBNet's keys (the Real-ESRGAN releases)."""
    sd: dict = {}
    _conv(sd, "conv_first", nf, in_nc, g)
    for b in range(nb):
        for r in (1, 2, 3):
            for j in range(1, 6):
                _conv(sd, f"body.{b}.rdb{r}.conv{j}", nf if j == 5 else gc, nf + (j - 1) * gc, g)
    for key in ("conv_body", "conv_up1", "conv_up2", "conv_hr"):
        _conv(sd, key, nf, nf, g)
    _conv(sd, "conv_last", 3, nf, g, bias=0.5)
    return sd


def esrgan_old(nf: int, gc: int, nb: int, g: torch.Generator) -> dict:
    """The original ESRGAN repository's sequential keys (x4: two nearest upsamples + convs)."""
    sd: dict = {}
    _conv(sd, "model.0", nf, 3, g)
    for b in range(nb):
        for r in (1, 2, 3):
            for j in range(1, 6):
                _conv(sd, f"model.1.sub.{b}.RDB{r}.conv{j}.0", nf if j == 5 else gc, nf + (j - 1) * gc, g)
    _conv(sd, f"model.1.sub.{nb}", nf, nf, g)
    for i in (3, 6, 8):
        _conv(sd, f"model.{i}", nf, nf, g)
    _conv(sd, "model.10", 3, nf, g, bias=0.5)
    return sd


def compact(nf: int, nconv: int, scale: int, in_nc: int, g: torch.Generator) -> dict:
    """Real-ESRGAN's SRVGGNetCompact: body = conv, PReLU, (conv, PReLU) x nconv, conv to 3*scale^2."""
    sd: dict = {}
    _conv(sd, "body.0", nf, in_nc, g)
    sd["body.1.weight"] = torch.full((nf,), 0.25)
    for i in range(nconv):
        _conv(sd, f"body.{2 + 2 * i}", nf, nf, g)
        sd[f"body.{3 + 2 * i}.weight"] = torch.rand(nf, generator=g) * 0.3
    _conv(sd, f"body.{2 + 2 * nconv}", in_nc * scale * scale, nf, g)
    return sd


def swinir(g: torch.Generator) -> dict:
    """SwinIR (classical SR, pixelshuffle) as its repository builds it; spandrel's class is that code."""
    from spandrel.architectures.SwinIR import SwinIR

    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=g)))
    m = SwinIR(upscale=2, in_chans=3, img_size=32, window_size=8, img_range=1.0, depths=[2, 2], embed_dim=24,
               num_heads=[2, 2], mlp_ratio=2.0, upsampler="pixelshuffle", resi_connection="1conv")
    return {k: v.clone() for k, v in m.state_dict().items()}


FIXTURES = ("esrgan_old_x4.pth", "realesrgan_x4.pth", "realesrgan_x2.pth", "realesrgan_x1.pth",
            "anime6b_x4.safetensors", "compact_x4.pth", "swinir_x2.pth")
REFUSED = {"truncated.pth": "cannot be read", "truncated.safetensors": "truncated.safetensors",
           "unknown_layout.pth": "unknown key layout", "gray_compact.pth": "maps RGB to RGB"}


def write_fixtures(folder: Path) -> list[Path]:
    """The FIXTURES and the REFUSED files in folder (deterministic); returns the FIXTURES' paths."""
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(40)
    torch.save(esrgan_old(16, 32, 2, g), folder / "esrgan_old_x4.pth")
    torch.save({"params_ema": realesrgan(16, 32, 2, 3, g)}, folder / "realesrgan_x4.pth")
    torch.save({"params_ema": realesrgan(16, 32, 1, 12, g)}, folder / "realesrgan_x2.pth")
    torch.save({"params_ema": realesrgan(16, 32, 1, 48, g)}, folder / "realesrgan_x1.pth")
    save_file(realesrgan(16, 32, 6, 3, g), str(folder / "anime6b_x4.safetensors"))
    torch.save({"params": compact(16, 4, 4, 3, g)}, folder / "compact_x4.pth")
    torch.save({"params": swinir(g)}, folder / "swinir_x2.pth")
    for src, dst in (("realesrgan_x4.pth", "truncated.pth"), ("anime6b_x4.safetensors", "truncated.safetensors")):
        data = (folder / src).read_bytes()
        (folder / dst).write_bytes(data[: len(data) // 2])
    torch.save({"encoder.weight": torch.randn(4, 4), "decoder.bias": torch.randn(4)}, folder / "unknown_layout.pth")
    torch.save(compact(8, 2, 2, 1, g), folder / "gray_compact.pth")
    return [folder / f for f in FIXTURES]


def tiled_scale(samples: torch.Tensor, function, tile_x: int, tile_y: int, overlap: int, upscale_amount: float,
                out_channels: int = 3) -> torch.Tensor:
    """comfy.utils.tiled_scale (tiled_scale_multidim over 2 dims): the whole image in one call when it fits
    a tile; else tiles every tile - overlap px (the last ones shifted to end at the border), each output
    weighted by a linear feather of round(overlap * scale) px on every side, the sum divided by the weights."""
    tile, ov = (tile_y, tile_x), (overlap, overlap)
    up = lambda n: round(n * upscale_amount)  # noqa: E731
    output = torch.empty([samples.shape[0], out_channels] + [up(s) for s in samples.shape[2:]])
    for b in range(samples.shape[0]):
        s = samples[b:b + 1]
        if all(s.shape[d + 2] <= tile[d] for d in range(2)):
            output[b:b + 1] = function(s)
            continue
        out = torch.zeros([1, out_channels] + [up(n) for n in s.shape[2:]])
        out_div = torch.zeros_like(out)
        positions = [range(0, s.shape[d + 2] - ov[d], tile[d] - ov[d]) if s.shape[d + 2] > tile[d] else [0]
                     for d in range(2)]
        for it in itertools.product(*positions):
            s_in, upscaled = s, []
            for d in range(2):
                pos = max(0, min(s.shape[d + 2] - ov[d], it[d]))
                length = min(tile[d], s.shape[d + 2] - pos)
                s_in = s_in.narrow(d + 2, pos, length)
                upscaled.append(up(pos))
            ps = function(s_in)
            mask = torch.ones_like(ps)
            for d in range(2, 4):
                feather = round(ov[d - 2] * upscale_amount)
                if feather >= mask.shape[d]:
                    continue
                for t in range(feather):
                    a = (t + 1) / feather
                    mask.narrow(d, t, 1).mul_(a)
                    mask.narrow(d, mask.shape[d] - 1 - t, 1).mul_(a)
            o, o_d = out, out_div
            for d in range(2):
                o = o.narrow(d + 2, upscaled[d], mask.shape[d + 2])
                o_d = o_d.narrow(d + 2, upscaled[d], mask.shape[d + 2])
            o.add_(ps * mask)
            o_d.add_(mask)
        output[b:b + 1] = out / out_div
    return output


def comfy_upscale(model, scale: int, image: torch.Tensor, tile: int = 512, overlap: int = 32) -> torch.Tensor:
    """ImageUpscaleWithModel.upscale on [B,3,H,W] in [0,1] (no OOM here): tiled_scale, then clamped to [0,1]."""
    with torch.no_grad():
        s = tiled_scale(image, model, tile, tile, overlap, scale)
    return s.clamp(0.0, 1.0)


def a1111_upscale(model, scale: int, u8, out_w: int, out_h: int):
    """A1111's Upscaler.upscale with resize_image's final LANCZOS on 8-bit RGB (H, W, 3): while the image
    is smaller than out_w x out_h on either side, one model pass (at most 3; none for model None, A1111's
    "Lanczos") through ComfyUI's tiling, each pass's output to 8 bits (clip(255 x) truncated); then PIL's
    LANCZOS to the exact size when it differs. The frames' and the hires fix's reference."""
    import numpy as np
    from PIL import Image

    x = torch.from_numpy(u8).permute(2, 0, 1)[None].float() / 255.0
    for _ in range(3 if model is not None else 0):
        if x.shape[3] >= out_w and x.shape[2] >= out_h:
            break
        x = torch.from_numpy(np.clip(255.0 * comfy_upscale(model, scale, x).numpy(), 0, 255).astype(np.uint8)).float()
        x = x / 255.0
    img = (x[0].permute(1, 2, 0).numpy() * 255.0).round().astype(np.uint8)
    if img.shape[:2] != (out_h, out_w):
        img = np.asarray(Image.fromarray(img).resize((out_w, out_h), Image.LANCZOS))
    return img
