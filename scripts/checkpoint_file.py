"""Single-file SDXL checkpoints and VAE files for export_sdxl.py.

A single-file checkpoint is one .safetensors file in the original Stability / A1111
layout: model.diffusion_model.* (UNet), first_stage_model.* (VAE),
conditioner.embedders.0.transformer.* (CLIP ViT-L) and conditioner.embedders.1.model.*
(OpenCLIP ViT-bigG). Rules kept here:
  - the file is checked before anything is loaded: a truncated file, a pickle, or a
    checkpoint of another family (SD 1.x / 2.x, the SDXL refiner, SD3, Flux, an
    inpainting UNet, a LoRA, a lone VAE or UNet) is refused with a message naming it;
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

import hashlib
import json
import struct
from pathlib import Path

import torch

UNET_PREFIX = "model.diffusion_model."
VAE_PREFIXES = ("first_stage_model.", "vae.")
TE1_PREFIX = "conditioner.embedders.0.transformer."
TE2_PREFIX = "conditioner.embedders.1.model."
HEADER_MAX = 100 * 2**20


class CheckpointError(SystemExit):
    """A file that cannot become the model asked for; the message names the file and why."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def read_header(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape, from the safetensors header, after checking that the file
    holds every byte the header describes."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: {size} bytes, too short to be a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if head[:2] == b"PK" or head[:1] == b"\x80":
            raise CheckpointError(f"{path}: a pickle (.ckpt/.pt) checkpoint; loading one can run code. "
                                  "Convert it to .safetensors with a tool you trust first")
        if n > min(HEADER_MAX, size - 8):
            raise CheckpointError(f"{path}: not a safetensors file (header length {n} does not fit in {size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: not a safetensors file (header is not JSON: {e})")
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: not a safetensors file (header is not a JSON object)")
    shapes, end = {}, 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            shapes[name] = [int(d) for d in info["shape"]]
            end = max(end, int(info["data_offsets"][1]))
        except (KeyError, TypeError, ValueError, IndexError):
            raise CheckpointError(f"{path}: tensor '{name}' has no valid shape / data_offsets in the header")
    if 8 + n + end > size:
        raise CheckpointError(f"{path}: truncated: the header describes {8 + n + end} bytes, the file has {size} "
                              "(an interrupted download or copy?)")
    return shapes


def _has(keys, prefix: str) -> bool:
    return any(k.startswith(prefix) for k in keys)


def not_sdxl_base(shapes: dict[str, list[int]]) -> str | None:
    """What the file is when it is not an SDXL base-shaped checkpoint, else None."""
    keys = shapes.keys()
    if any(".joint_blocks." in k or k.startswith("joint_blocks.") for k in keys):
        return "an SD3 / SD3.5 checkpoint (MMDiT), not SDXL"
    if any("double_blocks." in k for k in keys):
        return "a Flux checkpoint, not SDXL"
    if any(k.startswith(("lora_unet_", "lora_te")) or ".lora_down." in k or ".lora_A." in k for k in keys):
        return "a LoRA, not a checkpoint (use it with --lora or a task's \"loras\")"
    if _has(keys, "cond_stage_model.transformer."):
        return "an SD 1.x checkpoint (one CLIP ViT-L text encoder), not SDXL"
    if _has(keys, "cond_stage_model.model."):
        return "an SD 2.x checkpoint (one OpenCLIP ViT-H text encoder), not SDXL"
    if _has(keys, "conditioner.embedders.0.model."):
        return "the SDXL refiner (one OpenCLIP text encoder, no CLIP ViT-L), not SDXL base"
    if not _has(keys, UNET_PREFIX):
        if "encoder.down.0.block.0.norm1.weight" in keys or "decoder.conv_in.weight" in keys:
            return "a VAE file, not a checkpoint (give it to --vae)"
        if _has(keys, "down_blocks.") or _has(keys, "unet.down_blocks."):
            return "a diffusers-format component file, not a checkpoint (pass the diffusers folder to --from)"
        prefixes = sorted({k.split(".")[0] for k in keys})[:6]
        return f"not an SDXL checkpoint: no {UNET_PREFIX}* tensors (top-level names: {', '.join(prefixes)})"
    conv_in = shapes.get(UNET_PREFIX + "input_blocks.0.0.weight")
    if conv_in is not None and len(conv_in) == 4 and conv_in[1] != 4:
        what = "an inpainting UNet" if conv_in[1] == 9 else "a UNet"
        return f"{what} with {conv_in[1]} input channels (SDXL base takes 4)"
    if UNET_PREFIX + "label_emb.0.0.weight" not in keys:
        return "a UNet without SDXL's size conditioning (label_emb), not SDXL"
    for prefix, what in ((TE1_PREFIX, "CLIP ViT-L text encoder (conditioner.embedders.0.transformer.*)"),
                         (TE2_PREFIX, "OpenCLIP ViT-bigG text encoder (conditioner.embedders.1.model.*)")):
        if not _has(keys, prefix):
            return f"an SDXL checkpoint without its {what}; export needs both text encoders"
    return None


