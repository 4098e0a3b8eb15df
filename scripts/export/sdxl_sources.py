"""Where a model folder's pipeline comes from: random weights (--tiny, --tiny-aoti, --random-full: the
architecture's configs), a diffusers folder or a single-file checkpoint (--from, with --config and
--vae), and the two CLIP tokenizers written beside it."""
from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path

import torch

from .architecture import SDXL_SCHEDULER, architecture, configs_of
from .checkpoint import load_checkpoint, load_vae, vae_weights_file
from .clip_vocab import write_clip_tokenizer
from .common import count_params, log, sha256_file
from .weights import check_finite_module


@contextlib.contextmanager
def build_context(device: str, dtype: torch.dtype):
    """Construct modules directly on `device` in `dtype` (no fp32 CPU copy first)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


def build_random_pipeline(kind: str, device: str, dtype: torch.dtype, seed: int, tok_dir: Path):
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    arch = architecture("full" if kind == "random-full" else kind)
    te1_cfg, te2_cfg, unet_cfg, vae_cfg = (arch[k] for k in ("text_encoder", "text_encoder_2", "unet", "vae"))
    torch.manual_seed(seed)
    if device == "cuda":
        torch.cuda.manual_seed_all(seed)
    t0 = time.time()
    with build_context(device, dtype):
        te1 = CLIPTextModel(CLIPTextConfig(**te1_cfg))
        te2 = CLIPTextModelWithProjection(CLIPTextConfig(**te2_cfg))
        unet = UNet2DConditionModel(**unet_cfg)
        vae = AutoencoderKL(**vae_cfg)
    mods = dict(text_encoder=te1, text_encoder_2=te2, unet=unet, vae=vae)
    for name, m in mods.items():
        if any(p.dtype != dtype or p.device.type != device for p in m.parameters()):
            m.to(device=device, dtype=dtype)
        m.eval().requires_grad_(False)
        log(f"  built {name}: {count_params(m) / 1e6:,.3f} M params ({time.time() - t0:.1f}s)")
    write_clip_tokenizer(tok_dir / "tokenizer", "<|endoftext|>")
    write_clip_tokenizer(tok_dir / "tokenizer_2", "!")
    tok1 = CLIPTokenizer.from_pretrained(str(tok_dir / "tokenizer"))
    tok2 = CLIPTokenizer.from_pretrained(str(tok_dir / "tokenizer_2"))
    sched = EulerDiscreteScheduler(**SDXL_SCHEDULER)
    pipe = StableDiffusionXLPipeline(
        vae=vae, text_encoder=te1, text_encoder_2=te2, tokenizer=tok1, tokenizer_2=tok2, unet=unet,
        scheduler=sched, force_zeros_for_empty_prompt=True, add_watermarker=False,
    )
    return pipe


def load_source(a, device: str, dtype: torch.dtype, tmp: Path):
    """--from DIR|FILE [--config DIR] [--vae FILE|DIR] -> (pipeline, name, source, model.json
    entries naming the files the weights came from)."""
    src = Path(a.from_path).resolve()
    config_dir = Path(a.config).resolve() if a.config else None
    vae_src = Path(a.vae).resolve() if a.vae else None
    meta = {}
    if src.is_dir():
        if config_dir:
            raise SystemExit("--config is for a single-file checkpoint; a diffusers folder has its own configs")
        from diffusers import StableDiffusionXLPipeline

        pipe = StableDiffusionXLPipeline.from_pretrained(str(src), dtype=dtype, local_files_only=True)
        for part in ("text_encoder", "text_encoder_2", "unet", "vae"):
            check_finite_module(getattr(pipe, part), part, src)
        pipe.to(device)
        copy_tokenizers(src, tmp, (pipe.tokenizer.pad_token, pipe.tokenizer_2.pad_token))
        if vae_src:
            pipe.register_modules(vae=load_vae(vae_src, dict(pipe.vae.config), device, dtype, log))
    elif src.is_file():
        configs = configs_of(config_dir)
        parts = load_checkpoint(src, configs, device, dtype, need_vae=vae_src is None, log=log)
        from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline
        from transformers import CLIPTokenizer

        copy_tokenizers(config_dir, tmp, tokenizer_pads(config_dir))
        toks = [CLIPTokenizer.from_pretrained(str(tmp / sub)) for sub in ("tokenizer", "tokenizer_2")]
        vae = load_vae(vae_src, configs["vae"], device, dtype, log) if vae_src else parts["vae"]
        pipe = StableDiffusionXLPipeline(vae=vae, text_encoder=parts["text_encoder"],
                                         text_encoder_2=parts["text_encoder_2"], tokenizer=toks[0], tokenizer_2=toks[1],
                                         unet=parts["unet"], scheduler=EulerDiscreteScheduler.from_config(configs["scheduler"]),
                                         force_zeros_for_empty_prompt=True, add_watermarker=False)
        meta["source_file"] = {"name": src.name, "sha256": sha256_file(src)}
    else:
        raise SystemExit(f"--from {src}: no such file or folder")
    weights = vae_weights_file(vae_src) if vae_src else None
    if weights is not None:
        meta["vae_file"] = {"name": weights.name, "sha256": sha256_file(weights)}
    for m in (pipe.text_encoder, pipe.text_encoder_2, pipe.unet, pipe.vae):
        m.eval().requires_grad_(False)
    name = src.stem if src.is_file() else src.name
    return pipe, name, f"from:{src}" + (f" vae:{vae_src}" if vae_src else ""), meta


def copy_tokenizers(src_dir: Path | None, tmp: Path, pads: tuple[str, str]) -> None:
    """tokenizer/ and tokenizer_2/ in the export: src_dir's vocabulary where it has one,
    else open-clip's (the one SDXL uses)."""
    for sub, pad in zip(("tokenizer", "tokenizer_2"), pads):
        write_clip_tokenizer(tmp / sub, pad)
        for f in ("vocab.json", "merges.txt"):
            if src_dir is not None and (src_dir / sub / f).is_file():
                shutil.copyfile(src_dir / sub / f, tmp / sub / f)
            elif src_dir is not None:
                log(f"  warning: {src_dir / sub / f} missing; using open-clip's {f}")


def tokenizer_pads(config_dir: Path | None) -> tuple[str, str]:
    pads = ["<|endoftext|>", "!"]
    for i, sub in enumerate(("tokenizer", "tokenizer_2")):
        f = config_dir / sub / "special_tokens_map.json" if config_dir else None
        if f is not None and f.is_file():
            pad = json.loads(f.read_text()).get("pad_token", pads[i])
            pads[i] = pad["content"] if isinstance(pad, dict) else pad
    return pads[0], pads[1]

