"""A tiny random SDXL ControlNet for the tests, in every layout export_sdxl.py --controlnet reads.

export_sdxl.py --tiny-controlnet --source-only draws it (scripts/export/tiny_adapters.py):
ControlNetModel.from_unet of the tiny model's UNet (its encoder copied, as training starts), with
the zero-initialised parts (controlnet_down_blocks, controlnet_mid_block,
controlnet_cond_embedding.conv_out) re-drawn from a seeded generator, small enough that the
ControlNet changes the image visibly without blowing it up (PSNR with vs without roughly 15-30 dB
on the tiny model).

  python -m reference.controlnet_fixture --diffusers TINY_DIFFUSERS --out DIR [--seed S] [--name NAME]
      [--std-scale F] [--diffusers-only]   (the full-size benchmark, bench/runtime/models.sh controlnet)

DIR gets: diffusers/ (save_pretrained, safetensors), diffusers-keys.safetensors (the same state
dict as one file), original.safetensors (the original ldm layout: input_blocks.*, zero_convs.*,
input_hint_block.*, middle_block_out.*, label_emb.*), original-prefixed.safetensors (the
same under "control_model."), union/ and union.safetensors (a tiny Union ControlNet, diffusers'
ControlNetUnionModel with ProMax's 8 control types, as a folder and as one diffusers-keys file: build_union)
and bad/: files the export must refuse (write_bad_files). The original files are checked by converting them back with
diffusers' convert_controlnet_checkpoint (plus label_emb -> add_embedding from diffusers' own
table, which that function leaves out for SDXL): every tensor must come back bit for bit.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from reference.single_file_fixture import unet_key

EXPORT = Path(__file__).resolve().parents[2] / "scripts" / "export_sdxl.py"


def build(diffusers_dir: Path, out: Path, seed: int, std_scale: float = 1.0):
    """out/diffusers/ by the program (export_sdxl.py --tiny-controlnet --source-only: from_unet of the UNet,
    the zero-initialised parts re-drawn from a generator of `seed`, their spread times std_scale), loaded."""
    import subprocess

    from diffusers import ControlNetModel

    r = subprocess.run([sys.executable, str(EXPORT), "--tiny-controlnet", str(diffusers_dir), "--source-only",
                        "--out", str(out), "--force", "--seed", str(seed), "--std-scale", repr(std_scale)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"export_sdxl.py --tiny-controlnet failed ({r.returncode}):\n{r.stderr[-4000:]}")
    return ControlNetModel.from_pretrained(str(out / "diffusers"), low_cpu_mem_usage=False).eval().requires_grad_(False)


# The union part of the tiny Union ControlNet: its transformer as wide as the conditioning embedding
# (block_out_channels[0], as xinsir's 320 is SDXL's), ProMax's 8 types.
UNION = dict(num_control_type=8, num_trans_head=4, num_trans_layer=1)
# Its zero-initialised parts, re-drawn with the spreads export_sdxl.py --tiny-controlnet gives the
# plain ControlNet's (scripts/export/tiny_adapters.py; this fixture may not import scripts/).
ZERO_PARTS = ("controlnet_down_blocks.", "controlnet_mid_block.", "controlnet_cond_embedding.conv_out.")
RESIDUAL_STD, COND_OUT_STD = 0.5, 0.4


def build_union(diffusers_dir: Path, seed: int):
    """ControlNetUnionModel of the tiny UNet's architecture, the UNet's encoder copied (as from_unet does),
    the rest seeded: the zero-initialised parts (ZERO_PARTS and spatial_ch_projs) re-drawn as build's."""
    from diffusers import ControlNetUnionModel, UNet2DConditionModel

    unet = UNet2DConditionModel.from_pretrained(str(diffusers_dir / "unet"), dtype=torch.float32,
                                                local_files_only=True, low_cpu_mem_usage=False)
    with torch.device("meta"):
        cfg = dict(ControlNetUnionModel.from_unet(unet, load_weights_from_unet=False).config)
    width = unet.config.block_out_channels[0]
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    cfg.update(UNION, num_trans_channel=width, num_proj_channel=width)
    torch.manual_seed(seed)
    cn = ControlNetUnionModel.from_config(cfg)
    for part in ("conv_in", "time_proj", "time_embedding", "down_blocks", "mid_block"):
        getattr(cn, part).load_state_dict(getattr(unet, part).state_dict(), strict=False)
    gen = torch.Generator().manual_seed(seed + 1000)
    for name, p in cn.named_parameters():
        if name.startswith(ZERO_PARTS + ("spatial_ch_projs.",)):
            std = COND_OUT_STD if name.startswith(("controlnet_cond_embedding.", "spatial_ch_projs.")) else RESIDUAL_STD
            p.data = torch.randn(p.shape, generator=gen) * (std / 10 if name.endswith("bias") else std)
    return cn.eval().requires_grad_(False)


