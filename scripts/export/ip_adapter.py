"""SDXL IP-Adapters for export_sdxl.py --ip-adapter FILE --image-encoder DIR: an "IP-Adapter folder"
that sdxl-batch loads next to a model (image_encoder.ts + ip_adapter.ts + model.json, kind "ip_adapter").

Sources: FILE is one published IP-Adapter .safetensors file in the original layout: image_proj.* (the
image projection) and ip_adapter.N.to_k_ip.weight / ip_adapter.N.to_v_ip.weight (N = 1, 3, 5, ..: one
pair per cross-attention layer of the UNet, in diffusers' unet.attn_processors order), split into the
two groups by their prefixes as diffusers' load_ip_adapter does. DIR is the CLIP vision encoder it was
trained with, a transformers folder (config.json + model.safetensors, CLIPVisionModelWithProjection).
Rules kept here:
  - the file is checked before anything is loaded (inputs.read_header: truncated files,
    pickles); what is not an SDXL IP-Adapter is refused with a message naming it: an SD 1.x / 2.x
    IP-Adapter (text context 768 / 1024), a FaceID adapter (no CLIP image encoder, LoRA weights: not
    supported), the full-face adapter (not supported), a LoRA, a ControlNet, a whole checkpoint;
  - variants, told apart by the image_proj keys as diffusers does: "plain" (ImageProjection:
    image_proj.proj + norm, 4 tokens, reads the encoder's image_embeds) and "plus"
    (IPAdapterPlusImageProjection, the Resampler: latents, proj_in, proj_out, norm_out, layers.*,
    reads the encoder's hidden_states[-2]);
  - the image projection is built by diffusers' own conversion (_convert_ip_adapter_image_proj_to_diffusers);
    every tensor must arrive with its shape (strict load; the encoder: weights.fill_module);
  - the encoder's output width must be the projection's input width;
  - the number and widths of the layers are checked against the base model by sdxl-batch at load
    (model.json adapter.layers vs the model's unet.ip_adapter.layers): the export does not know the model.

Module contracts (traced on --device, weights in the model dtype):
  image_encoder.ts  pixel_values float [N,3,S,S] (CLIP-normalised, S = image_size; cast to the dtype
                    inside) -> ONE tensor: plain: image_embeds [N,P]; plus: hidden_states[-2] [N,L,H]
  ip_adapter.ts     that output [N,...] -> tuple of 2L tensors (k_0, v_0, .., k_{L-1}, v_{L-1}),
                    each [N,T,C_l] = to_k_ip_l(image_proj(x)), to_v_ip_l(image_proj(x)), unscaled
One reference image per row. diffusers gives several images of one adapter to each attention as their
tokens concatenated along dim 1 (MultiIPAdapterImageProjection projects each image, the processor's
view(batch, -1, heads, head_dim) joins them image after image). The negative (CFG) rows: plain:
ip_adapter.ts(zeros [N,P]) (diffusers' encode_image: zeros_like(image_embeds)); plus:
ip_adapter.ts(image_encoder.ts(zeros [N,3,S,S])) (the encoder on all-zero pixel_values, i.e. after
normalisation, not a black image). unet.ts forward_ip takes k and scale * v (sdxl_modules.UNetTS).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn as nn

from .common import (Checker, Job, SharedChildren, check_names, count_params, file_digests, log, publish,
                     sha256_file, summarize_checks, trace_module)
from .inputs import ExportError, read_header
from .ip_adapter_family import check_adapter_file
from .weights import check_finite, fill_module

PLAIN_TOKENS = 4  # diffusers' ImageProjection for IP-Adapter files (num_image_text_embeds)


def variant_of(proj: dict[str, list[int]]) -> str:
    """diffusers' choice in _convert_ip_adapter_image_proj_to_diffusers: proj.weight -> plain, else plus."""
    return "plain" if "proj.weight" in proj else "plus"


def build_image_proj(proj_sd: dict[str, torch.Tensor], variant: str, cross_dim: int) -> tuple[nn.Module, int, int]:
    """(diffusers' image projection module, its input width, its token count T); its output width must be D."""
    from diffusers.loaders.unet import UNet2DConditionLoadersMixin

    need = ["proj.weight", "proj.bias", "norm.weight", "norm.bias"] if variant == "plain" else \
        ["latents", "proj_in.weight", "proj_in.bias", "proj_out.weight", "proj_out.bias", "norm_out.weight"]
    missing = [f"image_proj.{k}" for k in need if k not in proj_sd]
    if missing:
        raise ExportError(f"{len(missing)} missing tensor(s) of a {variant} IP-Adapter's image projection "
                          f"(e.g. {', '.join(missing[:3])})")
    try:  # low_cpu_mem_usage=False: a strict load_state_dict, and `self` is not used
        mod = UNet2DConditionLoadersMixin._convert_ip_adapter_image_proj_to_diffusers(None, proj_sd,
                                                                                     low_cpu_mem_usage=False)
    except (RuntimeError, KeyError, IndexError) as e:
        first = " ".join(str(e).split())[:400] or repr(e)
        raise ExportError(f"the image projection does not fit a {variant} IP-Adapter "
                          f"(a tensor missing or of another shape): {first}")
    if variant == "plain":
        in_dim, tokens, out_dim = proj_sd["proj.weight"].shape[1], PLAIN_TOKENS, proj_sd["norm.weight"].shape[0]
    else:
        in_dim, tokens, out_dim = proj_sd["proj_in.weight"].shape[1], proj_sd["latents"].shape[1], \
            proj_sd["proj_out.weight"].shape[0]
    if out_dim != cross_dim:
        raise ExportError(f"the image projection gives tokens {out_dim} wide; its layers read {cross_dim}: "
                          "not the two halves of one IP-Adapter")
    return mod.eval().requires_grad_(False), int(in_dim), int(tokens)


