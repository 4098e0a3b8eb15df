"""What a single-file checkpoint is, from its safetensors header alone (torch-free): export_sdxl.py
refuses a file of another family (SD 1.x / 2.x, the SDXL refiner, SD3, Flux, a LoRA, a UNet of other
input channels, a lone VAE or UNet) before torch is imported (cli.check_inputs), and again where
checkpoint.py reads it."""
from __future__ import annotations

from pathlib import Path

from .inputs import ExportError, read_header

UNET_PREFIX = "model.diffusion_model."
VAE_PREFIXES = ("first_stage_model.", "vae.")
TE1_PREFIX = "conditioner.embedders.0.transformer."
TE2_PREFIX = "conditioner.embedders.1.model."


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
    if conv_in is not None and len(conv_in) == 4 and conv_in[1] not in (4, 9):
        return f"a UNet with {conv_in[1]} input channels (SDXL base takes 4, an SDXL inpainting UNet 9)"
    if UNET_PREFIX + "label_emb.0.0.weight" not in keys:
        return "a UNet without SDXL's size conditioning (label_emb), not SDXL"
    for prefix, what in ((TE1_PREFIX, "CLIP ViT-L text encoder (conditioner.embedders.0.transformer.*)"),
                         (TE2_PREFIX, "OpenCLIP ViT-bigG text encoder (conditioner.embedders.1.model.*)")):
        if not _has(keys, prefix):
            return f"an SDXL checkpoint without its {what}; export needs both text encoders"
    return None


def check_checkpoint_file(path: Path) -> None:
    """ExportError naming what `path` is when it is not an SDXL base-shaped checkpoint."""
    what = not_sdxl_base(read_header(path))
    if what:
        raise ExportError(f"{path}: {what}")


# The marker keys a v-prediction / zero-terminal-SNR single file carries (empty tensors, as
# NoobAI-XL V-Pred's do; ComfyUI's and A1111's loaders read them).
MARKERS = {"v_pred": "v-prediction", "ztsnr": "zero-terminal-SNR"}


def prediction_settings(a, source: dict, markers: set[str] | None) -> dict:
    """The scheduler settings model.json records: prediction_type and rescale_betas_zero_snr from the
    source (`source`: a diffusers folder's scheduler config, or {}; `markers`: the MARKERS keys a
    single file holds, None for other sources), then --prediction-type and --zero-snr / --no-zero-snr.
    A flag that contradicts a marker is refused (ExportError naming both). With zero-SNR the spacing
    becomes "trailing" (diffusers' recommendation: the first step is then t = 999, where SNR is 0),
    and guidance_rescale defaults to 0.7 with v-prediction (0 otherwise), unless --guidance-rescale."""
    markers = markers or set()
    where = f"--from {a.from_path}"
    if "v_pred" in markers and a.prediction_type == "epsilon":
        raise ExportError(f"--prediction-type epsilon contradicts {where}: the checkpoint holds the 'v_pred' marker "
                          "key (a v-prediction model); drop the flag")
    if "ztsnr" in markers and a.zero_snr is False:
        raise ExportError(f"--no-zero-snr contradicts {where}: the checkpoint holds the 'ztsnr' marker key (trained "
                          "with zero terminal SNR); drop the flag")
    pred = a.prediction_type or ("v_prediction" if "v_pred" in markers else source.get("prediction_type", "epsilon"))
    if pred not in ("epsilon", "v_prediction"):
        raise ExportError(f"{where}: the scheduler's prediction_type '{pred}' is not supported (epsilon, v_prediction)")
    zsnr = a.zero_snr if a.zero_snr is not None else ("ztsnr" in markers or bool(source.get("rescale_betas_zero_snr")))
    rescale = a.guidance_rescale
    if rescale is None:
        rescale = 0.7 if pred == "v_prediction" and zsnr else 0.0
    out = {"prediction_type": pred, "rescale_betas_zero_snr": zsnr, "guidance_rescale": rescale}
    if zsnr:
        out["timestep_spacing"] = "trailing"
    return out


def checkpoint_markers(path: Path) -> set[str]:
    """The MARKERS keys in a single file's header."""
    return set(read_header(path)) & set(MARKERS)
