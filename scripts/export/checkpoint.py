"""Single-file SDXL checkpoints and VAE files for export_sdxl.py --from FILE, --vae and --vae-only.

A single-file checkpoint is one .safetensors file in the original Stability / A1111
layout: model.diffusion_model.* (UNet), first_stage_model.* (VAE),
conditioner.embedders.0.transformer.* (CLIP ViT-L) and conditioner.embedders.1.model.*
(OpenCLIP ViT-bigG). Rules kept here:
  - the file is checked before anything is loaded (inputs.read_header): a truncated file, a pickle, or a
    checkpoint of another family (SD 1.x / 2.x, the SDXL refiner, SD3, Flux, a UNet of
    other input channels than 4 or 9, a LoRA, a lone VAE or UNet) is refused with a message
    naming it;
  - an SDXL inpainting checkpoint (its conv_in takes 9 channels: the latents, the mask and the
    masked image's latents) is an SDXL base-shaped checkpoint whose UNet config gets
    in_channels 9, as diffusers' single-file loader infers it from the same weight;
  - the architecture comes from configs (SDXL base's built-in ones, or --config DIR),
    never from guessing; every tensor each model needs must come from the file with
    the model's shape (modules are built on the meta device and filled by assignment,
    so a tensor that did not arrive cannot hide behind a random initialisation);
  - keys outside the four components (EMA copies, training state) are ignored and
    counted.
The key conversion is diffusers' own (diffusers.loaders.single_file_utils), the one
from_single_file uses.
"""
from __future__ import annotations

from pathlib import Path

import torch

from .checkpoint_family import TE1_PREFIX, TE2_PREFIX, UNET_PREFIX, VAE_PREFIXES, not_sdxl_base
from .inputs import ExportError, read_header
from .weights import check_finite, check_finite_module, fill_module


def unet_in_channels(shapes: dict[str, list[int]]) -> int:
    """The UNet's input channels, from its conv_in weight (4; 9 for an inpainting UNet)."""
    return int(shapes[UNET_PREFIX + "input_blocks.0.0.weight"][1])


def split_components(path: Path, shapes: dict[str, list[int]]) -> dict[str, int]:
    """Count the file's tensors per component; keys of none are ignored (EMA, training state)."""
    counts = {"unet": 0, "vae": 0, "text_encoder": 0, "text_encoder_2": 0, "ignored": 0}
    for k in shapes:
        if k.startswith(UNET_PREFIX):
            counts["unet"] += 1
        elif k.startswith(VAE_PREFIXES):
            counts["vae"] += 1
        elif k.startswith(TE1_PREFIX):
            counts["text_encoder"] += 1
        elif k.startswith(TE2_PREFIX):
            counts["text_encoder_2"] += 1
        else:
            counts["ignored"] += 1
    return counts


def read_checkpoint(path: Path, need_vae: bool, log) -> tuple[dict[str, list[int]], dict[str, torch.Tensor]]:
    """(tensor name -> shape, the tensors) of a single-file checkpoint, after checking that it is an
    SDXL base checkpoint (with its VAE when need_vae) whose weights the export uses are finite. Before
    diffusers is imported (seconds): a refused file is refused at once."""
    from safetensors.torch import load_file

    shapes = read_header(path)
    what = not_sdxl_base(shapes)
    if what:
        raise ExportError(f"{path}: {what}")
    counts = split_components(path, shapes)
    if need_vae and counts["vae"] == 0:
        raise ExportError(f"{path}: the checkpoint holds no VAE weights (first_stage_model.*): "
                          "give a VAE with --vae FILE|DIR")
    log(f"  {path.name}: {len(shapes)} tensors (unet {counts['unet']}, vae {counts['vae']}, text_encoder "
        f"{counts['text_encoder']}, text_encoder_2 {counts['text_encoder_2']}, ignored {counts['ignored']})")
    ckpt = load_file(str(path), device="cpu")
    used = (UNET_PREFIX, TE1_PREFIX, TE2_PREFIX) + (VAE_PREFIXES if need_vae else ())
    check_finite(ckpt, path, [k for k in shapes if k.startswith(used)])
    return shapes, ckpt


