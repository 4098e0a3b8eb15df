"""Tiny random SDXL IP-Adapters and ControlNets for a tiny model (export_sdxl.py --tiny-ip-adapter /
--tiny-controlnet DIFFUSERS_DIR): the sources the test fixtures and the example batch export, drawn from
seeded generators, so one seed gives the same bytes everywhere.

IP-Adapters, in the original single-file layout export_sdxl.py --ip-adapter reads, each with its own tiny
CLIP vision encoder. They fit the model (its UNet's cross-attention layers, in diffusers' attn_processors
order, with diffusers' own widths: _convert_ip_adapter_attn_to_diffusers' hidden_size rule), with spreads
large enough that scale 1.0 changes the image visibly and the image tokens depend on the reference image
(not only on biases):
  plain  ImageProjection (4 tokens) on the encoder's image_embeds; encoder: hidden 32, 2 layers,
         image_size 32, patch 8, projection_dim 24
  plus   IPAdapterPlusImageProjection (the Resampler: depth 4, 16 queries, hidden 64 = 1 head of 64, as
         diffusers infers heads = to_q rows // 64) on the encoder's hidden_states[-2]; encoder: hidden 48,
         3 layers, image_size 64, patch 16
Each adapter file is read back by diffusers' own conversion (_convert_ip_adapter_image_proj_to_diffusers):
the projection must come back bit for bit.

ControlNet: ControlNetModel.from_unet of the model's UNet (its encoder copied, as training starts), with
the zero-initialised parts (controlnet_down_blocks, controlnet_mid_block,
controlnet_cond_embedding.conv_out) re-drawn, small enough that the ControlNet changes the image visibly
without blowing it up (PSNR with vs without roughly 15-30 dB on the tiny model).
"""
from __future__ import annotations

import json
import tempfile
from argparse import Namespace
from pathlib import Path
from typing import Callable

import torch

from .common import Job, log, publish
from .inputs import ExportError

PLAIN_ENCODER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                     patch_size=8, projection_dim=24)
PLUS_ENCODER = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, image_size=64,
                    patch_size=16, projection_dim=32)
PLUS_RESAMPLER = dict(hidden_dims=64, depth=4, dim_head=64, heads=1, num_queries=16, ffn_ratio=4)
# --size full (the GPU benchmark): the published adapters' shapes on the full model: ViT-bigG/14 for
# the plain ip-adapter_sdxl, ViT-H/14 and a 1280-wide Resampler (20 heads of 64) for the plus ones.
FULL = dict(
    plain_encoder=dict(hidden_size=1664, intermediate_size=8192, num_hidden_layers=48, num_attention_heads=16,
                       image_size=224, patch_size=14, projection_dim=1280, hidden_act="gelu"),
    plus_encoder=dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=16,
                      image_size=224, patch_size=14, projection_dim=1024, hidden_act="gelu"),
    resampler=dict(hidden_dims=1280, depth=4, dim_head=64, heads=20, num_queries=16, ffn_ratio=4))
TINY = dict(plain_encoder=PLAIN_ENCODER, plus_encoder=PLUS_ENCODER, resampler=PLUS_RESAMPLER)
# Spread of the re-drawn weights: to_k_ip / to_v_ip are KV_STD / sqrt(D) (k, v ~ N(0, KV_STD^2) on
# layer-normed tokens); the plain projection and the encoder's visual projection 1 / sqrt(fan_in).
K_STD, V_STD = 1.5, 3.0


def cross_layers(diffusers_dir: Path) -> tuple[list[int], int]:
    """(hidden_size of each cross-attention processor in attn_processors order, cross_attention_dim),
    by diffusers' rule in _convert_ip_adapter_attn_to_diffusers."""
    from diffusers import UNet2DConditionModel

    cfg = json.loads((diffusers_dir / "unet" / "config.json").read_text())
    with torch.device("meta"):
        unet = UNet2DConditionModel.from_config(cfg)
    blocks = list(unet.config.block_out_channels)
    widths = []
    for name in unet.attn_processors:
        if name.endswith("attn1.processor"):
            continue
        if name.startswith("mid_block"):
            widths.append(blocks[-1])
        elif name.startswith("up_blocks"):
            widths.append(list(reversed(blocks))[int(name[len("up_blocks.")])])
        else:
            widths.append(blocks[int(name[len("down_blocks.")])])
    return widths, int(unet.config.cross_attention_dim)


