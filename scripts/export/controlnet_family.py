"""What an export_sdxl.py --controlnet source is, from its config.json and safetensors headers alone
(torch-free): a source that is not an SDXL ControlNet of the layouts controlnet.py reads is refused
with a message naming it, before torch is imported (cli.check_inputs) and again where controlnet.py
loads it."""
from __future__ import annotations

import json
from pathlib import Path

from .inputs import ExportError, read_header

LDM_PREFIX = "control_model."
# diffusers' class, and the name xinsir's own config.json gives it.
UNION_CLASSES = ("ControlNetUnionModel", "ControlNetModel_Union")
UNION_KEYS = ("task_embedding", "control_type_proj.", "control_add_embedding.", "transformer_layes.",
              "spatial_ch_projs.")


def _any(keys, pred) -> bool:
    return any(pred(k) for k in keys)


def what_else(shapes: dict[str, list[int]]) -> str | None:
    """What a file is when it is no ControlNet of the layouts read here, else None."""
    keys = list(shapes)
    if _any(keys, lambda k: k.startswith("lllite_")):
        return "a ControlLLLite file (kohya's lllite_unet_* modules), not a ControlNet; not supported"
    if "lora_controlnet" in shapes or _any(keys, lambda k: k.endswith((".up", ".down"))):
        return "a Control-LoRA (Stability's low-rank ControlNet), not a full ControlNet; not supported"
    if _any(keys, lambda k: k.startswith(("lora_unet_", "lora_te")) or ".lora_down." in k or ".lora_A." in k):
        return "a LoRA, not a ControlNet (use it with --lora or a task's \"loras\")"
    if _any(keys, lambda k: k.startswith("adapter.") or (k.startswith("body.") and ".block1." in k)):
        return "a T2I-Adapter, not a ControlNet; not supported"
    if is_union(shapes) and not diffusers_layout(shapes):
        return "a Union ControlNet (ControlNetUnionModel) without diffusers' keys (controlnet_cond_embedding.*); " \
               "only xinsir's diffusers layout is read"
    if _any(keys, lambda k: "ctrl_to_base" in k or "base_to_ctrl" in k):
        return "a ControlNet-XS adapter, not a ControlNet; not supported"
    if _any(keys, lambda k: k.startswith(("model.diffusion_model.", "first_stage_model.", "conditioner."))):
        return "a whole checkpoint (model.diffusion_model.* / first_stage_model.*), not a ControlNet"
    if not (diffusers_layout(shapes) or ldm_layout(shapes)):
        prefixes = sorted({k.split(".")[0] for k in keys})[:6]
        return f"not a ControlNet (no controlnet_cond_embedding.* or input_hint_block.* tensors; top-level " \
               f"names: {', '.join(prefixes)})"
    return not_sdxl(shapes)


def is_union(shapes) -> bool:
    """A Union ControlNet (xinsir's controlnet-union-sdxl-1.0 / ProMax: task_embedding, transformer_layes.*)."""
    return _any(list(shapes), lambda k: k.startswith(UNION_KEYS))


def diffusers_layout(shapes) -> bool:
    return "controlnet_cond_embedding.conv_in.weight" in shapes


def ldm_layout(shapes) -> bool:
    return "input_hint_block.0.weight" in shapes or LDM_PREFIX + "input_hint_block.0.weight" in shapes


def _context_dim(shapes) -> int | None:
    for k, shp in shapes.items():
        if k.endswith("attn2.to_k.weight") and len(shp) == 2:
            return shp[1]
    return None


def not_sdxl(shapes) -> str | None:
    """An SD 1.x / 2.x ControlNet (no SDXL size conditioning, 768 / 1024 wide text context)."""
    sdxl_key = ("add_embedding.linear_1.weight", "label_emb.0.0.weight", LDM_PREFIX + "label_emb.0.0.weight")
    ctx = _context_dim(shapes)
    if any(k in shapes for k in sdxl_key):
        return None
    family = {768: "an SD 1.x ControlNet (text context 768)", 1024: "an SD 2.x ControlNet (text context 1024)"}
    return family.get(ctx, f"a ControlNet without SDXL's size conditioning (text context {ctx})") + ", not SDXL"


def config_not_sdxl(cfg: dict, where: str) -> None:
    """Refuses a ControlNet config that is not an SDXL ControlNet (plain or Union)."""
    if cfg.get("_class_name") not in (None, "ControlNetModel", *UNION_CLASSES):
        raise ExportError(f"{where}: a {cfg['_class_name']}, not a ControlNetModel or ControlNetUnionModel")
    if cfg.get("addition_embed_type") != "text_time":
        ctx = cfg.get("cross_attention_dim")
        family = {768: "an SD 1.x ControlNet", 1024: "an SD 2.x ControlNet"}.get(ctx, "a ControlNet")
        raise ExportError(f"{where}: {family} (cross_attention_dim {ctx}, no addition_embed_type text_time), "
                          "not SDXL")


def folder_weights(src: Path) -> list[Path]:
    """The safetensors files of a diffusers ControlNet folder (one file, or the shards of its index)."""
    for name in ("diffusion_pytorch_model.safetensors.index.json", "diffusion_pytorch_model.fp16.safetensors.index.json"):
        if (src / name).is_file():
            shards = sorted(set(json.loads((src / name).read_text())["weight_map"].values()))
            return [src / s for s in shards]
    for name in ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.fp16.safetensors"):
        if (src / name).is_file():
            return [src / name]
    files = sorted(src.glob("*.safetensors"))
    if len(files) == 1:
        return files
    if list(src.glob("*.bin")):
        raise ExportError(f"{src}: only pickle (.bin) weights; loading one can run code. Convert it to "
                          ".safetensors with a tool you trust first")
    raise ExportError(f"{src}: no diffusion_pytorch_model.safetensors (found {len(files)} .safetensors files)")


def classify(src: Path, config: str | None) -> tuple[dict | None, list[Path], dict[str, list[int]]]:
    """(the folder's config or None for a single file, its safetensors files, tensor name -> shape) of
    --controlnet `src`, after refusing what is not an SDXL ControlNet (ExportError naming it)."""
    if src.is_dir():
        if config:
            raise ExportError("--config is for a single-file ControlNet; a diffusers folder has its own config.json")
        if not (src / "config.json").is_file():
            raise ExportError(f"{src}: a folder without config.json is not a diffusers ControlNet folder")
        cfg = json.loads((src / "config.json").read_text())
        config_not_sdxl(cfg, str(src))
        files = folder_weights(src)
    elif src.is_file():
        cfg, files = None, [src]
    else:
        raise ExportError(f"--controlnet {src}: no such file or folder")
    shapes = {}
    for f in files:
        shapes.update(read_header(f))
    what = what_else(shapes)
    if what:
        raise ExportError(f"{src}: {what}")
    return cfg, files, shapes