def _materialise_position_ids(module: torch.nn.Module, device: str) -> None:
    """CLIP's position_ids is a non-persistent buffer (no file holds it): make it on `device`."""
    for name, buf in list(module.named_buffers()):
        if buf.device.type != "meta":
            continue
        if not name.endswith("position_ids"):
            raise CheckpointError(f"internal: buffer {name} has no value after loading")
        owner = module.get_submodule(name.rsplit(".", 1)[0]) if "." in name else module
        owner.register_buffer("position_ids", torch.arange(buf.shape[-1], device=device).expand(buf.shape),
                              persistent=False)


def fill_module(module: torch.nn.Module, sd: dict[str, torch.Tensor], label: str, src: Path,
                device: str, dtype: torch.dtype) -> torch.nn.Module:
    """Assign `sd` to a module built on the meta device: every parameter must arrive with
    its shape; a tensor the module does not have is an error too (a wider or deeper model)."""
    want = module.state_dict()
    missing = sorted(set(want) - set(sd))
    extra = sorted(k for k in set(sd) - set(want) if not k.endswith("position_ids"))
    wrong = sorted(k for k in set(want) & set(sd) if list(want[k].shape) != list(sd[k].shape))
    if missing or extra or wrong:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
        if wrong:
            k = wrong[0]
            parts.append(f"{len(wrong)} of another shape (e.g. {k}: file {list(sd[k].shape)}, "
                         f"model {list(want[k].shape)})")
        if extra:
            parts.append(f"{len(extra)} the model does not have (e.g. {', '.join(extra[:3])})")
        hint = (" A model of another shape needs --config DIR with its configs" if wrong or extra
                else " The file is incomplete or was written by a tool that renamed them")
        raise CheckpointError(f"{src}: {label} does not fit the architecture: {'; '.join(parts)}.{hint}")
    sd = {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype) for k, v in sd.items() if k in want}
    module.load_state_dict(sd, strict=True, assign=True)
    _materialise_position_ids(module, device)
    return module.eval().requires_grad_(False)


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


def load_checkpoint(path: Path, configs: dict, device: str, dtype: torch.dtype, need_vae: bool, log) -> dict:
    """The four SDXL modules of a single-file checkpoint, built from `configs`
    ({"unet", "vae", "text_encoder", "text_encoder_2"}: diffusers / transformers configs).
    The VAE is None when need_vae is False (another VAE replaces it)."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from diffusers.loaders import single_file_utils as sfu
    from safetensors.torch import load_file
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    shapes = read_header(path)
    what = not_sdxl_base(shapes)
    if what:
        raise CheckpointError(f"{path}: {what}")
    counts = split_components(path, shapes)
    if need_vae and counts["vae"] == 0:
        raise CheckpointError(f"{path}: the checkpoint holds no VAE weights (first_stage_model.*): "
                              "give a VAE with --vae FILE|DIR")
    log(f"  {path.name}: {len(shapes)} tensors (unet {counts['unet']}, vae {counts['vae']}, text_encoder "
        f"{counts['text_encoder']}, text_encoder_2 {counts['text_encoder_2']}, ignored {counts['ignored']})")
    ckpt = load_file(str(path), device="cpu")
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
    base's VAE config)."""
    from diffusers import AutoencoderKL
    from diffusers.loaders import single_file_utils as sfu
    from safetensors.torch import load_file

    if src.is_dir():
        if not (src / "config.json").is_file():
            raise CheckpointError(f"--vae {src}: a folder without config.json is not a diffusers VAE folder")
        vae = AutoencoderKL.from_pretrained(str(src), dtype=dtype, local_files_only=True)
        return vae.to(device).eval().requires_grad_(False)
    shapes = read_header(src)
    diffusers_layout = "encoder.down_blocks.0.resnets.0.norm1.weight" in shapes
    original = any(k.endswith("encoder.down.0.block.0.norm1.weight") for k in shapes)
    if not (diffusers_layout or original):
        what = not_sdxl_base(shapes) or "a checkpoint without VAE weights"
        raise CheckpointError(f"--vae {src}: holds no VAE (encoder/decoder) weights; it is {what}")
    with torch.device("meta"):
        vae = AutoencoderKL.from_config(vae_config)
    sd = load_file(str(src), device="cpu")
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
