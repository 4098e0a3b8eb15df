"""Tiny random SDXL IP-Adapters for the tests, in the original single-file layout that
export_sdxl.py --ip-adapter reads, each with its own tiny CLIP vision encoder: export_sdxl.py
--tiny-ip-adapter --source-only draws them (scripts/export/tiny_adapters.py, which the example batch's
adapter comes from too); this adds the files the export must refuse.

The adapters fit the tiny model (its UNet's cross-attention layers, in diffusers' attn_processors
order, with diffusers' own widths: _convert_ip_adapter_attn_to_diffusers' hidden_size rule) and are
drawn from seeded generators with spreads large enough that scale 1.0 changes the image visibly and the
image tokens depend on the reference image (not only on biases):
  plain  ImageProjection (4 tokens) on the encoder's image_embeds; encoder: hidden 32, 2 layers,
         image_size 32, patch 8, projection_dim 24
  plus   IPAdapterPlusImageProjection (the Resampler: depth 4, 16 queries, hidden 64 = 1 head of 64, as
         diffusers infers heads = to_q rows // 64) on the encoder's hidden_states[-2]; encoder: hidden 48,
         3 layers, image_size 64, patch 16

  python -m reference.ip_adapter_fixture --diffusers TINY_DIFFUSERS --out DIR [--seed S] [--size full]

DIR gets plain/ip-adapter-plain.safetensors + plain/image_encoder/ (transformers save_pretrained:
config.json + model.safetensors), the same under plus/, and bad/: files export_sdxl.py --ip-adapter must
refuse (write_bad_files). Each adapter file is read back by diffusers' own conversion
(_convert_ip_adapter_image_proj_to_diffusers): the projection must come back bit for bit.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

EXPORT = Path(__file__).resolve().parents[2] / "scripts" / "export_sdxl.py"


def write_bad_files(plain: dict[str, torch.Tensor], plus: dict[str, torch.Tensor], plain_enc: Path, out: Path) -> None:
    """Files export_sdxl.py --ip-adapter must refuse, under out/: SD 1.x / 2.x adapters (text width 768 /
    1024), FaceID and FaceID-plus adapters, a full-face adapter, a LoRA, a ControlNet, a whole checkpoint,
    a file of other tensors, a truncated file, a pickle, a plain adapter less one layer tensor, a plus
    adapter less one Resampler tensor, and an encoder folder with only pickle weights."""
    import shutil

    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    z = lambda *shape: torch.zeros(*shape or (4, 4))  # noqa: E731  (one tensor per name: safetensors refuses shared ones)
    for name, d, layers in (("sd1", 768, 16), ("sd2", 1024, 16)):
        sd = {"image_proj.proj.weight": z(4 * d, 24), "image_proj.proj.bias": z(4 * d), "image_proj.norm.weight": z(d),
              "image_proj.norm.bias": z(d)}
        sd.update({f"ip_adapter.{2 * i + 1}.to_{kv}_ip.weight": z(8, d) for i in range(layers) for kv in "kv"})
        save_file(sd, str(out / f"{name}.safetensors"))
    fakes = {
        "faceid": {"image_proj.proj.0.weight": z(8, 4), "image_proj.proj.0.bias": z(8), "image_proj.proj.2.weight": z(),
                   "image_proj.proj.2.bias": z(4), "image_proj.norm.weight": z(4), "image_proj.norm.bias": z(4),
                   "ip_adapter.1.to_k_ip.weight": z(), "ip_adapter.1.to_v_ip.weight": z(),
                   "ip_adapter.1.to_k_lora.down.weight": z(), "ip_adapter.1.to_k_lora.up.weight": z()},
        "faceid-plus": {"image_proj.perceiver_resampler.proj_in.weight": z(), "image_proj.proj.0.weight": z(),
                        "ip_adapter.1.to_k_ip.weight": z(), "ip_adapter.1.to_v_ip.weight": z()},
        "full-face": {"image_proj.proj.0.weight": z(), "image_proj.proj.0.bias": z(4), "image_proj.proj.2.weight": z(),
                      "image_proj.proj.2.bias": z(4), "image_proj.proj.3.weight": z(4), "image_proj.proj.3.bias": z(4),
                      "ip_adapter.1.to_k_ip.weight": z(), "ip_adapter.1.to_v_ip.weight": z()},
        "lora": {"lora_unet_down_blocks_1_attentions_0_proj_in.lora_down.weight": z(),
                 "lora_unet_down_blocks_1_attentions_0_proj_in.lora_up.weight": z()},
        "controlnet": {"controlnet_cond_embedding.conv_in.weight": z(), "controlnet_down_blocks.0.weight": z()},
        "checkpoint": {"model.diffusion_model.input_blocks.0.0.weight": z(), "first_stage_model.decoder.conv_in.weight": z()},
        "other": {"encoder.layer.0.weight": z(), "head.weight": z()},
        "missing-tensor": {k: v for k, v in plain.items() if k != "ip_adapter.5.to_v_ip.weight"},
        "missing-resampler-tensor": {k: v for k, v in plus.items() if k != "image_proj.layers.2.0.to_q.weight"},
    }
    for name, tensors in fakes.items():
        save_file(tensors, str(out / f"{name}.safetensors"))
    data = (out / "missing-tensor.safetensors").read_bytes()
    (out / "truncated.safetensors").write_bytes(data[: len(data) * 2 // 3])
    torch.save({"image_proj": {"proj.weight": z()}, "ip_adapter": {"1.to_k_ip.weight": z()}}, str(out / "pickle.safetensors"))
    enc = out / "encoder-bin"
    enc.mkdir(exist_ok=True)
    shutil.copyfile(plain_enc / "config.json", enc / "config.json")
    torch.save({"visual_projection.weight": z()}, str(enc / "pytorch_model.bin"))


def write(diffusers_dir: Path, out: Path, seed: int, size: str = "tiny", variants=("plain", "plus")) -> dict:
    """The adapters by the program (export_sdxl.py --tiny-ip-adapter --source-only, which reads each back),
    then bad/ when both are tiny; the program's info."""
    import subprocess

    from safetensors.torch import load_file

    r = subprocess.run([sys.executable, str(EXPORT), "--tiny-ip-adapter", str(diffusers_dir), "--source-only",
                        "--out", str(out), "--force", "--seed", str(seed), "--ip-size", size,
                        "--ip-variants", *variants], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"export_sdxl.py --tiny-ip-adapter failed ({r.returncode}):\n{r.stderr[-4000:]}")
    info = json.loads(r.stdout.strip().splitlines()[-1])
    if size == "tiny" and len(variants) == 2:
        plain, plus = (load_file(str(out / v / f"ip-adapter-{v}.safetensors")) for v in ("plain", "plus"))
        write_bad_files(plain, plus, out / "plain" / "image_encoder", out / "bad")
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--diffusers", required=True, help="the tiny model's diffusers folder (its unet/config.json)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--size", choices=["tiny", "full"], default="tiny",
                    help="full: the published adapters' encoder and Resampler shapes (the GPU benchmark; no bad files)")
    ap.add_argument("--variants", nargs="+", choices=["plain", "plus"], default=["plain", "plus"],
                    help="which adapters to make (the bad files need both)")
    a = ap.parse_args()
    if a.size == "tiny":
        torch.set_num_threads(1)
    info = write(Path(a.diffusers), Path(a.out), a.seed, a.size, a.variants)
    print(json.dumps(info))
    if any(info[v]["read_back_max_abs_diff"] != 0.0 for v in a.variants):
        print("FAIL: diffusers' conversion does not read the original layout back exactly", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