class IPAdapterTS(nn.Module):
    """image_proj (diffusers' module and names) + to_k_ip.l / to_v_ip.l (Linear D -> C_l, no bias)."""

    def __init__(self, image_proj: nn.Module, layers: dict[int, tuple[torch.Tensor, torch.Tensor]], dtype):
        super().__init__()
        self.image_proj = image_proj
        self.to_k_ip = nn.ModuleList()
        self.to_v_ip = nn.ModuleList()
        for n in sorted(layers):
            for lst, w in zip((self.to_k_ip, self.to_v_ip), layers[n]):
                lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
                lin.weight = nn.Parameter(w.clone(), requires_grad=False)
                lst.append(lin)
        self._dtype = dtype

    def forward(self, x):
        tokens = self.image_proj(x.to(self._dtype))
        out = []
        for k, v in zip(self.to_k_ip, self.to_v_ip):
            out += [k(tokens), v(tokens)]
        return tuple(out)


class ImageEncoderTS(SharedChildren):
    """CLIPVisionModelWithProjection (names vision_model.* / visual_projection.*): image_embeds
    (plain) or hidden_states[-2] (plus)."""

    def __init__(self, enc, dtype, output: str):
        super().__init__(enc)
        self._dtype = dtype
        self._hidden = output == "hidden_states[-2]"

    def forward(self, pixel_values):
        x = pixel_values.to(self._dtype)
        if self._hidden:
            return self._inner(x, output_hidden_states=True).hidden_states[-2]
        return self._inner(x).image_embeds


def load_image_encoder(src: Path, device: str, dtype: torch.dtype):
    """CLIPVisionModelWithProjection of a transformers folder (config.json + model.safetensors), built on
    meta and filled by assignment: every tensor must come from the file with its shape."""
    from safetensors.torch import load_file
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    if not src.is_dir() or not (src / "config.json").is_file():
        raise ExportError(f"--image-encoder {src}: not a transformers folder with config.json")
    weights = src / "model.safetensors"
    if not weights.is_file():
        pickles = list(src.glob("*.bin"))
        raise ExportError(f"--image-encoder {src}: no model.safetensors" + (
            " (only pickle .bin weights; loading one can run code. Convert it to .safetensors first)" if pickles else ""))
    read_header(weights)
    try:
        cfg = CLIPVisionConfig.from_pretrained(str(src), local_files_only=True)
    except (OSError, ValueError, TypeError) as e:
        raise ExportError(f"--image-encoder {src}: config.json is not a CLIP vision config ({e})")
    with torch.device("meta"):
        enc = CLIPVisionModelWithProjection(cfg)
    sd = load_file(str(weights), device="cpu")
    check_finite(sd, weights)
    return fill_module(enc, sd, "the image encoder", weights, device, dtype), weights


def load_adapter(src: Path, device: str, dtype: torch.dtype) -> tuple[IPAdapterTS, dict]:
    """The adapter module and what model.json says of it (variant, tokens, widths, input width)."""
    from safetensors.torch import load_file

    shapes, widths, cross_dim = check_adapter_file(src)
    try:
        sd = load_file(str(src), device="cpu")
        proj_sd = {k.removeprefix("image_proj."): v.float() for k, v in sd.items() if k.startswith("image_proj.")}
        variant = variant_of(proj_sd)
        proj, in_dim, tokens = build_image_proj(proj_sd, variant, cross_dim)
    except ExportError as e:
        raise ExportError(f"{src}: {e.code}")
    check_finite(sd, src)
    layers = {i: (sd[f"ip_adapter.{2 * i + 1}.to_k_ip.weight"].float(), sd[f"ip_adapter.{2 * i + 1}.to_v_ip.weight"]
                  .float()) for i in range(len(widths))}
    mod = IPAdapterTS(proj, layers, dtype).to(device=device, dtype=dtype).eval().requires_grad_(False)
    log(f"  {src.name}: {len(shapes)} tensors, {variant} IP-Adapter, {tokens} tokens, {len(widths)} layers, "
        f"text width {cross_dim}")
    return mod, {"variant": variant, "tokens": tokens, "layers": widths, "cross_attention_dim": cross_dim,
                 "input_width": in_dim}


