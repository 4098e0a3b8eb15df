"""What an export_sdxl.py --ip-adapter file is, from its safetensors header alone (torch-free): a file
that is no plain / plus SDXL IP-Adapter (FaceID, full-face, SD 1.x / 2.x, a LoRA, a ControlNet, a
checkpoint, missing layer tensors) is refused with a message naming it, before torch is imported
(cli.check_inputs) and again where ip_adapter.py loads it."""
from __future__ import annotations

import re
from pathlib import Path

from .inputs import ExportError, read_header

LAYER_KEY = re.compile(r"^ip_adapter\.(\d+)\.to_([kv])_ip\.weight$")
SD_FAMILIES = {768: "an SD 1.x IP-Adapter (text context 768)", 1024: "an SD 2.x IP-Adapter (text context 1024)"}


def _any(keys, pred) -> bool:
    return any(pred(k) for k in keys)


def what_else(shapes: dict[str, list[int]]) -> str | None:
    """What a file is when it is no plain / plus IP-Adapter of the layout read here, else None."""
    keys = list(shapes)
    proj = {k.removeprefix("image_proj."): v for k, v in shapes.items() if k.startswith("image_proj.")}
    if _any(keys, lambda k: k.startswith("ip_adapter.") and "_lora." in k) or \
            "perceiver_resampler.proj_in.weight" in proj or ("norm.weight" in proj and "proj.0.weight" in proj):
        return "an IP-Adapter FaceID (face ID embeddings from insightface, no CLIP image encoder, LoRA weights); " \
               "not supported"
    if "proj.3.weight" in proj:
        return "an IP-Adapter full-face (IPAdapterFullImageProjection, 257 tokens); not supported"
    if _any(keys, lambda k: k.startswith(("lora_unet_", "lora_te")) or ".lora_down." in k or ".lora_A." in k):
        return "a LoRA, not an IP-Adapter (use it with --lora or a task's \"loras\")"
    if _any(keys, lambda k: k.startswith(("controlnet_cond_embedding.", "input_hint_block.", "control_model."))):
        return "a ControlNet, not an IP-Adapter (export it with --controlnet)"
    if _any(keys, lambda k: k.startswith(("model.diffusion_model.", "first_stage_model.", "conditioner."))):
        return "a whole checkpoint (model.diffusion_model.* / first_stage_model.*), not an IP-Adapter"
    if not proj or not _any(keys, lambda k: LAYER_KEY.match(k)):
        prefixes = sorted({k.split(".")[0] for k in keys})[:6]
        return f"not an IP-Adapter (no image_proj.* and ip_adapter.N.to_k_ip.weight tensors; top-level names: " \
               f"{', '.join(prefixes)})"
    return None


def layer_widths(shapes: dict[str, list[int]]) -> tuple[list[int], int]:
    """(C_l of each cross-attention layer, the text width D) from ip_adapter.{1,3,..}.to_[kv]_ip.weight
    ([C_l, D] each): every pair present, nothing else in the group, one D, and not SD 1.x / 2.x's."""
    pairs: dict[int, dict[str, list[int]]] = {}
    for k, shp in shapes.items():
        m = LAYER_KEY.match(k)
        if m:
            pairs.setdefault(int(m.group(1)), {})[m.group(2)] = shp
        elif k.startswith("ip_adapter."):
            raise ExportError(f"a tensor an IP-Adapter does not have: {k}")
    dims = {shp[1] for p in pairs.values() for shp in p.values() if len(shp) == 2}
    for d in dims:
        if d in SD_FAMILIES:
            raise ExportError(f"{SD_FAMILIES[d]}, not SDXL")
    count = max(pairs) // 2 + 1
    want = [2 * i + 1 for i in range(count)]
    missing = [f"ip_adapter.{n}.to_{kv}_ip.weight" for n in want for kv in "kv" if kv not in pairs.get(n, {})]
    if missing or set(pairs) != set(want):
        other = sorted(set(pairs) - set(want))
        raise ExportError(f"{len(missing)} missing tensor(s) (e.g. {', '.join(missing[:3])})" if missing else
                          f"layer ids {other[:3]} are not the odd numbers 1, 3, .. of an IP-Adapter")
    widths = []
    for n in want:
        k, v = pairs[n]["k"], pairs[n]["v"]
        if len(k) != 2 or k != v:
            raise ExportError(f"ip_adapter.{n}: to_k_ip {k} and to_v_ip {v} are not two [C, D] matrices alike")
        widths.append(k[0])
    if len(dims) != 1:
        raise ExportError(f"the layers read text contexts of several widths {sorted(dims)}")
    return widths, dims.pop()


def check_adapter_file(src: Path) -> tuple[dict[str, list[int]], list[int], int]:
    """(tensor name -> shape, layer widths, text width) of an IP-Adapter file; ExportError naming `src`
    and what it is when it is not one read here."""
    if not src.is_file():
        raise ExportError(f"--ip-adapter {src}: no such file")
    shapes = read_header(src)
    what = what_else(shapes)
    try:
        if what:
            raise ExportError(what)
        widths, cross_dim = layer_widths(shapes)
    except ExportError as e:
        raise ExportError(f"{src}: {e.code}")
    return shapes, widths, cross_dim
