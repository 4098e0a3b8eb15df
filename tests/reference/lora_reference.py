"""Reference LoRA fusing for the parity tests: diffusers' own key conversion
(StableDiffusionXLPipeline.lora_state_dict with the UNet config, then
convert_unet_state_dict_to_peft / convert_state_dict_to_diffusers +
convert_state_dict_to_peft, as load_lora_weights does), and peft's fuse math
(LoraLayer.merge: W += scale * lora_B @ lora_A, convs flattened; scale =
alpha / rank * lora_scale) done here in fp32.

Why not load_lora_weights + fuse_lora directly: they need the `peft` package,
which this environment does not have. kohya alphas are folded into the up
factors before the conversion (same product alpha/rank * up @ down), so the
keys alone drive diffusers' mapping.
"""
from __future__ import annotations

import torch
from safetensors.torch import load_file

KOHYA = ("lora_te_", "lora_unet_", "lora_te1_", "lora_te2_")


def _fold_kohya_alpha(raw: dict) -> dict:
    out = {}
    for k, v in raw.items():
        if k.endswith(".alpha"):
            continue
        if k.endswith(".lora_up.weight"):
            base = k[: -len(".lora_up.weight")]
            rank = raw[base + ".lora_down.weight"].shape[0]
            alpha = raw.get(base + ".alpha")
            v = v.float() * (float(alpha.float().item()) / rank if alpha is not None else 1.0)
        out[k] = v
    return out


@torch.no_grad()
def fuse_lora_files(pipe, specs: list[tuple[str, float]], originals: dict | None = None) -> dict:
    """Fuses each (file, weight) into pipe's text encoders and UNet, in place. Returns counts per module.
    originals: when given, each weight's value before its first fuse is kept there (a copy, keyed by the
    weight tensor's id), so restore_originals can undo the fuses exactly."""
    from diffusers import StableDiffusionXLPipeline
    from diffusers.utils.state_dict_utils import (convert_state_dict_to_diffusers, convert_state_dict_to_peft,
                                                  convert_unet_state_dict_to_peft)

    counts: dict[str, int] = {}
    modules = {"unet": pipe.unet, "text_encoder": pipe.text_encoder, "text_encoder_2": pipe.text_encoder_2}
    for path, weight in specs:
        raw = load_file(path)
        if all(k.startswith(KOHYA) for k in raw):
            raw = _fold_kohya_alpha(raw)
        sd, alphas = StableDiffusionXLPipeline.lora_state_dict(raw, unet_config=pipe.unet.config)
        if alphas:
            raise RuntimeError(f"{path}: unexpected network alphas after folding: {list(alphas)[:3]}")
        used = set()
        for prefix, module in modules.items():
            part = {k[len(prefix) + 1:]: v for k, v in sd.items() if k.startswith(prefix + ".")}
            used |= {prefix + "." + k for k in part}
            if not part:
                continue
            if prefix == "unet":
                if "lora_A" not in next(iter(part)):
                    part = convert_unet_state_dict_to_peft(part)
            else:
                part = convert_state_dict_to_peft(convert_state_dict_to_diffusers(part))
                # As diffusers' _load_lora_into_text_encoder: flattened CLIPTextModel has no text_model.
                if not hasattr(module, "text_model"):
                    part = {k.removeprefix("text_model."): v for k, v in part.items()}
            for k, a in part.items():
                if k.endswith(".lora_B.weight"):
                    continue
                if not k.endswith(".lora_A.weight"):
                    raise RuntimeError(f"{path}: key {prefix}.{k} is no lora_A/lora_B factor after conversion")
                mod_path = k[: -len(".lora_A.weight")]
                b = part[mod_path + ".lora_B.weight"]
                w = module.get_submodule(mod_path).weight
                if originals is not None and id(w) not in originals:
                    originals[id(w)] = (w, w.detach().clone())
                delta = (b.to(w.device).float().flatten(1) @ a.to(w.device).float().flatten(1)).view(w.shape)
                w.copy_((w.float() + weight * delta).to(w.dtype))
                counts[prefix] = counts.get(prefix, 0) + 1
        if used != set(sd):
            raise RuntimeError(f"{path}: keys for no module: {sorted(set(sd) - used)[:5]}")
    return counts


@torch.no_grad()
def restore_originals(originals: dict) -> None:
    """Puts back every weight fuse_lora_files(..., originals=) kept, bit for bit, and empties originals."""
    for w, saved in originals.values():
        w.copy_(saved)
    originals.clear()