def encoder(cfg: dict, seed: int):
    """A random CLIPVisionModelWithProjection; its visual projection re-drawn at 1/sqrt(hidden) so
    image_embeds are O(1) and differ between images."""
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    torch.manual_seed(seed)
    enc = CLIPVisionModelWithProjection(CLIPVisionConfig(**cfg)).eval().requires_grad_(False)
    gen = torch.Generator().manual_seed(seed + 1)
    w = enc.visual_projection.weight
    w.data = torch.randn(w.shape, generator=gen) / cfg["hidden_size"] ** 0.5
    return enc


def ip_layers(widths: list[int], cross_dim: int, gen) -> dict[str, torch.Tensor]:
    """ip_adapter.{2i+1}.to_k_ip.weight / to_v_ip.weight [C_i, D]."""
    out = {}
    for i, c in enumerate(widths):
        out[f"ip_adapter.{2 * i + 1}.to_k_ip.weight"] = torch.randn(c, cross_dim, generator=gen) * K_STD / cross_dim ** 0.5
        out[f"ip_adapter.{2 * i + 1}.to_v_ip.weight"] = torch.randn(c, cross_dim, generator=gen) * V_STD / cross_dim ** 0.5
    return out


def plain_adapter(widths, cross_dim: int, embed_dim: int, seed: int) -> dict[str, torch.Tensor]:
    """The original layout of a plain IP-Adapter: image_proj.proj [4D, P] + norm, and the layers."""
    gen = torch.Generator().manual_seed(seed)
    sd = {"image_proj.proj.weight": torch.randn(4 * cross_dim, embed_dim, generator=gen) / embed_dim ** 0.5,
          "image_proj.proj.bias": torch.randn(4 * cross_dim, generator=gen) * 0.1,
          "image_proj.norm.weight": 1.0 + torch.randn(cross_dim, generator=gen) * 0.1,
          "image_proj.norm.bias": torch.randn(cross_dim, generator=gen) * 0.1}
    sd.update(ip_layers(widths, cross_dim, gen))
    return sd


def resampler_original(mod) -> dict[str, torch.Tensor]:
    """IPAdapterPlusImageProjection's state dict -> the original Resampler names (the inverse of diffusers'
    conversion): layers.i.{ln0,ln1} -> layers.i.0.norm{1,2}, attn.to_q -> 0.to_q, attn.to_k + to_v ->
    0.to_kv (rows k then v), attn.to_out.0 -> 0.to_out, ff.0 -> 1.0, ff.1.net.0.proj -> 1.1, ff.1.net.2 -> 1.3."""
    out = {}
    sd = mod.state_dict()
    for k, v in sd.items():
        p = k.split(".")
        if p[0] != "layers":
            out[k] = v
            continue
        i, rest = p[1], ".".join(p[2:])
        table = {"ln0.": "0.norm1.", "ln1.": "0.norm2.", "attn.to_q.": "0.to_q.", "attn.to_out.0.": "0.to_out.",
                 "ff.0.": "1.0.", "ff.1.net.0.proj.": "1.1.", "ff.1.net.2.": "1.3."}
        if rest.startswith("attn.to_k."):
            out[f"layers.{i}.0.to_kv.weight"] = torch.cat([v, sd[f"layers.{i}.attn.to_v.weight"]], 0)
            continue
        if rest.startswith("attn.to_v."):
            continue
        src = next(s for s in table if rest.startswith(s))
        out[f"layers.{i}.{table[src]}{rest[len(src):]}"] = v
    return {k: v.detach().contiguous() for k, v in out.items()}