def original_key(k: str, unet_cfg: dict) -> str:
    """diffusers ControlNetModel key -> original (ldm ControlNet) key, without a prefix."""
    p = k.split(".")
    if p[0] == "controlnet_down_blocks":
        return f"zero_convs.{p[1]}.0.{p[2]}"
    if p[0] == "controlnet_mid_block":
        return f"middle_block_out.0.{p[1]}"
    if p[0] == "controlnet_cond_embedding":
        if p[1] == "conv_in":
            return f"input_hint_block.0.{p[2]}"
        if p[1] == "conv_out":
            return f"input_hint_block.14.{p[2]}"
        return f"input_hint_block.{2 * (int(p[2]) + 1)}.{p[3]}"
    return unet_key(k, unet_cfg)  # the encoder: the UNet's names


def to_original(cn) -> dict[str, torch.Tensor]:
    cfg = dict(cn.config)
    if tuple(cfg["conditioning_embedding_out_channels"]) != (16, 32, 96, 256):
        raise SystemExit("the original layout fixes the conditioning embedding at (16, 32, 96, 256) channels")
    cfg.setdefault("up_block_types", ())
    return {original_key(k, cfg): v.detach().contiguous() for k, v in cn.state_dict().items()}


def read_back(sd: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """diffusers' conversion of an original-layout file, as export_sdxl.py reads it."""
    from diffusers.loaders import single_file_utils as sfu

    bare = {k.removeprefix("control_model."): v for k, v in sd.items()}
    out = sfu.convert_controlnet_checkpoint(bare, config)
    for new, old in sfu.DIFFUSERS_TO_LDM_MAPPING["controlnet"]["addition_embed_type"].items():
        if old in bare:
            out[new] = bare[old]
    return out


def max_diff(want: dict, got: dict) -> float:
    if set(want) != set(got):
        raise SystemExit(f"the conversion gives other tensors: {sorted(set(want) ^ set(got))[:4]}")
    return max(float((want[k] - got[k]).abs().max()) if got[k] is not None else float("inf") for k in want)


def write_bad_files(sd: dict[str, torch.Tensor], orig: dict[str, torch.Tensor], folder: Path, out: Path) -> None:
    """Files export_sdxl.py --controlnet must refuse, under out/: an SD 1.x ControlNet (original layout,
    and a folder whose config says so), a T2I-Adapter, a Control-LoRA, a ControlLLLite, a LoRA, a
    whole checkpoint, a Union ControlNet, a truncated file, a pickle, and a file less one tensor."""
    import shutil

    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    z = lambda *shape: torch.zeros(*shape or (4, 4))  # noqa: E731  (one tensor per name: safetensors refuses shared ones)
    sd1 = {k: (z(v.shape[0], 768) if k.endswith(("attn2.to_k.weight", "attn2.to_v.weight")) else v)
           for k, v in orig.items() if not k.startswith("label_emb.")}
    save_file(sd1, str(out / "sd1.safetensors"))
    shutil.copytree(folder, out / "sd1-folder", dirs_exist_ok=True)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(cross_attention_dim=768, addition_embed_type=None)
    (out / "sd1-folder" / "config.json").write_text(json.dumps(cfg, indent=1))
    fakes = {
        "t2i-adapter": {"adapter.conv_in.weight": z(), "adapter.body.0.resnets.0.block1.weight": z()},
        "control-lora": {"lora_controlnet": z(1), "input_blocks.1.0.in_layers.2.up": z(),
                         "input_blocks.1.0.in_layers.2.down": z()},
        "lllite": {"lllite_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q.conditioning1.0.weight": z()},
        "lora": {"lora_unet_down_blocks_1_attentions_0_proj_in.lora_down.weight": z(),
                 "lora_unet_down_blocks_1_attentions_0_proj_in.lora_up.weight": z()},
        "checkpoint": {"model.diffusion_model.input_blocks.0.0.weight": z(), "first_stage_model.decoder.conv_in.weight": z()},
        "union": dict({k: v.clone() for k, v in sd.items()}, task_embedding=z(8, 32)),
        "missing-tensor": {k: v for k, v in orig.items() if k != "zero_convs.3.0.weight"},
    }
    for name, tensors in fakes.items():
        save_file(tensors, str(out / f"{name}.safetensors"))
    data = (out / "missing-tensor.safetensors").read_bytes()
    (out / "truncated.safetensors").write_bytes(data[: len(data) * 2 // 3])
    torch.save({"state_dict": {"input_hint_block.0.weight": z()}}, str(out / "pickle.safetensors"))


def write(diffusers_dir: Path, out: Path, seed: int, name: str, std_scale: float = 1.0,
          diffusers_only: bool = False) -> dict:
    from safetensors.torch import load_file, save_file

    cn = build(diffusers_dir, out, seed, std_scale)
    if diffusers_only:
        return {"name": name, "seed": seed, "parameters": sum(p.numel() for p in cn.parameters()),
                "original_read_back_max_abs_diff": 0.0}
    sd = {k: v.detach().contiguous() for k, v in cn.state_dict().items()}
    save_file(sd, str(out / "diffusers-keys.safetensors"), metadata={"name": name})
    orig = to_original(cn)
    save_file(orig, str(out / "original.safetensors"), metadata={"name": name})
    save_file({"control_model." + k: v for k, v in orig.items()}, str(out / "original-prefixed.safetensors"))
    write_bad_files(sd, orig, out / "diffusers", out / "bad")
    union = build_union(diffusers_dir, seed + 50)
    union.save_pretrained(str(out / "union"), safe_serialization=True)
    save_file({k: v.detach().contiguous() for k, v in union.state_dict().items()}, str(out / "union.safetensors"),
              metadata={"name": name + "-union"})
    diffs = {f: max_diff(sd, read_back(load_file(str(out / f)), dict(cn.config)))
             for f in ("original.safetensors", "original-prefixed.safetensors")}
    return {"name": name, "seed": seed, "tensors": len(sd), "parameters": sum(v.numel() for v in sd.values()),
            "original_read_back_max_abs_diff": max(diffs.values())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--diffusers", required=True, help="the tiny model's diffusers folder (its unet/)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--name", default="tiny-controlnet")
    ap.add_argument("--std-scale", type=float, default=1.0,
                    help="scales the re-drawn weights' spread (the full-size model's benchmark: small, so fp16 "
                         "stays finite)")
    ap.add_argument("--diffusers-only", action="store_true",
                    help="write only diffusers/ (the full-size benchmark: no other layouts, no bad files)")
    a = ap.parse_args()
    if not a.diffusers_only:
        torch.set_num_threads(1)
    info = write(Path(a.diffusers), Path(a.out), a.seed, a.name, a.std_scale, a.diffusers_only)
    print(json.dumps(info))
    if info["original_read_back_max_abs_diff"] != 0.0:
        print("FAIL: diffusers' conversion does not read the original layout back exactly", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
