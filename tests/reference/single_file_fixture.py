"""Single-file checkpoints for the tests, written from a diffusers pipeline.

The inverse of the layout conversion diffusers' from_single_file reads: a diffusers
SDXL pipeline -> one .safetensors file in the original Stability layout
(model.diffusion_model.*, first_stage_model.*, conditioner.embedders.0.transformer.*,
conditioner.embedders.1.model.* with OpenCLIP's fused attention and transposed
text_projection). Written from the block structure in the configs, so the tiny model
(other widths and depths than SDXL base) converts too; `write` checks each file by
loading it back with diffusers' from_single_file and comparing every tensor.

  python -m reference.single_file_fixture --out DIR --tokenizers TINY_DIFFUSERS [--dtype fp16]
  python -m reference.single_file_fixture --out DIR --from-diffusers DIR   (the checkpoint only)

DIR gets: diffusers/ (the pipeline, also the --config folder), checkpoint.safetensors,
vae.safetensors (a second VAE, bare original layout), vae-diffusers/ (the same VAE as a
diffusers folder) and the bad files: sd1, refiner, truncated, missing-tensor,
channels8 (a UNet of 8 input channels: neither SDXL base's 4 nor an inpainting UNet's 9), lora
and flux (.safetensors).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from reference.architecture import sdxl_configs

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
RESNET = (("norm1", "in_layers.0"), ("conv1", "in_layers.2"), ("norm2", "out_layers.0"),
          ("conv2", "out_layers.3"), ("time_emb_proj", "emb_layers.1"), ("conv_shortcut", "skip_connection"))
UNET_TOP = {"time_embedding.linear_1": "time_embed.0", "time_embedding.linear_2": "time_embed.2",
            "conv_in": "input_blocks.0.0", "conv_norm_out": "out.0", "conv_out": "out.2",
            "add_embedding.linear_1": "label_emb.0.0", "add_embedding.linear_2": "label_emb.0.2"}


def _sub(rest: str, pairs) -> str:
    for new, old in pairs:
        if rest.startswith(new + "."):
            return old + rest[len(new):]
    return rest


def unet_key(k: str, cfg: dict) -> str:
    """diffusers UNet2DConditionModel key -> original (LDM) key, without the prefix."""
    lpb = cfg["layers_per_block"]
    p = k.split(".")
    top = ".".join(p[:2]) if p[0] in ("time_embedding", "add_embedding") else p[0]
    if top in UNET_TOP:
        return UNET_TOP[top] + k[len(top):]
    if p[0] == "down_blocks":
        b, kind, i, rest = int(p[1]), p[2], int(p[3]), ".".join(p[4:])
        if kind == "resnets":
            return f"input_blocks.{1 + b * (lpb + 1) + i}.0.{_sub(rest, RESNET)}"
        if kind == "attentions":
            return f"input_blocks.{1 + b * (lpb + 1) + i}.1.{rest}"
        return f"input_blocks.{(b + 1) * (lpb + 1)}.0.op.{rest.removeprefix('conv.')}"
    if p[0] == "mid_block":
        i, rest = int(p[2]), ".".join(p[3:])
        if p[1] == "resnets":
            return f"middle_block.{2 * i}.{_sub(rest, RESNET)}"
        return f"middle_block.1.{rest}"
    if p[0] == "up_blocks":
        b, kind, i, rest = int(p[1]), p[2], int(p[3]), ".".join(p[4:])
        n = lpb + 1
        if kind == "resnets":
            return f"output_blocks.{b * n + i}.0.{_sub(rest, RESNET)}"
        if kind == "attentions":
            return f"output_blocks.{b * n + i}.1.{rest}"
        has_attn = cfg["up_block_types"][b].startswith("CrossAttn")
        return f"output_blocks.{b * n + lpb}.{2 if has_attn else 1}.{rest}"
    raise KeyError(f"no original name for UNet key {k}")


VAE_ATTN = (("group_norm", "norm"), ("to_q", "q"), ("to_k", "k"), ("to_v", "v"), ("to_out.0", "proj_out"))


def vae_key(k: str, cfg: dict) -> str:
    """diffusers AutoencoderKL key -> original key (bare, without first_stage_model.)."""
    n_up = len(cfg["up_block_types"])
    p = k.split(".")
    side = p[0]
    if len(p) > 1 and p[1] == "conv_norm_out":
        return f"{side}.norm_out.{'.'.join(p[2:])}"
    if len(p) > 1 and p[1] == "down_blocks":
        i, kind, rest = int(p[2]), p[3], ".".join(p[5:])
        if kind == "resnets":
            return f"encoder.down.{i}.block.{p[4]}.{rest.replace('conv_shortcut', 'nin_shortcut')}"
        return f"encoder.down.{i}.downsample.{rest}"
    if len(p) > 1 and p[1] == "up_blocks":
        i, kind, rest = int(p[2]), p[3], ".".join(p[5:])
        if kind == "resnets":
            return f"decoder.up.{n_up - 1 - i}.block.{p[4]}.{rest.replace('conv_shortcut', 'nin_shortcut')}"
        return f"decoder.up.{n_up - 1 - i}.upsample.{rest}"
    if len(p) > 1 and p[1] == "mid_block":
        if p[2] == "resnets":
            return f"{side}.mid.block_{int(p[3]) + 1}.{'.'.join(p[4:]).replace('conv_shortcut', 'nin_shortcut')}"
        return f"{side}.mid.attn_1.{_sub('.'.join(p[4:]), VAE_ATTN)}"
    return k  # conv_in / conv_out / quant_conv / post_quant_conv keep their names


def vae_to_original(vae) -> dict[str, torch.Tensor]:
    cfg = dict(vae.config)
    out = {}
    for k, v in vae.state_dict().items():
        ok = vae_key(k, cfg)
        if ".mid.attn_1." in ok and ok.endswith("weight") and v.ndim == 2:
            v = v[:, :, None, None]  # the original attention is made of 1x1 convolutions
        out[ok] = v
    return out


def open_clip_keys(te2) -> dict[str, torch.Tensor]:
    """CLIPTextModelWithProjection -> OpenCLIP's text tower names (fused q/k/v)."""
    sd = te2.state_dict()
    out = {"positional_embedding": sd["text_model.embeddings.position_embedding.weight"],
           "token_embedding.weight": sd["text_model.embeddings.token_embedding.weight"],
           "ln_final.weight": sd["text_model.final_layer_norm.weight"],
           "ln_final.bias": sd["text_model.final_layer_norm.bias"],
           "text_projection": sd["text_projection.weight"].T.contiguous(),
           "logit_scale": torch.tensor(4.6052)}
    for i in range(te2.config.num_hidden_layers):
        src, dst = f"text_model.encoder.layers.{i}.", f"transformer.resblocks.{i}."
        for t in ("weight", "bias"):
            out[dst + f"attn.in_proj_{t}"] = torch.cat([sd[src + f"self_attn.{q}_proj.{t}"] for q in "qkv"])
            out[dst + f"attn.out_proj.{t}"] = sd[src + f"self_attn.out_proj.{t}"]
            out[dst + f"ln_1.{t}"] = sd[src + f"layer_norm1.{t}"]
            out[dst + f"ln_2.{t}"] = sd[src + f"layer_norm2.{t}"]
            out[dst + f"mlp.c_fc.{t}"] = sd[src + f"mlp.fc1.{t}"]
            out[dst + f"mlp.c_proj.{t}"] = sd[src + f"mlp.fc2.{t}"]
    return out