def plus_adapter(widths, cross_dim: int, embed_dim: int, seed: int, resampler: dict = PLUS_RESAMPLER):
    """(the original layout of a plus IP-Adapter, the diffusers projection module it stands for)."""
    from diffusers.models.embeddings import IPAdapterPlusImageProjection

    torch.manual_seed(seed)
    proj = IPAdapterPlusImageProjection(embed_dims=embed_dim, output_dims=cross_dim, **resampler).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    for name, p in proj.named_parameters():  # norms: around 1 / 0 with some spread, as trained ones
        if ("ln" in name or "norm" in name or ".ff.0." in name) and name.endswith("weight"):
            p.data = 1.0 + torch.randn(p.shape, generator=gen) * 0.1
        elif ("ln" in name or "norm" in name or ".ff.0." in name) and name.endswith("bias"):
            p.data = torch.randn(p.shape, generator=gen) * 0.1
    sd = {"image_proj." + k: v for k, v in resampler_original(proj).items()}
    sd.update(ip_layers(widths, cross_dim, gen))
    return sd, proj


def read_back(sd: dict[str, torch.Tensor]):
    """diffusers' conversion of the file's image_proj group (what load_ip_adapter builds)."""
    from diffusers.loaders.unet import UNet2DConditionLoadersMixin

    proj = {k.removeprefix("image_proj."): v for k, v in sd.items() if k.startswith("image_proj.")}
    return UNet2DConditionLoadersMixin._convert_ip_adapter_image_proj_to_diffusers(None, proj, low_cpu_mem_usage=False)


def max_diff(a: dict, b: dict) -> float:
    if set(a) != set(b):
        raise ExportError(f"the read-back has other tensors: {sorted(set(a) ^ set(b))[:4]}")
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def write_ip_adapters(diffusers_dir: Path, out: Path, seed: int, size: str = "tiny", variants=("plain", "plus")) -> dict:
    """out/<variant>/ip-adapter-<variant>.safetensors + out/<variant>/image_encoder/ for each variant; the
    info (shapes, and each file read back by diffusers' conversion: read_back_max_abs_diff must be 0)."""
    from safetensors.torch import save_file

    shapes = FULL if size == "full" else TINY
    widths, cross_dim = cross_layers(diffusers_dir)
    out.mkdir(parents=True, exist_ok=True)
    info = {"seed": seed, "size": size, "layers": len(widths), "cross_attention_dim": cross_dim}
    made = []
    if "plain" in variants:
        plain_enc = encoder(shapes["plain_encoder"], seed)
        plain = plain_adapter(widths, cross_dim, shapes["plain_encoder"]["projection_dim"], seed + 10)
        made.append(("plain", plain_enc, plain))
    if "plus" in variants:
        plus_enc = encoder(shapes["plus_encoder"], seed + 20)
        plus, plus_proj = plus_adapter(widths, cross_dim, shapes["plus_encoder"]["hidden_size"], seed + 30,
                                       shapes["resampler"])
        made.append(("plus", plus_enc, plus))
    for name, enc, sd in made:
        (out / name).mkdir(exist_ok=True)
        if size == "full":
            enc.half()  # the published encoders' files are fp16 too
        enc.save_pretrained(str(out / name / "image_encoder"), safe_serialization=True)
        save_file(sd, str(out / name / f"ip-adapter-{name}.safetensors"), metadata={"name": f"tiny-ip-adapter-{name}"})
        info[name] = {"tensors": len(sd), "parameters": sum(v.numel() for v in sd.values())}
    if "plain" in variants:
        got = read_back(plain).state_dict()
        want = {"image_embeds.weight": plain["image_proj.proj.weight"], "image_embeds.bias": plain["image_proj.proj.bias"],
                "norm.weight": plain["image_proj.norm.weight"], "norm.bias": plain["image_proj.norm.bias"]}
        info["plain"]["read_back_max_abs_diff"] = max_diff(want, got)
    if "plus" in variants:
        info["plus"]["read_back_max_abs_diff"] = max_diff(plus_proj.state_dict(), read_back(plus).state_dict())
    return info