def load_checkpoint(path: Path, configs: dict, device: str, dtype: torch.dtype, need_vae: bool, log) -> dict:
    """The four SDXL modules of a single-file checkpoint, built from `configs`
    ({"unet", "vae", "text_encoder", "text_encoder_2"}: diffusers / transformers configs).
    The VAE is None when need_vae is False (another VAE replaces it)."""
    shapes, ckpt = read_checkpoint(path, need_vae, log)
    unet_in = unet_in_channels(shapes)
    if unet_in != configs["unet"].get("in_channels", 4):
        log(f"  {path.name}: the UNet's conv_in takes {unet_in} channels: an inpainting UNet (in_channels {unet_in})")
        configs = dict(configs, unet=dict(configs["unet"], in_channels=unet_in))
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from diffusers.loaders import single_file_utils as sfu
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    with torch.device("meta"):
        unet = UNet2DConditionModel.from_config(configs["unet"])
        te1 = CLIPTextModel(CLIPTextConfig.from_dict(configs["text_encoder"]))
        te2 = CLIPTextModelWithProjection(CLIPTextConfig.from_dict(configs["text_encoder_2"]))
        vae = AutoencoderKL.from_config(configs["vae"]) if need_vae else None
    out = {}
    out["unet"] = fill_module(unet, sfu.convert_ldm_unet_checkpoint(ckpt, unet.config), "the UNet", path,
                              device, dtype)
    te1_sd = sfu.convert_ldm_clip_checkpoint({k: v for k, v in ckpt.items() if k.startswith(TE1_PREFIX)})
    if not any(k.startswith("text_model.") for k in te1.state_dict()):  # transformers 5 drops the prefix
        te1_sd = {k.removeprefix("text_model."): v for k, v in te1_sd.items()}
    out["text_encoder"] = fill_module(te1, te1_sd, "text encoder 1 (CLIP ViT-L)", path, device, dtype)
    te2_sd = sfu.convert_open_clip_checkpoint(te2, ckpt, prefix=TE2_PREFIX)
    out["text_encoder_2"] = fill_module(te2, te2_sd, "text encoder 2 (OpenCLIP ViT-bigG)", path, device, dtype)
    out["vae"] = None
    if need_vae:
        vae_sd = sfu.convert_ldm_vae_checkpoint({k: v for k, v in ckpt.items() if k.startswith(VAE_PREFIXES)},
                                                vae.config)
        out["vae"] = fill_module(vae, vae_sd, "the VAE", path, device, dtype)
    return out


def load_vae(src: Path, vae_config: dict, device: str, dtype: torch.dtype, log):
    """A VAE from a diffusers folder (its own config), or from one .safetensors file in the
    original layout (bare, or inside a full checkpoint) or the diffusers layout (the
    base's VAE config); a file's weights are checked (finite) before diffusers is imported."""
    from safetensors.torch import load_file

    if src.is_dir():
        if not (src / "config.json").is_file():
            raise ExportError(f"--vae {src}: a folder without config.json is not a diffusers VAE folder")
        from diffusers import AutoencoderKL

        vae = AutoencoderKL.from_pretrained(str(src), dtype=dtype, local_files_only=True)
        check_finite_module(vae, "the VAE", src)
        return vae.to(device).eval().requires_grad_(False)
    shapes = read_header(src)
    diffusers_layout = "encoder.down_blocks.0.resnets.0.norm1.weight" in shapes
    original = any(k.endswith("encoder.down.0.block.0.norm1.weight") for k in shapes)
    if not (diffusers_layout or original):
        what = not_sdxl_base(shapes) or "a checkpoint without VAE weights"
        raise ExportError(f"--vae {src}: holds no VAE (encoder/decoder) weights; it is {what}")
    sd = load_file(str(src), device="cpu")
    check_finite(sd, src, [k for k in shapes if k.startswith(VAE_PREFIXES)] or list(shapes))
    from diffusers import AutoencoderKL
    from diffusers.loaders import single_file_utils as sfu

    with torch.device("meta"):
        vae = AutoencoderKL.from_config(vae_config)
    if original:
        sd = sfu.convert_ldm_vae_checkpoint(sd, vae.config)
    log(f"  VAE {src.name}: {len(shapes)} tensors, {'diffusers' if diffusers_layout else 'original'} layout")
    return fill_module(vae, sd, "the VAE", src, device, dtype)


def vae_weights_file(src: Path) -> Path | None:
    """The one weights file a VAE source stands for (its hash is the VAE hash), if there is one."""
    if src.is_file():
        return src
    files = sorted(src.glob("*.safetensors"))
    return files[0] if len(files) == 1 else None
