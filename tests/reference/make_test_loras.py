"""Random LoRA files in the formats users bring, for tests and benchmarks.

Shapes come from the SDXL architecture itself (the configs scripts/export_sdxl.py
exports, via reference.architecture; modules built on torch's meta device: no
weights, no download), so the files fit the tiny CI model (--arch tiny), the AOTI test's tiny model
(--arch tiny-aoti: one resnet and one transformer layer per UNet block) or the
full-size SDXL (--full).

Files written to --out (each a .safetensors, made with the safetensors package):
  kohya_unet      kohya, UNet attention/ff/proj layers, SGM names (input_blocks_4_1_...)
                  as kohya's SDXL trainer writes them, alpha = rank/2, fp16
  kohya_unet_dn   kohya, UNet in diffusers names (down_blocks_1_attentions_0_...), fp32
  kohya_te        kohya, lora_te1_ + lora_te2_ (q/k/v/out_proj, mlp fc1/fc2, text_projection), bf16
  peft            diffusers/peft: unet.* / text_encoder.* / text_encoder_2.* with lora_A/lora_B, no alpha
  diffusers_old   old diffusers: unet.*.lora.down/.lora.up and attn processors' to_q_lora.down
  locon           kohya LoCon: UNet resnet convs (3x3 and 1x1), down/up samplers, with alpha
  sd15            an SD 1.5 LoRA (lora_te_ prefix, 768-wide cross attention) that must be refused
  nan             a small kohya file with a NaN in one factor (refused)
With --full: full_a and full_b, rank-64 kohya SDXL LoRAs (UNet + both text encoders), fp16.

    PYTHONPATH=tests python -m reference.make_test_loras --out DIR [--arch tiny] [--rank 4] [--seed 0]
    PYTHONPATH=tests python -m reference.make_test_loras --out DIR --full   # rank 64, full-size SDXL (bench/bench_lora.sh)
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from reference.architecture import sdxl_configs

UNET_LINEAR = re.compile(
    r"^(down_blocks|up_blocks|mid_block).*attentions\.\d+\.(transformer_blocks\.\d+\.(attn[12]\.(to_q|to_k|to_v|to_out\.0)"
    r"|ff\.net\.0\.proj|ff\.net\.2)|proj_in|proj_out)\.weight$")
UNET_CONV = re.compile(r"^(down_blocks|up_blocks|mid_block).*(resnets\.\d+\.(conv1|conv2|conv_shortcut)|(down|up)samplers\.0\.conv)\.weight$")
TE_LINEAR = re.compile(r"^text_model\.encoder\.layers\.\d+\.(self_attn\.(q|k|v|out)_proj|mlp\.fc[12])\.weight$|^text_projection\.weight$")


def shapes(arch: str) -> dict[str, dict[str, tuple]]:
    """Parameter name -> shape of text_encoder, text_encoder_2 and unet, built on the meta device."""
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cfg = sdxl_configs(arch)
    te1, te2, unet = cfg["text_encoder"], cfg["text_encoder_2"], cfg["unet"]
    with torch.device("meta"):
        mods = {"text_encoder": CLIPTextModel(CLIPTextConfig(**te1)),
                "text_encoder_2": CLIPTextModelWithProjection(CLIPTextConfig(**te2)),
                "unet": UNet2DConditionModel(**unet)}
    out = {k: {n: tuple(p.shape) for n, p in m.state_dict().items()} for k, m in mods.items()}
    # Recent transformers flatten CLIPTextModel (no `text_model.`); LoRA files and the
    # exported modules use the classic names (export_sdxl.py keeps them).
    out["text_encoder"] = {(n if n.startswith("text_model.") else "text_model." + n): s for n, s in out["text_encoder"].items()}
    out["_unet_layers_per_block"] = unet["layers_per_block"]
    return out


def sgm_name(m: str, lpb: int, up_attn: set[int]) -> str | None:
    """diffusers UNet module path -> kohya's SDXL (SGM) spelling; the inverse of diffusers'
    _maybe_map_sgm_blocks_to_diffusers + _convert_unet_lora_key (loaders/lora_conversion_utils.py)."""
    res = {"conv1": "in_layers.2", "conv2": "out_layers.3", "conv_shortcut": "skip_connection", "time_emb_proj": "emb_layers.1"}
    t = m.split(".")
    if t[0] == "down_blocks":
        b, kind, l, rest = int(t[1]), t[2], int(t[3]), ".".join(t[4:])
        if kind == "resnets":
            return f"input_blocks.{1 + b * (lpb + 1) + l}.0.{res[rest]}"
        if kind == "attentions":
            return f"input_blocks.{1 + b * (lpb + 1) + l}.1.{rest}"
        if kind == "downsamplers":
            return f"input_blocks.{(b + 1) * (lpb + 1)}.0.op"
    if t[0] == "up_blocks":
        up = lpb + 1
        b, kind, l, rest = int(t[1]), t[2], int(t[3]), ".".join(t[4:])
        if kind == "resnets":
            return f"output_blocks.{b * up + l}.0.{res[rest]}"
        if kind == "attentions":
            return f"output_blocks.{b * up + l}.1.{rest}"
        if kind == "upsamplers":
            return f"output_blocks.{b * up + up - 1}.{2 if b in up_attn else 1}.conv"
    if t[0] == "mid_block":
        kind, l, rest = t[1], int(t[2]), ".".join(t[3:])
        if kind == "resnets":
            return f"middle_block.{0 if l == 0 else 2}.{res[rest]}"
        return f"middle_block.1.{rest}"
    return None


def factors(shape: tuple, rank: int, gen: torch.Generator, strength: float, dtype: torch.dtype):
    out_f, in_f = shape[0], shape[1]
    k = tuple(shape[2:])
    fan_in = in_f * (k[0] * k[1] if k else 1)
    down = torch.randn((rank, in_f, *k), generator=gen) / fan_in ** 0.5
    up = torch.randn((out_f, rank, *((1, 1) if k else ())), generator=gen) * strength
    return down.to(dtype).contiguous(), up.to(dtype).contiguous()


def kohya(params: dict, modules: list[tuple[str, str]], rank, gen, strength, dtype, names) -> dict:
    sd = {}
    for target, name in modules:
        shape = params[target][name]
        down, up = factors(shape, rank, gen, strength, dtype)
        key = names(target, name[: -len(".weight")])
        sd[f"{key}.lora_down.weight"], sd[f"{key}.lora_up.weight"] = down, up
        sd[f"{key}.alpha"] = torch.tensor(rank / 2, dtype=dtype)
    return sd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--arch", choices=["tiny", "tiny-aoti", "full"], default="tiny",
                    help="the architecture of export_sdxl.py --print-config ARCH (tiny-aoti: the AOTI test's model)")
    ap.add_argument("--full", action="store_true", help="rank-64 kohya LoRAs (full_a, full_b) for the full-size SDXL")
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strength", type=float, default=0.25, help="std of the up factors")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    arch = "full" if a.full else a.arch
    rank = a.rank or (64 if a.full else 4)
    gen = torch.Generator().manual_seed(a.seed)
    P = shapes(arch)
    lpb = P.pop("_unet_layers_per_block")
    up_attn = {int(n.split(".")[1]) for n in P["unet"] if n.startswith("up_blocks.") and ".attentions." in n}
    unet_lin = [("unet", n) for n in sorted(P["unet"]) if UNET_LINEAR.match(n)]
    unet_conv = [("unet", n) for n in sorted(P["unet"]) if UNET_CONV.match(n) and len(P["unet"][n]) == 4]
    te = [(t, n) for t in ("text_encoder", "text_encoder_2") for n in sorted(P[t]) if TE_LINEAR.match(n)]
    te = [(t, n) for t, n in te if not (t == "text_encoder" and n == "text_projection.weight")]
    prefix = {"unet": "lora_unet_", "text_encoder": "lora_te1_", "text_encoder_2": "lora_te2_"}

    def kohya_sgm(target, m):
        return prefix[target] + (sgm_name(m, lpb, up_attn) if target == "unet" else m).replace(".", "_")

    def kohya_dn(target, m):
        return prefix[target] + m.replace(".", "_")

    files: dict[str, dict] = {}
    if a.full:
        for name in ("full_a", "full_b"):
            files[name] = kohya(P, unet_lin + te, rank, gen, a.strength, torch.float16, kohya_sgm)
    else:
        files["kohya_unet"] = kohya(P, unet_lin, rank, gen, a.strength, torch.float16, kohya_sgm)
        files["kohya_unet_dn"] = kohya(P, unet_lin, rank, gen, a.strength, torch.float32, kohya_dn)
        files["kohya_te"] = kohya(P, te, rank, gen, a.strength * 2, torch.bfloat16, kohya_sgm)
        files["locon"] = kohya(P, unet_conv, rank, gen, a.strength, torch.float32, kohya_sgm)
        peft = {}
        for target, name in unet_lin[::2] + te[::2]:
            down, up = factors(P[target][name], rank, gen, a.strength, torch.float32)
            m = name[: -len(".weight")]
            peft[f"{target}.{m}.lora_A.weight"], peft[f"{target}.{m}.lora_B.weight"] = down, up
        files["peft"] = peft
        old = {}
        for target, name in unet_lin[1::2]:
            down, up = factors(P[target][name], rank, gen, a.strength, torch.float32)
            m = name[: -len(".weight")]
            # attention projections in the attn-processor spelling, the rest as .lora.down/.lora.up
            mm = re.sub(r"\.(attn[12])\.(to_q|to_k|to_v)$", r".\1.processor.\2_lora", m)
            mm = re.sub(r"\.(attn[12])\.to_out\.0$", r".\1.processor.to_out_lora", mm)
            sep = "." if mm.endswith("_lora") else ".lora."
            old[f"unet.{mm}{sep}down.weight"], old[f"unet.{mm}{sep}up.weight"] = down, up
        files["diffusers_old"] = old
        # SD 1.5: one text encoder (lora_te_) and 768-wide cross attention.
        sd15 = {}
        for key, (o, i) in {"lora_te_text_model_encoder_layers_0_self_attn_q_proj": (768, 768),
                            "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_k": (320, 768)}.items():
            sd15[f"{key}.lora_down.weight"] = torch.randn(rank, i, generator=gen)
            sd15[f"{key}.lora_up.weight"] = torch.randn(o, rank, generator=gen)
            sd15[f"{key}.alpha"] = torch.tensor(float(rank))
        files["sd15"] = sd15
        # A broken training run: one NaN in an otherwise good file.
        nan = {k: v.clone() for k, v in list(files["kohya_unet_dn"].items())[:6]}
        first = next(k for k in nan if k.endswith("lora_up.weight"))
        nan[first].view(-1)[0] = float("nan")
        files["nan"] = nan
    for name, sd in files.items():
        path = out / f"{name}.safetensors"
        save_file(sd, str(path), metadata={"made_by": "sdxl-batch tests/reference/make_test_loras.py", "rank": str(rank)})
        print(f"{path}: {len(sd)} tensors, {path.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