ZERO_PARTS = ("controlnet_down_blocks.", "controlnet_mid_block.", "controlnet_cond_embedding.conv_out.")
# Standard deviation of the re-drawn zero-initialised weights (biases: a tenth of it).
RESIDUAL_STD = 0.5
COND_OUT_STD = 0.4


def build(diffusers_dir: Path, seed: int, std_scale: float = 1.0):
    """from_unet of the UNet (seeded: the conditioning embedding is drawn at random), then
    the zero-initialised parts re-drawn from a generator of `seed` (their spread times std_scale)."""
    from diffusers import ControlNetModel, UNet2DConditionModel

    unet = UNet2DConditionModel.from_pretrained(str(diffusers_dir / "unet"), dtype=torch.float32,
                                                local_files_only=True, low_cpu_mem_usage=False)
    torch.manual_seed(seed)
    cn = ControlNetModel.from_unet(unet).eval().requires_grad_(False)
    gen = torch.Generator().manual_seed(seed + 1000)
    for name, p in cn.named_parameters():
        if name.startswith(ZERO_PARTS):
            std = COND_OUT_STD if name.startswith("controlnet_cond_embedding.") else RESIDUAL_STD
            std = (std / 10 if name.endswith("bias") else std) * std_scale
            p.data = torch.randn(p.shape, generator=gen) * std
    return cn


def write_controlnet(diffusers_dir: Path, out: Path, seed: int, std_scale: float = 1.0):
    """out/diffusers/ (save_pretrained, safetensors); the ControlNet module."""
    cn = build(diffusers_dir, seed, std_scale)
    out.mkdir(parents=True, exist_ok=True)
    cn.save_pretrained(str(out / "diffusers"), safe_serialization=True)
    return cn


def export_drawn(a: Namespace, job: Job, export: Callable[[Namespace, Job], int]) -> int:
    """--tiny-ip-adapter / --tiny-controlnet DIFFUSERS_DIR: the sources drawn (--source-only: into --out, the
    test fixtures' layout, and nothing exported), else into a temporary folder that `export` (the kind's,
    ip_adapter's or controlnet's) reads as --ip-adapter (the plain adapter) or --controlnet."""
    diffusers_dir = Path(a.tiny_ip_adapter or a.tiny_controlnet).resolve()  # cli.check_inputs checked it
    if a.source_only:
        info = write_sources(a, diffusers_dir, job.tmp)
        publish(job.tmp, job.out)
        print(json.dumps(info))
        return 0
    with tempfile.TemporaryDirectory(prefix=".tiny-src-", dir=job.out.parent) as tmp:
        write_sources(a, diffusers_dir, Path(tmp))
        if a.tiny_ip_adapter:
            plain = Path(tmp) / "plain"
            a.ip_adapter, a.image_encoder = str(plain / "ip-adapter-plain.safetensors"), str(plain / "image_encoder")
        else:
            a.controlnet = str(Path(tmp) / "diffusers")
        return export(a, job)


def write_sources(a: Namespace, diffusers_dir: Path, out: Path) -> dict:
    """The sources into out (the adapters of --ip-variants, only the plain one unless --source-only; or the
    ControlNet's diffusers/), read back; their info."""
    if a.tiny_ip_adapter:
        variants = a.ip_variants if a.source_only else ["plain"]
        info = write_ip_adapters(diffusers_dir, out, a.seed, a.ip_size, variants)
        if any(info[v]["read_back_max_abs_diff"] != 0.0 for v in variants):
            raise ExportError(f"diffusers' conversion does not read the original layout back exactly: {info}")
    else:
        write_controlnet(diffusers_dir, out, a.seed, a.std_scale)
        info = {"seed": a.seed, "std_scale": a.std_scale}
    log(f"tiny {'ip-adapter' if a.tiny_ip_adapter else 'controlnet'} sources in {out}: {json.dumps(info)}")
    return info