def pipeline_to_original(pipe, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    ucfg = dict(pipe.unet.config)
    out = {"model.diffusion_model." + unet_key(k, ucfg): v for k, v in pipe.unet.state_dict().items()}
    out.update({"first_stage_model." + k: v for k, v in vae_to_original(pipe.vae).items()})
    for k, v in pipe.text_encoder.state_dict().items():
        if k.endswith("position_ids"):
            continue
        name = k if k.startswith("text_model.") else "text_model." + k
        out["conditioner.embedders.0.transformer." + name] = v
    out.update({"conditioner.embedders.1.model." + k: v for k, v in open_clip_keys(pipe.text_encoder_2).items()})
    return {k: v.detach().to(dtype).contiguous() for k, v in out.items()}


def build_pipeline(seed: int):
    """The tiny test architecture with a wider second text encoder (48 vs 32: two encoders of
    one width would let a loader mix them up unseen)."""
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    c = sdxl_configs("tiny")
    te2 = dict(c["text_encoder_2"])
    unet = dict(c["unet"])
    te2.update(hidden_size=48, projection_dim=48, intermediate_size=96)
    unet.update(cross_attention_dim=c["text_encoder"]["hidden_size"] + 48,
                projection_class_embeddings_input_dim=6 * unet["addition_time_embed_dim"] + 48)
    torch.manual_seed(seed)
    parts = dict(text_encoder=CLIPTextModel(CLIPTextConfig(**c["text_encoder"])),
                 text_encoder_2=CLIPTextModelWithProjection(CLIPTextConfig(**te2)),
                 unet=UNet2DConditionModel(**unet), vae=AutoencoderKL(**c["vae"]))
    for m in parts.values():
        m.eval().requires_grad_(False)
    return parts, EulerDiscreteScheduler(**c["scheduler"]), c


def round_to(parts: dict, dtype: torch.dtype) -> None:
    """Round every weight through `dtype` in place, so a file in `dtype` holds them exactly."""
    for m in parts.values():
        for t in list(m.parameters()) + list(m.buffers()):
            if t.is_floating_point():
                t.data = t.data.to(dtype).float()


def save_pipeline(parts: dict, scheduler, tokenizers: Path, dst: Path):
    """The diffusers folder of `parts`, with the tokenizers of `tokenizers` (a diffusers folder)."""
    from diffusers import StableDiffusionXLPipeline
    from transformers import CLIPTokenizer

    toks = [CLIPTokenizer.from_pretrained(str(tokenizers / sub)) for sub in ("tokenizer", "tokenizer_2")]
    pipe = StableDiffusionXLPipeline(**parts, tokenizer=toks[0], tokenizer_2=toks[1], scheduler=scheduler,
                                     force_zeros_for_empty_prompt=True, add_watermarker=False)
    pipe.save_pretrained(str(dst), safe_serialization=True)
    return pipe


def check_with_diffusers(ckpt: Path, config_dir: Path, pipe) -> float:
    """diffusers' own from_single_file reads `ckpt` back: the largest difference of any tensor."""
    from diffusers import StableDiffusionXLPipeline

    back = StableDiffusionXLPipeline.from_single_file(str(ckpt), config=str(config_dir), local_files_only=True,
                                                      dtype=torch.float32)
    worst = 0.0
    for name in ("unet", "vae", "text_encoder", "text_encoder_2"):
        want, got = getattr(pipe, name).state_dict(), getattr(back, name).state_dict()
        if set(want) != set(got):
            raise SystemExit(f"{name}: from_single_file gives other tensors: {sorted(set(want) ^ set(got))[:4]}")
        worst = max(worst, max(float((want[k].float() - got[k].float()).abs().max()) for k in want))
    return worst


def write_bad_files(good: dict[str, torch.Tensor], ckpt: Path, out: Path) -> None:
    """Files export_sdxl.py must refuse: an SD 1.x layout, a refiner layout, a truncated
    file, the good checkpoint less one UNet tensor, a UNet of 8 input channels, a LoRA and a
    Flux-shaped file."""
    from safetensors.torch import save_file

    unet = {k: v for k, v in good.items() if k.startswith("model.diffusion_model.")}
    sd1 = {k: v for k, v in unet.items() if ".label_emb." not in k}
    sd1.update({k.replace("conditioner.embedders.0.", "cond_stage_model."): v
                for k, v in good.items() if k.startswith("conditioner.embedders.0.")})
    save_file(sd1, str(out / "sd1.safetensors"))
    refiner = dict(unet)
    refiner.update({k.replace("conditioner.embedders.1.", "conditioner.embedders.0."): v
                    for k, v in good.items() if k.startswith("conditioner.embedders.1.")})
    save_file(refiner, str(out / "refiner.safetensors"))
    data = ckpt.read_bytes()
    (out / "truncated.safetensors").write_bytes(data[: len(data) * 2 // 3])
    missing = dict(good)
    del missing["model.diffusion_model.input_blocks.1.0.in_layers.2.weight"]
    save_file(missing, str(out / "missing-tensor.safetensors"))
    wide = dict(good)  # 8 input channels: no SDXL UNet (4) nor inpainting UNet (9: latents, mask, masked image)
    w = wide["model.diffusion_model.input_blocks.0.0.weight"]
    wide["model.diffusion_model.input_blocks.0.0.weight"] = torch.cat([w, w], dim=1).contiguous()
    save_file(wide, str(out / "channels8.safetensors"))
    z = lambda: torch.zeros(4, 4)  # noqa: E731  (safetensors refuses one tensor under two names)
    save_file({"lora_unet_down_blocks_1_attentions_0_proj_in.lora_down.weight": z(),
               "lora_unet_down_blocks_1_attentions_0_proj_in.lora_up.weight": z()}, str(out / "lora.safetensors"))
    save_file({"double_blocks.0.img_attn.qkv.weight": z(), "img_in.weight": z()}, str(out / "flux.safetensors"))


def write_checkpoint_only(src: Path, out: Path, dtype: torch.dtype) -> int:
    from diffusers import StableDiffusionXLPipeline
    from safetensors.torch import save_file

    pipe = StableDiffusionXLPipeline.from_pretrained(str(src), dtype=dtype, local_files_only=True)
    out.mkdir(parents=True, exist_ok=True)
    sd = pipeline_to_original(pipe, dtype)
    save_file(sd, str(out / "checkpoint.safetensors"))
    print(json.dumps({"tensors": len(sd), "bytes": (out / "checkpoint.safetensors").stat().st_size}))
    return 0


def write(out: Path, tokenizers: Path, dtype: torch.dtype, seed: int) -> dict:
    from diffusers import AutoencoderKL
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    parts, scheduler, c = build_pipeline(seed)
    round_to(parts, dtype)
    pipe = save_pipeline(parts, scheduler, tokenizers, out / "diffusers")
    good = pipeline_to_original(pipe, dtype)
    ckpt = out / "checkpoint.safetensors"
    save_file(good, str(ckpt))
    torch.manual_seed(seed + 1)
    vae2 = AutoencoderKL(**c["vae"]).eval().requires_grad_(False)
    round_to({"vae": vae2}, dtype)
    save_file({k: v.to(dtype).contiguous() for k, v in vae_to_original(vae2).items()}, str(out / "vae.safetensors"))
    vae2.save_pretrained(str(out / "vae-diffusers"), safe_serialization=True)
    save_pipeline(dict(parts, vae=vae2), scheduler, tokenizers, out / "diffusers-vae2")
    write_bad_files(good, ckpt, out)
    diff = check_with_diffusers(ckpt, out / "diffusers", pipe)
    return {"tensors": len(good), "bytes": ckpt.stat().st_size, "from_single_file_max_abs_diff": diff}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizers", help="a diffusers folder whose tokenizer/ and tokenizer_2/ to use")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--from-diffusers", metavar="DIR",
                    help="only write DIR's pipeline as OUT/checkpoint.safetensors (e.g. the full-size export's "
                         "--save-diffusers copy; bench/runtime/models.sh single-file)")
    a = ap.parse_args()
    if a.from_diffusers:
        return write_checkpoint_only(Path(a.from_diffusers), Path(a.out), DTYPES[a.dtype])
    if not a.tokenizers:
        ap.error("--tokenizers is needed to write the test files")
    info = write(Path(a.out), Path(a.tokenizers), DTYPES[a.dtype], a.seed)
    print(json.dumps(info))
    if info["from_single_file_max_abs_diff"] != 0.0:
        print("FAIL: diffusers' from_single_file does not read the file back exactly", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