def check_traces(tmp: Path, enc_w: nn.Module, ad_w: nn.Module, size: int, dtype, device, gen) -> Checker:
    """Each traced module vs its eager wrapper at 1, 2 and 3 rows; the adapter on the encoder's output."""
    chk = Checker(dtype, device)
    enc_ts, ad_ts = (torch.jit.load(str(tmp / f), map_location=device) for f in ("image_encoder.ts", "ip_adapter.ts"))
    for n in (1, 2, 3):
        px = (torch.randn(n, 3, size, size, generator=gen) * 1.5).to(device, torch.float32)
        emb = chk.run_safe("image_encoder.ts", dict(batch=n), enc_ts, enc_w, (px,))
        if emb is not None:
            chk.run_safe("ip_adapter.ts", dict(batch=n), ad_ts, ad_w, (emb[0],))
    bad = [r for r in chk.results if not r["ok"]]
    if bad:
        raise SystemExit(f"the traced IP-Adapter modules do not match the eager ones: {bad[0]}")
    return chk


def export(a, job: Job) -> int:
    """--ip-adapter FILE --image-encoder DIR: image_encoder.ts + ip_adapter.ts + model.json (kind
    "ip_adapter") into tmp, checked, published to out."""
    dtype_name, dtype, device, out, tmp = job.dtype_name, job.dtype, job.device, job.out, job.tmp
    torch.set_grad_enabled(False)
    src, enc_dir = Path(a.ip_adapter).resolve(), Path(a.image_encoder).resolve()
    log(f"export ip-adapter: {src} + {enc_dir}, dtype {dtype_name}, device {device}, torch {torch.__version__} "
        f"-> {out}")
    t0 = time.time()
    adapter, info = load_adapter(src, device, dtype)
    enc, enc_weights = load_image_encoder(enc_dir, device, dtype)
    c = enc.config
    output = "image_embeds" if info["variant"] == "plain" else "hidden_states[-2]"
    width = int(c.projection_dim if output == "image_embeds" else c.hidden_size)
    if width != info["input_width"]:
        raise ExportError(f"--image-encoder {enc_dir}: its {output} are {width} wide; the {info['variant']} "
                          f"IP-Adapter {src.name} reads {info['input_width']} (not the encoder it was trained with)")
    size = int(c.image_size)
    gen = torch.Generator().manual_seed(99)
    enc_w = ImageEncoderTS(enc, dtype, output)
    px = torch.randn(2, 3, size, size, generator=gen).to(device, torch.float32)
    msgs = trace_module(enc_w, (px,), tmp / "image_encoder.ts")
    check_names(tmp / "image_encoder.ts", enc, device, "image_encoder")
    msgs += trace_module(adapter, (enc_w(px),), tmp / "ip_adapter.ts")
    check_names(tmp / "ip_adapter.ts", adapter, device, "ip_adapter")
    if msgs:
        log(f"  {len(msgs)} distinct tracer warning(s): " + " | ".join(m.split(": Converting")[0] for m in msgs))
    chk = check_traces(tmp, enc_w, adapter, size, dtype, device, gen) if a.check != "none" else Checker(dtype, device)
    for m, s in summarize_checks(chk.results).items():
        log(f"  check {a.check:5s} {m:24s} cases {s['cases']:3d}  failed {s['failed']:2d}  "
            f"max|diff| {s['max_abs_diff']:.3g}")
    write_meta(a, src, enc_weights, info, enc, output, adapter, dtype_name, device, chk, tmp)
    publish(tmp, out)
    log(f"  wrote IP-Adapter {out} ({info['variant']}, {info['tokens']} tokens x {len(info['layers'])} layers, "
        f"encoder {count_params(enc) / 1e6:,.3f} M + adapter {count_params(adapter) / 1e6:,.3f} M params, "
        f"{time.time() - t0:.1f}s)")
    return 0


def write_meta(a, src: Path, enc_weights: Path, info: dict, enc, output: str, adapter, dtype_name: str, device: str,
               chk, tmp: Path) -> None:
    from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    meta = {
        "format_version": 1, "kind": "ip_adapter", "name": src.stem, "variant": info["variant"],
        "dtype": dtype_name, "export_device": device, "torch_version": torch.__version__,
        "source": f"ip_adapter:{src}",
        "source_file": {"name": src.name, "sha256": sha256_file(src)},
        "image_encoder_file": {"name": enc_weights.name, "sha256": sha256_file(enc_weights)},
        "image_encoder": {
            # diffusers' feature extractor: CLIPImageProcessor(size=S, crop_size=S) (see docs)
            "file": "image_encoder.ts", "image_size": int(enc.config.image_size),
            "mean": list(OPENAI_CLIP_MEAN), "std": list(OPENAI_CLIP_STD), "resample": "bicubic",
            "output": output, "negative": "zero_embeds" if output == "image_embeds" else "zero_image",
            "parameters": count_params(enc),
        },
        "adapter": {"file": "ip_adapter.ts", "tokens": info["tokens"], "cross_attention_dim": info["cross_attention_dim"],
                    "layers": info["layers"], "parameters": count_params(adapter)},
        "check": {"level": a.check, "modules": summarize_checks(chk.results), "notes": []},
        "files": file_digests(tmp),
    }
    (tmp / "model.json").write_text(json.dumps(meta, indent=1) + "\n")
