#!/usr/bin/env python3
"""Export SDXL as TorchScript modules into a model directory that sdxl-batch loads.

Sources (exactly one):
  --tiny          random tiny SDXL-shaped weights (CI; seconds on CPU)
  --random-full   the real SDXL base architecture with random weights (2.57 B UNet)
  --from DIR      a diffusers-format SDXL directory (real weights, local files only)
  --from FILE     a single-file checkpoint (.safetensors, original Stability / A1111 layout);
                  architecture: SDXL base's, or --config DIR (scripts/checkpoint_file.py)
  --vae FILE|DIR  (with --from) this VAE instead of the checkpoint's
  --vae-only      only the VAE of --vae, as a VAE folder a task can name ("vae")
  --controlnet SRC an SDXL ControlNet (diffusers folder, or one .safetensors file in the
                  diffusers or the original layout) as a ControlNet folder
                  (scripts/controlnet_export.py); --config DIR|config.json its architecture
  --ip-adapter FILE --image-encoder DIR
                  an SDXL IP-Adapter (one .safetensors file, the original layout) and its CLIP
                  vision encoder (a transformers folder) as an IP-Adapter folder
                  (scripts/ip_adapter_export.py)
--print-config tiny|full prints the configs --tiny / --random-full build, as JSON
(the test references make files that fit the exported model from it).

Output (see docs/models-and-export.md, the model directory):
  model.json, text_encoder.ts, text_encoder_2.ts, unet.ts, vae_decoder.ts,
  vae_encoder.ts, tokenizer/, tokenizer_2/

Module contracts (all traced on --device, weights in the model dtype; the
parameter names inside each .ts equal the diffusers / transformers state-dict
keys of that component, so LoRA keys map without a prefix):
  text_encoder.ts    ids int64 [B,77] -> (penultimate hidden [B,77,H1], pooled [B,H1])
  text_encoder_2.ts  ids int64 [B,77] -> (penultimate hidden [B,77,H2], text_embeds [B,P])
  unet.ts            (latent [B,4,h,w], timestep f32 [B], context [B,77k,H1+H2],
                      text_embeds [B,P], time_ids [B,6]) -> noise prediction [B,4,h,w]
                     (floating inputs are cast to the model dtype inside, the
                      timestep to float32; output is in the model dtype)
                     method forward_control(the same five, residuals): residuals is a tuple
                     of N+1 tensors, a ControlNet's N down-block residuals in diffusers'
                     order then its mid residual (model.json unet.control gives N, their
                     channels and downscales); = diffusers' UNet with
                     down_block_additional_residuals / mid_block_additional_residual
                     method forward_ip(the same five, ip_kv) and
                     forward_control_ip(the same five, residuals, ip_kv): ip_kv is a tuple of
                     2L tensors (k_0, v_0, .., k_{L-1}, v_{L-1}), one pair per cross-attention
                     layer (attn2) in the order of diffusers' unet.attn_processors (= the
                     IP-Adapter file's ip_adapter.1, .3, .5, ..), each [B, T, C_l] (row b goes
                     with the latent's row b: CFG's negative rows take the negative image
                     tokens; T image tokens, C_l = that layer's to_k out_features; model.json
                     unet.ip_adapter.layers), cast to the model dtype inside. Each attn2 adds
                     sdpa(q, k_l, v_l) to its text attention before to_out: = diffusers'
                     IPAdapterAttnProcessor2_0 with one adapter when the caller passes
                     v_l = scale * to_v_ip(tokens) (the IP scale goes into v); several reference
                     images are their tokens concatenated along dim 1
  vae_decoder.ts     latent / scaling_factor [B,4,h,w] -> image [B,3,8h,8w] in [-1,1]
  vae_encoder.ts     image [B,3,H,W] in [-1,1] -> latent mean [B,4,H/8,W/8] (unscaled)
  unet.pt2           (--aoti) the same UNet wrapper, torch.export'ed and compiled by
                     AOTInductor for --device; same inputs as unet.ts, but each must
                     have the recorded dtype and be contiguous. The package holds
                     NO weights (aot_inductor.package_constants_in_so=False): the
                     loader takes unet.ts's parameters as user-managed constants,
                     so they live once in memory and LoRA patches reach both
                     (AOTInductor inlines a few tiny tensors, e.g. conv_out.bias, as
                     literals: those are not constants and LoRAs must not touch them).
  unet_fp8.ts        (--fp8) unet.ts with the transformer blocks' linear layers in FP8 e4m3
                     (scripts/fp8_quant.py: the layers, the scales, their calibration); the
                     same methods and inputs; sdxl-batch --precision fp8 runs it
  unet_fp8.pt2       (--fp8 --aoti) unet_fp8.ts's UNet compiled by AOTInductor, as unet.pt2

The UNet is traced at a latent size that is NOT a multiple of 2**num_upsamplers,
so the graph carries diffusers' forward_upsample_size path: every up-sampler
interpolates to the (dynamic) size of its skip connection. For latent sizes that
are multiples of 4 this is bit-identical to scale_factor=2, and it also makes
every multiple of 8 px work (limits.size_multiple = 8). --check verifies it.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import faulthandler
import hashlib
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from clip_vocab import write_clip_tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

SDXL_SCHEDULER = dict(
    num_train_timesteps=1000,
    beta_start=0.00085,
    beta_end=0.012,
    beta_schedule="scaled_linear",
    trained_betas=None,
    prediction_type="epsilon",
    interpolation_type="linear",
    use_karras_sigmas=False,
    timestep_spacing="leading",
    steps_offset=1,
)

# --- SDXL base 1.0 configs, written out (nothing is downloaded) --------------
FULL_UNET = dict(
    sample_size=128,
    in_channels=4,
    out_channels=4,
    center_input_sample=False,
    flip_sin_to_cos=True,
    freq_shift=0,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    mid_block_type="UNetMidBlock2DCrossAttn",
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    only_cross_attention=False,
    block_out_channels=(320, 640, 1280),
    layers_per_block=2,
    downsample_padding=1,
    mid_block_scale_factor=1,
    act_fn="silu",
    norm_num_groups=32,
    norm_eps=1e-5,
    cross_attention_dim=2048,
    transformer_layers_per_block=(1, 2, 10),
    attention_head_dim=(5, 10, 20),
    dual_cross_attention=False,
    use_linear_projection=True,
    upcast_attention=False,
    resnet_time_scale_shift="default",
    addition_embed_type="text_time",
    addition_time_embed_dim=256,
    projection_class_embeddings_input_dim=2816,
    time_embedding_type="positional",
    conv_in_kernel=3,
    conv_out_kernel=3,
)
FULL_VAE = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    block_out_channels=(128, 256, 512, 512),
    layers_per_block=2,
    act_fn="silu",
    latent_channels=4,
    norm_num_groups=32,
    sample_size=1024,
    scaling_factor=0.13025,
    force_upcast=True,
)
FULL_TE1 = dict(  # CLIP ViT-L/14 text tower
    vocab_size=49408, hidden_size=768, intermediate_size=3072, projection_dim=768,
    num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77,
    hidden_act="quick_gelu", layer_norm_eps=1e-5,
    bos_token_id=49406, eos_token_id=49407, pad_token_id=49407,
)
FULL_TE2 = dict(  # OpenCLIP ViT-bigG/14 text tower
    vocab_size=49408, hidden_size=1280, intermediate_size=5120, projection_dim=1280,
    num_hidden_layers=32, num_attention_heads=20, max_position_embeddings=77,
    hidden_act="gelu", layer_norm_eps=1e-5,
    bos_token_id=49406, eos_token_id=49407, pad_token_id=0,  # pad "!" = id 0
)

# --- tiny: same structure, small widths ---------------------------------------
TINY_TE1 = dict(FULL_TE1, hidden_size=32, intermediate_size=64, projection_dim=32,
                num_hidden_layers=3, num_attention_heads=4)
TINY_TE2 = dict(FULL_TE2, hidden_size=32, intermediate_size=64, projection_dim=32,
                num_hidden_layers=3, num_attention_heads=4)
TINY_TIME_DIM = 8
TINY_UNET = dict(
    FULL_UNET,
    sample_size=32,
    block_out_channels=(32, 64, 64),
    layers_per_block=2,
    norm_num_groups=16,
    transformer_layers_per_block=(1, 1, 2),
    attention_head_dim=(2, 4, 4),
    cross_attention_dim=TINY_TE1["hidden_size"] + TINY_TE2["hidden_size"],
    addition_time_embed_dim=TINY_TIME_DIM,
    projection_class_embeddings_input_dim=6 * TINY_TIME_DIM + TINY_TE2["projection_dim"],
)
TINY_VAE = dict(FULL_VAE, block_out_channels=(8, 16, 16, 16), layers_per_block=1,
                norm_num_groups=4, sample_size=256)


def architecture(arch: str) -> dict:
    """The configs --tiny ("tiny") or --random-full ("full") builds, by component."""
    tiny = arch == "tiny"
    te1, te2, unet, vae = (TINY_TE1, TINY_TE2, TINY_UNET, TINY_VAE) if tiny else (FULL_TE1, FULL_TE2, FULL_UNET, FULL_VAE)
    return {"scheduler": SDXL_SCHEDULER, "text_encoder": te1, "text_encoder_2": te2, "unet": unet, "vae": vae}


class PrintConfig(argparse.Action):
    """--print-config ARCH: print architecture(ARCH) as JSON and exit (no other argument needed)."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(json.dumps(architecture(values), indent=1))
        parser.exit()


def log(msg: str) -> None:
    print(msg, flush=True)


@contextlib.contextmanager
def build_context(device: str, dtype: torch.dtype):
    """Construct modules directly on `device` in `dtype` (no fp32 CPU copy first)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


def build_random_pipeline(kind: str, device: str, dtype: torch.dtype, seed: int, tok_dir: Path):
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    arch = architecture("tiny" if kind == "tiny" else "full")
    te1_cfg, te2_cfg, unet_cfg, vae_cfg = (arch[k] for k in ("text_encoder", "text_encoder_2", "unet", "vae"))
    torch.manual_seed(seed)
    if device == "cuda":
        torch.cuda.manual_seed_all(seed)
    t0 = time.time()
    with build_context(device, dtype):
        te1 = CLIPTextModel(CLIPTextConfig(**te1_cfg))
        te2 = CLIPTextModelWithProjection(CLIPTextConfig(**te2_cfg))
        unet = UNet2DConditionModel(**unet_cfg)
        vae = AutoencoderKL(**vae_cfg)
    mods = dict(text_encoder=te1, text_encoder_2=te2, unet=unet, vae=vae)
    for name, m in mods.items():
        if any(p.dtype != dtype or p.device.type != device for p in m.parameters()):
            m.to(device=device, dtype=dtype)
        m.eval().requires_grad_(False)
        log(f"  built {name}: {count_params(m) / 1e6:,.3f} M params ({time.time() - t0:.1f}s)")
    write_clip_tokenizer(tok_dir / "tokenizer", "<|endoftext|>")
    write_clip_tokenizer(tok_dir / "tokenizer_2", "!")
    tok1 = CLIPTokenizer.from_pretrained(str(tok_dir / "tokenizer"))
    tok2 = CLIPTokenizer.from_pretrained(str(tok_dir / "tokenizer_2"))
    sched = EulerDiscreteScheduler(**SDXL_SCHEDULER)
    pipe = StableDiffusionXLPipeline(
        vae=vae, text_encoder=te1, text_encoder_2=te2, tokenizer=tok1, tokenizer_2=tok2, unet=unet,
        scheduler=sched, force_zeros_for_empty_prompt=True, add_watermarker=False,
    )
    return pipe


def count_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


# --- wrappers ------------------------------------------------------------------
class _SharedChildren(nn.Module):
    """Registers the children of `inner` as its own (so the traced module's
    parameter names equal inner's state-dict keys) and calls inner's methods."""

    def __init__(self, inner: nn.Module, children: tuple[str, ...] | None = None):
        super().__init__()
        assert not list(inner.named_parameters(recurse=False)), "direct params not supported"
        assert not list(inner.named_buffers(recurse=False)), "direct buffers not supported"
        for n, m in inner.named_children():
            if children is None or n in children:
                self.add_module(n, m)
        object.__setattr__(self, "_inner", inner)  # not a registered submodule


class IPAttnProcessor:
    """The attn2 processor of forward_ip / forward_control_ip: diffusers' AttnProcessor2_0 plus
    sdpa(q, k_ip, v_ip) added to the text attention before to_out, as IPAdapterAttnProcessor2_0
    does for one adapter (there: + scale * sdpa(q, k_ip, v_ip); here the scale is in v_ip).
    `kv` is the side channel UNetTS sets around the inner call; with none it is AttnProcessor2_0.
    Not an nn.Module: it holds no parameters (the k/v projections run in ip_adapter.ts)."""

    def __init__(self):
        from diffusers.models.attention_processor import AttnProcessor2_0

        self.plain = AttnProcessor2_0()
        self.kv: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None,
                 *args, **kwargs):
        if self.kv is None:
            return self.plain(attn, hidden_states, encoder_hidden_states, attention_mask, temb, *args, **kwargs)
        # The UNet's transformer blocks call attn2 with 3-D hidden states, a text context, no mask,
        # and no spatial / group norm; anything else is not what this processor reproduces.
        assert hidden_states.ndim == 3 and encoder_hidden_states is not None and attention_mask is None
        assert attn.spatial_norm is None and attn.group_norm is None and attn.norm_q is None and attn.norm_k is None
        F = torch.nn.functional
        batch = encoder_hidden_states.shape[0]
        query = attn.to_q(hidden_states)
        if attn.norm_cross:
            encoder_hidden_states = attn.norm_encoder_hidden_states(encoder_hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)
        head_dim = key.shape[-1] // attn.heads

        def heads(x):  # x's own row count: an ip_kv of other rows than B errors, never reshuffles tokens
            return x.view(x.shape[0], -1, attn.heads, head_dim).transpose(1, 2)

        def merge(x):
            return x.transpose(1, 2).reshape(batch, -1, attn.heads * head_dim).to(query.dtype)

        query = heads(query)
        out = merge(F.scaled_dot_product_attention(query, heads(key), heads(value), dropout_p=0.0, is_causal=False))
        k_ip, v_ip = self.kv
        out = out + merge(F.scaled_dot_product_attention(query, heads(k_ip), heads(v_ip), dropout_p=0.0,
                                                         is_causal=False))
        out = attn.to_out[1](attn.to_out[0](out))
        if attn.residual_connection:
            out = out + hidden_states
        return out / attn.rescale_output_factor


def ip_attentions(unet) -> list[tuple[str, nn.Module]]:
    """The cross-attention layers an IP-Adapter reaches, in diffusers' order: every processor of
    unet.attn_processors whose name does not end in attn1.processor (motion modules aside), as
    _convert_ip_adapter_attn_to_diffusers walks them; the i-th is the file's ip_adapter.{2i+1}."""
    names = [n for n in unet.attn_processors if not n.endswith("attn1.processor") and "motion_modules" not in n]
    return [(n, unet.get_submodule(n.removesuffix(".processor"))) for n in names]


def ip_layout(unet) -> dict:
    """model.json unet.ip_adapter: each cross-attention layer's inner width (to_k out_features,
    the width of its k_l / v_l) and the text context width an adapter's to_k_ip reads."""
    return {"layers": [int(m.to_k.out_features) for _, m in ip_attentions(unet)],
            "cross_attention_dim": int(unet.config.cross_attention_dim)}


@contextlib.contextmanager
def ip_processors(unet, ip_kv: tuple, dtype):
    """IPAttnProcessor on every cross-attention layer with its (k, v) pair of ip_kv for the
    duration of one inner call; the original processors are put back after (so forward and
    forward_control trace exactly as without IP-Adapter support)."""
    layers = ip_attentions(unet)
    if len(ip_kv) != 2 * len(layers):
        raise ValueError(f"ip_kv has {len(ip_kv)} tensors; this UNet takes {2 * len(layers)} "
                         f"(a k and a v for each of its {len(layers)} cross-attention layers)")
    saved = [m.processor for _, m in layers]
    try:
        for i, (_, m) in enumerate(layers):
            proc = IPAttnProcessor()
            proc.kv = (ip_kv[2 * i].to(dtype), ip_kv[2 * i + 1].to(dtype))
            m.set_processor(proc)
        yield
    finally:
        for (_, m), proc in zip(layers, saved):
            m.set_processor(proc)


class UNetTS(_SharedChildren):
    def __init__(self, unet, dtype):
        super().__init__(unet)
        self._dtype = dtype

    def forward(self, latent, timestep, context, text_embeds, time_ids):
        dt = self._dtype
        return self._inner(
            latent.to(dt),
            timestep.to(torch.float32),
            encoder_hidden_states=context.to(dt),
            added_cond_kwargs={"text_embeds": text_embeds.to(dt), "time_ids": time_ids.to(dt)},
            return_dict=False,
        )[0]

    def forward_control(self, latent, timestep, context, text_embeds, time_ids, residuals: tuple):
        """forward plus a ControlNet's residuals: (down_0 .. down_{N-1}, mid), each cast to the model dtype."""
        dt = self._dtype
        res = [r.to(dt) for r in residuals]
        return self._inner(
            latent.to(dt),
            timestep.to(torch.float32),
            encoder_hidden_states=context.to(dt),
            added_cond_kwargs={"text_embeds": text_embeds.to(dt), "time_ids": time_ids.to(dt)},
            down_block_additional_residuals=tuple(res[:-1]),
            mid_block_additional_residual=res[-1],
            return_dict=False,
        )[0]

    def forward_ip(self, latent, timestep, context, text_embeds, time_ids, ip_kv: tuple):
        """forward with an IP-Adapter's per-layer (k, v) image tokens (ip_processors)."""
        with ip_processors(self._inner, ip_kv, self._dtype):
            return self.forward(latent, timestep, context, text_embeds, time_ids)

    def forward_control_ip(self, latent, timestep, context, text_embeds, time_ids, residuals: tuple, ip_kv: tuple):
        """forward_control with an IP-Adapter's per-layer (k, v) image tokens."""
        with ip_processors(self._inner, ip_kv, self._dtype):
            return self.forward_control(latent, timestep, context, text_embeds, time_ids, residuals)


def control_layout(unet_config) -> dict:
    """The residuals a ControlNet of this UNet gives, in diffusers' order: conv_in's output,
    then each resnet and down-sampler output of the down blocks, then the mid block's.
    {"residuals": N (down residuals), "channels": [c_0 .. c_{N-1}, c_mid],
     "downscales": [d_0 .. d_{N-1}, d_mid]} (downscale relative to the latent)."""
    blocks = list(unet_config["block_out_channels"])
    lpb = unet_config["layers_per_block"]
    lpb = [lpb] * len(blocks) if isinstance(lpb, int) else list(lpb)
    channels, downscales, scale = [blocks[0]], [1], 1
    for i, c in enumerate(blocks):
        channels += [c] * lpb[i]
        downscales += [scale] * lpb[i]
        if i < len(blocks) - 1:  # every down block but the last ends with a down-sampler
            scale *= 2
            channels.append(c)
            downscales.append(scale)
    return {"residuals": len(channels), "channels": channels + [blocks[-1]], "downscales": downscales + [scale]}


def residual_size(n: int, downscale: int) -> int:
    """A latent side of n after log2(downscale) stride-2 convolutions (kernel 3, padding 1)."""
    while downscale > 1:
        n, downscale = (n + 1) // 2, downscale // 2
    return n


def control_residuals(layout: dict, batch: int, lat_h: int, lat_w: int, dtype, device, gen) -> tuple:
    """Random residuals of the shapes `layout` gives for a latent of lat_h x lat_w."""
    return tuple((torch.randn(batch, c, residual_size(lat_h, d), residual_size(lat_w, d), generator=gen) * 0.5)
                 .to(device, dtype) for c, d in zip(layout["channels"], layout["downscales"]))


def ip_kv_inputs(layout: dict, batch: int, tokens: int, dtype, device, gen, v_zero: bool = False) -> tuple:
    """Random (k_0, v_0, ..) of the shapes forward_ip takes: [batch, tokens, C_l] per layer."""
    out = []
    for c in layout["layers"]:
        k = torch.randn(batch, tokens, c, generator=gen)
        v = torch.zeros(batch, tokens, c) if v_zero else torch.randn(batch, tokens, c, generator=gen)
        out += [k.to(device, dtype), v.to(device, dtype)]
    return tuple(out)


class VaeDecoderTS(_SharedChildren):
    def __init__(self, vae, dtype):
        super().__init__(vae, ("post_quant_conv", "decoder"))
        self._dtype = dtype

    def forward(self, z):
        return self._inner.decode(z.to(self._dtype), return_dict=False)[0]


class VaeEncoderTS(_SharedChildren):
    def __init__(self, vae, dtype):
        super().__init__(vae, ("encoder", "quant_conv"))
        self._dtype = dtype

    def forward(self, image):
        return self._inner.encode(image.to(self._dtype)).latent_dist.mean


class TextEncoderTS(nn.Module):
    """CLIPTextModel (transformers 5: embeddings/encoder/final_layer_norm at top level).
    Registered as `text_model` so names are the classic 'text_model.encoder.layers.N...'."""

    def __init__(self, te):
        super().__init__()
        self.text_model = te

    def forward(self, ids):
        out = self.text_model(ids, output_hidden_states=True, return_dict=True)
        return out.hidden_states[-2], out.pooler_output

    def hidden_states(self, ids):
        """Every hidden state (the embeddings', then each layer's, no final layer norm) stacked
        [layers + 1, B, 77, H], and the pooled output: what clip skip picks from."""
        out = self.text_model(ids, output_hidden_states=True, return_dict=True)
        return torch.stack(out.hidden_states), out.pooler_output


class TextEncoder2TS(nn.Module):
    """CLIPTextModelWithProjection: names 'text_model.encoder...' and 'text_projection.weight'."""

    def __init__(self, te2):
        super().__init__()
        self.text_model = te2.text_model
        self.text_projection = te2.text_projection

    def forward(self, ids):
        out = self.text_model(ids, output_hidden_states=True, return_dict=True)
        return out.hidden_states[-2], self.text_projection(out.pooler_output)

    def hidden_states(self, ids):
        """As TextEncoderTS.hidden_states, with the projected pooled output."""
        out = self.text_model(ids, output_hidden_states=True, return_dict=True)
        return torch.stack(out.hidden_states), self.text_projection(out.pooler_output)


class TextEncoder2Eager(nn.Module):
    """The reference path for encoder 2, exactly as the pipeline calls it."""

    def __init__(self, te2):
        super().__init__()
        self.te2 = te2

    def forward(self, ids):
        out = self.te2(ids, output_hidden_states=True)
        return out.hidden_states[-2], out[0]


class TextEncoderEager(nn.Module):
    def __init__(self, te):
        super().__init__()
        self.te = te

    def forward(self, ids):
        out = self.te(ids, output_hidden_states=True)
        return out.hidden_states[-2], out[1]


def trace_text_encoder(mod: nn.Module, eager: nn.Module, ids: torch.Tensor, path: Path, label: str,
                       prefix: str = "") -> list[str]:
    """Traces a text encoder wrapper's two methods into one module: forward(ids) -> (hidden_states[-2],
    pooled) and hidden_states(ids) -> (every hidden state stacked, pooled), which clip skip uses. The
    saved module must carry the eager encoder's parameter names, its hidden states must be the eager
    encoder's, and hidden_states(ids)[0][-2] must be forward(ids)[0]. Returns the tracer warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", category=torch.jit.TracerWarning)
        with torch.no_grad():
            ts = torch.jit.trace_module(mod, {"forward": (ids,), "hidden_states": (ids,)}, check_trace=False,
                                        strict=False)
    msgs = sorted({f"{Path(w.filename).name}:{w.lineno}: {str(w.message).splitlines()[0][:90]}"
                   for w in caught if issubclass(w.category, torch.jit.TracerWarning)})
    torch.jit.save(ts, str(path))
    check_names(path, eager, ids.device.type, label, prefix)
    loaded = torch.jit.load(str(path), map_location=ids.device)
    with torch.no_grad():
        stacked, pooled = loaded.hidden_states(ids)
        hidden, pooled_fwd = loaded(ids)
        want = eager(ids, output_hidden_states=True).hidden_states
    tol = 1e-5 if stacked.dtype == torch.float32 else 1e-2
    scale = max(1.0, float(stacked.abs().max()))
    if stacked.shape[0] != len(want):
        raise SystemExit(f"{label}: hidden_states() gives {stacked.shape[0]} hidden states, the encoder {len(want)}")
    for name, a, b in (("hidden_states()", stacked, torch.stack(want)), ("hidden_states()[-2]", stacked[-2], hidden),
                       ("hidden_states() pooled", pooled, pooled_fwd)):
        d = float((a.float() - b.float()).abs().max())
        if not d <= tol * scale:
            raise SystemExit(f"{label}: {name} differs from the reference by {d:.3g} (tolerance {tol * scale:.3g})")
    return msgs


# --- example inputs -------------------------------------------------------------
def make_ids(batch: int, pad_id: int, gen: torch.Generator, device) -> torch.Tensor:
    ids = torch.full((batch, 77), pad_id, dtype=torch.int64)
    for b in range(batch):
        n = int(torch.randint(0, 76, (1,), generator=gen))
        ids[b, 0] = 49406
        if n:
            ids[b, 1 : 1 + n] = torch.randint(1, 49406, (n,), generator=gen)
        ids[b, 1 + n] = 49407
    return ids.to(device)


def unet_inputs(batch, width, height, k, ctx_dim, pooled_dim, dtype, device, gen):
    h, w = height // 8, width // 8
    lat = torch.randn(batch, 4, h, w, generator=gen).to(device, dtype)
    t = (torch.rand(batch, generator=gen) * 999).to(device, torch.float32)
    ctx = torch.randn(batch, 77 * k, ctx_dim, generator=gen).to(device, dtype)
    emb = torch.randn(batch, pooled_dim, generator=gen).to(device, dtype)
    tid = torch.tensor([[height, width, 0, 0, height, width]] * batch, dtype=torch.float32).to(device, dtype)
    return (lat, t, ctx, emb, tid)


# --- tracing -----------------------------------------------------------------------
def trace_module(mod: nn.Module, inputs: tuple | dict, path: Path):
    """Traces mod's forward on `inputs`, or each method of a {method: inputs} dict, into `path`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", category=torch.jit.TracerWarning)
        with torch.no_grad():
            if isinstance(inputs, dict):
                ts = torch.jit.trace_module(mod, inputs, check_trace=False, strict=False)
            else:
                ts = torch.jit.trace(mod, inputs, check_trace=False, strict=False)
    msgs = sorted({f"{Path(w.filename).name}:{w.lineno}: {str(w.message).splitlines()[0][:90]}"
                   for w in caught if issubclass(w.category, torch.jit.TracerWarning)})
    torch.jit.save(ts, str(path))
    return msgs


def check_names(ts_path: Path, ref: nn.Module, device: str, label: str, prefix: str = "") -> None:
    """The traced module must carry every parameter (none baked as constants) under the same names."""
    ts = torch.jit.load(str(ts_path), map_location=device)
    got = {n: p for n, p in ts.named_parameters()}
    want = {prefix + n: p for n, p in ref.named_parameters()}
    if set(got) != set(want):
        missing = sorted(set(want) - set(got))[:5]
        extra = sorted(set(got) - set(want))[:5]
        raise SystemExit(f"{label}: parameter names differ from the eager module (missing {missing}, extra {extra})")


# --- checks ------------------------------------------------------------------------------
class Checker:
    def __init__(self, dtype: torch.dtype, device: str):
        self.dtype = dtype
        self.device = device
        self.rtol = 1e-4 if dtype == torch.float32 else 2e-2
        self.results: list[dict] = []

    def _cmp(self, a, b):
        a = a.float()
        b = b.float()
        if a.shape != b.shape:
            return math.inf, float(b.abs().max()), False
        finite = bool(torch.isfinite(a).all()) == bool(torch.isfinite(b).all())
        d = float((a - b).abs().max()) if finite else math.inf
        scale = float(b.abs().max())
        return d, scale, finite and d <= self.rtol * max(1.0, scale)

    def run(self, module: str, key: dict, ts, eager, inputs: tuple):
        with torch.no_grad():
            t0 = time.perf_counter()
            out_t = ts(*inputs)
            t1 = time.perf_counter()
            out_e = eager(*inputs)
            t2 = time.perf_counter()
        if not isinstance(out_t, (tuple, list)):
            out_t, out_e = (out_t,), (out_e,)
        worst, ok, scale = 0.0, True, 0.0
        err = None
        try:
            for a, b in zip(out_t, out_e):
                d, s, good = self._cmp(a, b)
                worst, scale, ok = max(worst, d), max(scale, s), ok and good
        except Exception as e:  # noqa: BLE001
            ok, err = False, str(e)[:200]
        r = dict(module=module, **key, max_abs_diff=worst, ref_abs_max=scale, ok=ok,
                 ts_s=round(t1 - t0, 3), eager_s=round(t2 - t1, 3))
        if err:
            r["error"] = err
        self.results.append(r)
        return out_t

    def run_safe(self, module, key, ts, eager, inputs):
        try:
            return self.run(module, key, ts, eager, inputs)
        except Exception as e:  # noqa: BLE001  (a traced graph that cannot run a shape)
            self.results.append(dict(module=module, **key, max_abs_diff=math.inf, ok=False, error=str(e).split("\n")[0][:200]))
            return None


def check_unet(chk: Checker, ts, unet, unet_cases: list, control_cases: list, ctx_dim: int, pdim: int, gen) -> None:
    """unet.ts vs the same wrapper run eagerly: forward at every case; forward_control, forward_ip and
    forward_control_ip at the control cases (random residuals; random ip_kv of 4 and 16 tokens, in turn);
    and forward_ip with v = 0 (it adds exact zeros) == forward, bit for bit."""
    dtype, device = chk.dtype, chk.device
    eager = UNetTS(unet, dtype)
    layout, ip = control_layout(unet.config), ip_layout(unet)
    n_ip = 0
    for (b, w, h, k) in unet_cases:
        inp = unet_inputs(b, w, h, k, ctx_dim, pdim, dtype, device, gen)
        key = dict(batch=b, width=w, height=h, chunks=k)
        got = chk.run_safe("unet.ts", key, ts, eager, inp)
        if (b, w, h, k) not in control_cases:
            continue
        res = control_residuals(layout, b, h // 8, w // 8, dtype, device, gen)
        chk.run_safe("unet.ts forward_control", key, ts.forward_control, eager.forward_control, inp + (res,))
        kv = ip_kv_inputs(ip, b, 4 if n_ip % 2 == 0 else 16, dtype, device, gen)
        key_ip = dict(key, tokens=kv[0].shape[1])
        chk.run_safe("unet.ts forward_ip", key_ip, ts.forward_ip, eager.forward_ip, inp + (kv,))
        chk.run_safe("unet.ts forward_control_ip", key_ip, ts.forward_control_ip, eager.forward_control_ip,
                     inp + (res, kv))
        if n_ip == 0 and got is not None:
            zero = ip_kv_inputs(ip, b, 4, dtype, device, gen, v_zero=True)
            with torch.no_grad():
                d = float((ts.forward_ip(*inp, zero).float() - got[0].float()).abs().max())
            chk.results.append(dict(module="unet.ts forward_ip (v = 0) vs forward", **key, max_abs_diff=d, ok=d == 0.0))
        n_ip += 1


def run_checks(level: str, tiny: bool, out: Path, pipe, dtype, vae_dtype, device, dims) -> tuple[Checker, Checker]:
    t0 = time.time()
    gen = torch.Generator().manual_seed(1234)
    chk = Checker(dtype, device)
    vchk = Checker(vae_dtype, device)
    h1, h2, pdim = dims["h1"], dims["h2"], dims["pooled"]
    load = lambda f: torch.jit.load(str(out / f), map_location=device)  # noqa: E731

    # text encoders: trace vs eager, and each row at batch 4 == the same ids at batch 1
    te_batches = [1, 2, 3, 4] if level == "quick" else list(range(1, 17))
    for fname, eager, pad in (
        ("text_encoder.ts", TextEncoderEager(pipe.text_encoder), 49407),
        ("text_encoder_2.ts", TextEncoder2Eager(pipe.text_encoder_2), 0),
    ):
        ts = load(fname)
        for b in te_batches:
            chk.run_safe(fname, dict(batch=b), ts, eager, (make_ids(b, pad, gen, device),))
        ids4 = make_ids(4, pad, gen, device)
        with torch.no_grad():
            full = ts(ids4)
            worst = 0.0
            for i in range(4):
                one = ts(ids4[i : i + 1])
                for a, b in zip(one, full):
                    worst = max(worst, float((a.float() - b[i : i + 1].float()).abs().max()))
        chk.results.append(dict(module=fname, batch_consistency="1 vs 4", max_abs_diff=worst,
                                ok=worst <= chk.rtol * 10))

    # UNet and VAE shapes
    odd = [(264, 200), (520, 776), (1000, 1032), (1032, 520)]  # multiples of 8 px, not of 32
    if level == "quick":
        if tiny:
            unet_cases = [(1, 256, 256, 1), (2, 264, 200, 2), (3, 256, 384, 1), (1, 1032, 264, 1)]
            vae_cases = [(1, 256, 256), (2, 264, 200), (1, 264, 520)]
        else:
            unet_cases = [(1, 1024, 1024, 1), (2, 832, 1216, 2), (3, 520, 776, 1), (2, 1000, 1032, 2)]
            vae_cases = [(1, 1024, 1024), (2, 520, 776)]
    else:
        # tiny runs on CPU (CI): sweep one dimension with the other small; the batch sweep at
        # the smallest size. The real sizes are checked on the device the model runs on.
        fixed = 256 if tiny else 1024
        sweep = list(range(512, 1536 + 1, 64))
        unet_cases = [(b, fixed, fixed, 1) for b in list(range(1, 9)) + [16]]
        unet_cases += [(2, fixed, fixed, k) for k in (1, 2, 3, 4)]
        unet_cases += [(1, w, fixed, 1) for w in sweep] + [(1, fixed, h, 1) for h in sweep]
        unet_cases += [(2, w, h, 2) for (w, h) in odd] + [(1, 1536, 1536, 1), (1, 256, 256, 1)]
        vae_cases = [(b, fixed, fixed) for b in range(1, 9)]
        vae_cases += [(1, w, fixed) for w in sweep] + [(1, fixed, h) for h in sweep]
        vae_cases += [(1, w, h) for (w, h) in odd] + [(1, 256, 256)] + ([] if tiny else [(1, 1536, 1536)])

    log(f"  checked text encoders ({time.time() - t0:.1f}s)")
    control_cases = unet_cases if level == "quick" else unet_cases[::4]
    check_unet(chk, load("unet.ts"), pipe.unet, unet_cases, control_cases, h1 + h2, pdim, gen)
    log(f"  checked unet: {len(unet_cases)} shapes, forward_control / forward_ip / forward_control_ip "
        f"{len(control_cases)} ({time.time() - t0:.1f}s)")

    vae = pipe.vae
    dec_ts, dec_e = load("vae_decoder.ts"), VaeDecoderTS(vae, vae_dtype)
    enc_ts, enc_e = load("vae_encoder.ts"), VaeEncoderTS(vae, vae_dtype)
    for (b, w, h) in vae_cases:
        z = torch.randn(b, 4, h // 8, w // 8, generator=gen).to(device, vae_dtype)
        vchk.run_safe("vae_decoder.ts", dict(batch=b, width=w, height=h), dec_ts, dec_e, (z,))
        img = (torch.rand(b, 3, h, w, generator=gen) * 2 - 1).to(device, vae_dtype)
        vchk.run_safe("vae_encoder.ts", dict(batch=b, width=w, height=h), enc_ts, enc_e, (img,))
    log(f"  checked vae decoder + encoder: {len(vae_cases)} shapes each ({time.time() - t0:.1f}s)")
    return chk, vchk


def settle_limits(limits: dict, results: list[dict]) -> list[str]:
    """Narrow limits where a shape failed; return notes."""
    notes = []
    bad = [r for r in results if not r["ok"]]
    if not bad:
        return notes
    for r in bad:
        if r["module"].startswith("text_encoder"):
            raise SystemExit(f"text encoder check failed: {r}")
    sized = [r for r in bad if "width" in r]
    if any(r["width"] % 32 or r["height"] % 32 for r in sized) and not any(
        r["width"] % 32 == 0 and r["height"] % 32 == 0 for r in sized
    ):
        limits["size_multiple"] = 32 if not any(r["width"] % 64 == 0 and r["height"] % 64 == 0 for r in sized) else 64
        notes.append(f"sizes not multiple of 32 px failed -> size_multiple {limits['size_multiple']}")
        sized = [r for r in sized if r["width"] % 32 == 0 and r["height"] % 32 == 0]
    for r in sized:
        if r.get("batch", 1) > 1 and r["width"] == r["height"]:
            limits["batch_max"] = min(limits["batch_max"],
                                      max(1, (r["batch"] - 1) // (2 if r["module"].startswith("unet.ts") else 1)))
            notes.append(f"{r['module']} failed at batch {r['batch']} -> batch_max {limits['batch_max']}")
        else:
            for dim in ("width", "height"):
                if r[dim] > 1024:
                    limits[f"{dim}_max"] = min(limits[f"{dim}_max"], r[dim] - limits["size_multiple"])
                elif r[dim] < 1024:
                    limits[f"{dim}_min"] = max(limits[f"{dim}_min"], r[dim] + limits["size_multiple"])
            notes.append(f"{r['module']} failed at {r['width']}x{r['height']}: {r.get('error', 'diff too large')}")
    return notes


def summarize_checks(results: list[dict]) -> dict:
    per = {}
    for r in results:
        m = r["module"] + (" (batch consistency)" if "batch_consistency" in r else "")
        s = per.setdefault(m, dict(cases=0, failed=0, max_abs_diff=0.0))
        s["cases"] += 1
        s["failed"] += 0 if r["ok"] else 1
        s["max_abs_diff"] = max(s["max_abs_diff"], r["max_abs_diff"])
    return per


# --- AOTInductor ----------------------------------------------------------------------------
@contextlib.contextmanager
def upsample_to_skip_size(unet):
    """diffusers picks the up-sampler path with `any(dim % 2**num_upsamplers)` on the latent
    size; under torch.export with a dynamic size that is a guard no size range satisfies.
    A factor no latent size can be a multiple of makes it always take the
    forward_upsample_size path -- the one unet.ts was traced on (see the module docstring),
    which interpolates to each skip connection's size."""
    n = unet.num_upsamplers
    unet.num_upsamplers = 40  # 2**40: no latent size in the limits is a multiple of it
    try:
        yield
    finally:
        unet.num_upsamplers = n


def parse_aoti_size(text: str | None, limits: dict, vae_down: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Latent (height, width) ranges: the model's limits, or one fixed WxH in pixels."""
    if not text or text == "dynamic":
        return ((limits["height_min"] // vae_down, limits["height_max"] // vae_down),
                (limits["width_min"] // vae_down, limits["width_max"] // vae_down))
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--aoti-size: '{text}' is not 'dynamic' or WIDTHxHEIGHT in pixels (e.g. 1024x1024)")
    for name, v, lo, hi in (("width", w, limits["width_min"], limits["width_max"]),
                            ("height", h, limits["height_min"], limits["height_max"])):
        if v % limits["size_multiple"] or not lo <= v <= hi:
            raise SystemExit(f"--aoti-size: {name} {v} must be a multiple of {limits['size_multiple']} "
                             f"in [{lo}, {hi}] (the model's limits)")
    return ((h // vae_down, h // vae_down), (w // vae_down, w // vae_down))


def parse_inductor_configs(items: list[str]) -> dict:
    """--aoti-config KEY=VALUE (VALUE as a Python literal, else a string)."""
    import ast

    cfg = {}
    for it in items:
        if "=" not in it:
            raise SystemExit(f"--aoti-config: '{it}' is not KEY=VALUE")
        k, v = it.split("=", 1)
        try:
            cfg[k.strip()] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            cfg[k.strip()] = v
    return cfg


def export_unet_aoti(unet, dtype, device: str, out_dir: Path, limits: dict, vae_down: int, ctx_dim: int,
                     pdim: int, size: str | None, extra_configs: dict, gen: torch.Generator,
                     file: str = "unet.pt2", fp16_reference: torch.nn.Module | None = None) -> dict:
    """torch.export the UNet wrapper with a dynamic batch (1 .. 2*batch_max rows: CFG doubles
    them), context length (77 .. 77*context_chunks_max tokens) and latent size (the limits, or
    one fixed size), compile it with AOTInductor into out_dir/unet.pt2 without its weights,
    and return what model.json records under unet.aoti (`file`: unet.pt2, or unet_fp8.pt2
    for the FP8 UNet). The package must match the eager wrapper at the range's corners within
    the dtype's max-abs tolerance; the FP8 UNet (fp16_reference: the UNet before quantisation)
    instead must be as near to the fp16 UNet as the eager FP8 UNet is (relative L2 within 1.5x
    of the eager one's): its input quantisation turns a fused kernel's different rounding into
    whole FP8 levels (measured on the H200: compiled vs eager FP8 rel. L2 0.025, eager FP8 vs
    fp16 0.039), so the two FP8 UNets are two roundings of one model, not one the other's copy."""
    import torch._inductor

    (h_lo, h_hi), (w_lo, w_hi) = parse_aoti_size(size, limits, vae_down)
    rows_max = 2 * limits["batch_max"]
    tok_max = 77 * limits["context_chunks_max"]
    # Example: batch 2, two chunks, a latent size inside the range that is not a multiple of 4
    # (sizes equal to a bound of a range, or to 1, would be specialised by export).
    def example(lo, hi):
        if lo == hi:
            return lo
        v = min(lo + 1, hi)
        return v + 1 if v % 4 == 0 and v + 1 <= hi else v
    lh, lw = example(h_lo, h_hi), example(w_lo, w_hi)
    k = 2 if tok_max >= 154 else 1
    inp = unet_inputs(2, lw * vae_down, lh * vae_down, k, ctx_dim, pdim, dtype, device, gen)
    Dim = torch.export.Dim
    rows = Dim("rows", min=1, max=rows_max)
    tokens = Dim("tokens", min=77, max=tok_max) if tok_max > 77 else None
    hd = Dim("latent_h", min=h_lo, max=h_hi) if h_hi > h_lo else None
    wd = Dim("latent_w", min=w_lo, max=w_hi) if w_hi > w_lo else None
    dynamic = tuple({i: d for i, d in dims.items() if d is not None}
                    for dims in ({0: rows, 2: hd, 3: wd}, {0: rows}, {0: rows, 1: tokens}, {0: rows}, {0: rows}))
    wrapper = UNetTS(unet, dtype).eval()
    t0 = time.time()
    with upsample_to_skip_size(unet), torch.no_grad():
        ep = torch.export.export(wrapper, inp, dynamic_shapes=dynamic, strict=False)
    t_export = time.time() - t0
    log(f"  torch.export unet: {t_export:.1f}s (rows 1..{rows_max}, tokens 77..{tok_max}, "
        f"latent {h_lo}..{h_hi} x {w_lo}..{w_hi})")
    configs = {}
    if file == "unet_fp8.pt2":
        # Inductor inlines 0-dim constants (the FP8 scales) as literals, and an extern kernel
        # (_scaled_mm) then needs each as a new tensor constant ("constantNNNN") that is no
        # parameter of the UNet, which the package's user-managed weights cannot provide
        # (found on the H200: the load check refused unet_fp8.pt2). Kept as the named buffers.
        configs["always_keep_tensor_constants"] = True
    configs.update(extra_configs)
    pkg, t_compile, configs, cxx_wrapper = compile_package(ep, out_dir / file, configs)

    corners = {(1, h_lo, w_lo, 1), (2, lh, lw, k), (rows_max, h_lo, w_lo, 1), (1, h_hi, w_hi, tok_max // 77)}
    inputs = {(b, hh, ww, kk): unet_inputs(b, ww * vae_down, hh * vae_down, kk, ctx_dim, pdim, dtype, device, gen)
              for (b, hh, ww, kk) in corners}
    n_constants, checks = check_aoti_package(pkg, file, wrapper, inputs, dtype, fp16_reference)
    if not all(c["ok"] for c in checks):
        raise SystemExit(f"{file} does not match the eager UNet (see the check lines above)")
    ranges = {"rows": [1, rows_max], "tokens": [77, tok_max], "latent_height": [h_lo, h_hi],
              "latent_width": [w_lo, w_hi]}
    return package_meta(file, device, dtype, ranges, n_constants, configs,
                        {"export": round(t_export, 1), "compile": round(t_compile, 1)}, checks, cxx_wrapper)


def compile_package(ep, path: Path, configs: dict) -> tuple[str, float, dict, bool]:
    """aoti_compile_and_package of exported program `ep` into `path`, without its weights
    (sdxl-batch hands it the TorchScript module's tensors) and with `configs`; returns the
    package's path, the compile seconds, the Inductor configs used and whether the C++ code
    was linked through the shared-libstdc++ wrapper."""
    import torch._inductor

    configs = {"aot_inductor.package_constants_in_so": False, **configs}
    # A compiler with only a static libstdc++ would put a second copy into the .so,
    # which then crashes at load (scripts/aoti_toolchain.py says why).
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from aoti_toolchain import use_shared_libstdcxx
    cxx_wrapper = use_shared_libstdcxx(log=lambda m: log("  " + m))
    t0 = time.time()
    pkg = torch._inductor.aoti_compile_and_package(ep, package_path=str(path), inductor_configs=configs)
    t_compile = time.time() - t0
    log(f"  aoti_compile_and_package {path.name}: {t_compile:.1f}s, {Path(pkg).stat().st_size / 2**20:.1f} MiB "
        f"(weights not included)")
    return pkg, t_compile, configs, bool(cxx_wrapper)


def package_meta(file: str, device: str, dtype, ranges: dict, n_constants: int, configs: dict, seconds: dict,
                 checks: list, cxx_wrapper: bool) -> dict:
    """What model.json records of an AOTI package (docs/models-and-export.md)."""
    return {
        "file": file,
        "device": device,
        **({"gpu": torch.cuda.get_device_name(torch.device(device)),
            "capability": "{}.{}".format(*torch.cuda.get_device_capability(torch.device(device)))}
           if device.startswith("cuda") else {}),
        "dtype": {v: k for k, v in DTYPES.items()}[dtype],
        **ranges,
        "constants": n_constants,
        "inductor_configs": {k: repr(v) if not isinstance(v, (bool, int, float, str)) else v
                             for k, v in configs.items()},
        "seconds": seconds,
        "checks": checks,
        "libstdcxx": "shared (linked through a wrapper)" if cxx_wrapper else "the compiler's default",
    }


def export_vae_decoder_aoti(vae, dtype, device: str, out_dir: Path, size: str | None, limits: dict, vae_down: int,
                            default_size: tuple[int, int], extra_configs: dict, gen: torch.Generator) -> dict | None:
    """torch.export the VAE decoder wrapper in `dtype` (the model's compute dtype, which
    sdxl-batch decodes in on a GPU) for one image of one size: --aoti-size when it is fixed,
    else the model's default (width, height): a package for one size decodes faster than one
    for any size (docs/models-and-export.md#aotinductor-vae-decoder), and a night's images
    mostly share one. Compiles it into out_dir/vae_decoder.pt2 without weights (its constants are
    vae_decoder.ts's tensors, cast to `dtype` by sdxl-batch) and checks it against the eager
    decoder within the dtype's tolerance. Returns model.json's vae_decoder.aoti, or None
    (the package deleted, the export goes on without it) when the check fails."""
    if size and size != "dynamic":
        (lh, _), (lw, _) = parse_aoti_size(size, limits, vae_down)
    else:
        lh, lw = default_size[1] // vae_down, default_size[0] // vae_down
    dec = VaeDecoderTS(copy.deepcopy(vae).to(dtype), dtype).eval()
    z = torch.randn(1, vae.config.latent_channels, lh, lw, generator=gen).to(device, dtype)
    t0 = time.time()
    with torch.no_grad():
        ep = torch.export.export(dec, (z,), strict=False)
    t_export = time.time() - t0
    log(f"  torch.export vae_decoder: {t_export:.1f}s (latent {lh}x{lw}, images {lw * vae_down}x{lh * vae_down})")
    pkg, t_compile, configs, cxx_wrapper = compile_package(ep, out_dir / "vae_decoder.pt2", dict(extra_configs))
    n_constants, checks = check_aoti_package(pkg, "vae_decoder.pt2", dec, {(1, lh, lw, 0): (z,)}, dtype, None)
    if not all(c["ok"] for c in checks):
        log("  vae_decoder.pt2 does not match the eager decoder (see the check line above): not kept; "
            "sdxl-batch decodes with vae_decoder.ts")
        (out_dir / "vae_decoder.pt2").unlink()
        return None
    ranges = {"rows": [1, 1], "latent_height": [lh, lh], "latent_width": [lw, lw]}
    return package_meta("vae_decoder.pt2", device, dtype, ranges, n_constants, configs,
                        {"export": round(t_export, 1), "compile": round(t_compile, 1)}, checks, cxx_wrapper)


def package_check_row(got: torch.Tensor, want: torch.Tensor, ref16: torch.Tensor | None, dtype) -> dict:
    """One corner of an AOTI package's check: its output `got` against the eager wrapper's
    `want`. Without ref16: max |diff| within the dtype's tolerance (1e-4 fp32, 2e-2 otherwise,
    of max(1, |want|)). With ref16 (the FP8 package; the fp16 UNet's output): as near to it as
    the eager FP8 UNet is, relative L2 within 1.5x + 0.002 (export_unet_aoti says why)."""
    got, want = got.float(), want.float()
    diff = got - want
    row = dict(max_abs_diff=float(diff.abs().max()), rel_l2=float(diff.norm() / want.norm().clamp_min(1e-12)),
               ref_abs_max=float(want.abs().max()))
    if ref16 is None:
        rtol = 1e-4 if dtype == torch.float32 else 2e-2
        close = row["max_abs_diff"] <= rtol * max(1.0, row["ref_abs_max"])
    else:
        n16 = ref16.float().norm().clamp_min(1e-12)
        row["rel_l2_vs_fp16"] = float((got - ref16.float()).norm() / n16)
        row["eager_rel_l2_vs_fp16"] = float((want - ref16.float()).norm() / n16)
        close = row["rel_l2_vs_fp16"] <= 1.5 * row["eager_rel_l2_vs_fp16"] + 2e-3
    row["ok"] = bool(torch.isfinite(got).all()) and close
    return row


def check_aoti_package(pkg: str, file: str, wrapper, inputs: dict, dtype,
                       fp16_reference: torch.nn.Module | None) -> tuple[int, list[dict]]:
    """Loads the package as sdxl-batch does (constants = the wrapper's own parameters and
    buffers, user-managed) and checks it on each of `inputs` ({(rows, latent_h, latent_w,
    chunks): UNet inputs}) with package_check_row; returns (constants, rows)."""
    log(f"  loading {file} (aoti_load_package) for its check")
    runner = torch._inductor.aoti_load_package(pkg)
    params = dict(wrapper.named_parameters())
    params.update(dict(wrapper.named_buffers()))
    fqns = set(runner.get_constant_fqns())
    if not fqns <= set(params):
        raise SystemExit(f"{file}: constants that are no parameter of the UNet: {sorted(fqns - set(params))[:5]}")
    runner.load_constants({n: params[n] for n in fqns}, check_full_update=True, user_managed=True)
    checks = []
    for (b, hh, ww, kk), x in inputs.items():
        with torch.no_grad():
            got = runner(*x)
            got = got[0] if isinstance(got, (list, tuple)) else got
            want = wrapper(*x)
            ref16 = fp16_reference(*x) if fp16_reference is not None else None
        row = dict(rows=b, latent_h=hh, latent_w=ww, **({"tokens": 77 * kk} if kk else {}),
                   **package_check_row(got, want, ref16, dtype))
        checks.append(row)
        vs16 = (f"; vs the fp16 UNet {row['rel_l2_vs_fp16']:.3g} (eager FP8 {row['eager_rel_l2_vs_fp16']:.3g})"
                if ref16 is not None else "")
        log(f"  check {file} rows {b:2d} latent {hh}x{ww}{f' tokens {77 * kk}' if kk else ''}: "
            f"max|diff| {row['max_abs_diff']:.3g} "
            f"(|ref| {row['ref_abs_max']:.3g}), rel. L2 {row['rel_l2']:.3g}{vs16} {'ok' if row['ok'] else 'FAILED'}")
    del runner
    return len(fqns), checks


# --- FP8 ----------------------------------------------------------------------------------
def read_prompts(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise SystemExit(f"--fp8-prompts {path}: {e.strerror}")
    prompts = [l.strip() for l in lines if l.strip() and not l.lstrip().startswith("#")]
    if not prompts:
        raise SystemExit(f"--fp8-prompts {path}: no prompt in it (one per line, '#' starts a comment)")
    return prompts


def export_unet_fp8(a, pipe, tmp: Path, dtype, device: str, defaults: dict, trace_inputs: tuple, timings: dict,
                    aoti_args: dict) -> dict:
    """Calibrates, quantises pipe.unet in place (scripts/fp8_quant.py), traces unet_fp8.ts with
    unet.ts's methods, checks it against the eager FP8 UNet, compiles unet_fp8.pt2 with --aoti;
    returns model.json's unet.fp8."""
    import fp8_quant  # scripts/ is on sys.path (see the imports)

    unet = pipe.unet
    inp, res, kv = trace_inputs
    prompts = read_prompts(Path(a.fp8_prompts))
    steps = a.fp8_steps or defaults["steps"]
    names = fp8_quant.fp8_layer_names(unet)
    pipe.set_progress_bar_config(disable=True)
    ref = UNetTS(unet, dtype)(*inp)
    t0 = time.time()
    amax = fp8_quant.calibrate(pipe, names, prompts, steps, defaults["width"], defaults["height"], defaults["cfg"],
                               seed=1234)
    timings["fp8_calibrate"] = time.time() - t0
    aoti_fp8 = a.aoti and "fp8" in a.aoti_variants
    unet16 = copy.deepcopy(unet) if aoti_fp8 else None  # the reference of unet_fp8.pt2's check
    n = fp8_quant.quantize_unet(unet, amax)  # in place: every later use of pipe.unet is the FP8 UNet
    wrapper = UNetTS(unet, dtype)
    got = wrapper(*inp)
    rel = float((got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12))
    log(f"  fp8: {n} linear layers quantised, calibrated on {len(prompts)} prompts x {steps} steps at "
        f"{defaults['width']}x{defaults['height']} ({timings['fp8_calibrate']:.1f}s); "
        f"rel. L2 vs the {a.dtype or 'model'} UNet on the trace inputs {rel:.4f}")
    t0 = time.time()
    trace_module(wrapper, {"forward": inp, "forward_control": inp + (res,), "forward_ip": inp + (kv,),
                           "forward_control_ip": inp + (res, kv)}, tmp / "unet_fp8.ts")
    check_names(tmp / "unet_fp8.ts", unet, device, "unet_fp8")
    ts = torch.jit.load(str(tmp / "unet_fp8.ts"), map_location=device)
    chk = Checker(dtype, device)
    key = dict(batch=int(inp[0].shape[0]), width=int(inp[0].shape[3]) * 8, height=int(inp[0].shape[2]) * 8)
    chk.run("unet_fp8.ts", key, ts, wrapper, inp)
    chk.run("unet_fp8.ts forward_control", key, ts.forward_control, wrapper.forward_control, inp + (res,))
    chk.run("unet_fp8.ts forward_ip", key, ts.forward_ip, wrapper.forward_ip, inp + (kv,))
    chk.run("unet_fp8.ts forward_control_ip", key, ts.forward_control_ip, wrapper.forward_control_ip,
            inp + (res, kv))
    if not all(r["ok"] for r in chk.results):
        raise SystemExit("unet_fp8.ts does not match the eager FP8 UNet: " + json.dumps(chk.results)[:400])
    del ts
    timings["trace_unet_fp8"] = time.time() - t0
    meta = {"file": "unet_fp8.ts", "format": fp8_quant.FORMAT, "layers": n,
            "calibration": {"prompts": len(prompts), "negatives": list(fp8_quant.CALIBRATION_NEGATIVES),
                            "prompts_sha256": hashlib.sha256(
                "\n".join(prompts).encode()).hexdigest(), "steps": steps, "width": defaults["width"],
                "height": defaults["height"], "cfg": defaults["cfg"], "seconds": round(timings["fp8_calibrate"], 1)},
            "rel_l2_vs_unet_on_trace_inputs": round(rel, 5)}
    if aoti_fp8:
        t0 = time.time()
        meta["aoti"] = export_unet_aoti(unet, dtype, device, tmp, aoti_args["limits"], aoti_args["vae_down"],
                                        aoti_args["ctx_dim"], aoti_args["pdim"], a.aoti_size,
                                        parse_inductor_configs(a.aoti_config), aoti_args["gen"], file="unet_fp8.pt2",
                                        fp16_reference=UNetTS(unet16, dtype).eval())
        del unet16
        timings["aoti_unet_fp8"] = time.time() - t0
    return meta


# --- real weights: a diffusers folder or a single-file checkpoint, and a VAE -------------
def copy_tokenizers(src_dir: Path | None, tmp: Path, pads: tuple[str, str]) -> None:
    """tokenizer/ and tokenizer_2/ in the export: src_dir's vocabulary where it has one,
    else open-clip's (the one SDXL uses)."""
    for sub, pad in zip(("tokenizer", "tokenizer_2"), pads):
        write_clip_tokenizer(tmp / sub, pad)
        for f in ("vocab.json", "merges.txt"):
            if src_dir is not None and (src_dir / sub / f).is_file():
                shutil.copyfile(src_dir / sub / f, tmp / sub / f)
            elif src_dir is not None:
                log(f"  warning: {src_dir / sub / f} missing; using open-clip's {f}")


def configs_of(config_dir: Path | None) -> dict:
    """The architecture of a single-file checkpoint: SDXL base's, or config_dir's (a diffusers
    folder; only its config files are read)."""
    if config_dir is None:
        return architecture("full")
    out = {}
    for key, rel in (("unet", "unet/config.json"), ("vae", "vae/config.json"),
                     ("text_encoder", "text_encoder/config.json"), ("text_encoder_2", "text_encoder_2/config.json"),
                     ("scheduler", "scheduler/scheduler_config.json")):
        f = config_dir / rel
        if not f.is_file():
            raise SystemExit(f"--config {config_dir}: {rel} is missing (a diffusers-layout folder is needed)")
        out[key] = json.loads(f.read_text())
    return out


def tokenizer_pads(config_dir: Path | None) -> tuple[str, str]:
    pads = ["<|endoftext|>", "!"]
    for i, sub in enumerate(("tokenizer", "tokenizer_2")):
        f = config_dir / sub / "special_tokens_map.json" if config_dir else None
        if f is not None and f.is_file():
            pad = json.loads(f.read_text()).get("pad_token", pads[i])
            pads[i] = pad["content"] if isinstance(pad, dict) else pad
    return pads[0], pads[1]


def load_source(a, device: str, dtype: torch.dtype, tmp: Path):
    """--from DIR|FILE [--config DIR] [--vae FILE|DIR] -> (pipeline, name, source, model.json
    entries naming the files the weights came from)."""
    from checkpoint_file import load_checkpoint, load_vae, sha256_file, vae_weights_file
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline
    from transformers import CLIPTokenizer

    src = Path(a.from_path).resolve()
    config_dir = Path(a.config).resolve() if a.config else None
    vae_src = Path(a.vae).resolve() if a.vae else None
    meta = {}
    if src.is_dir():
        if config_dir:
            raise SystemExit("--config is for a single-file checkpoint; a diffusers folder has its own configs")
        pipe = StableDiffusionXLPipeline.from_pretrained(str(src), dtype=dtype, local_files_only=True)
        pipe.to(device)
        copy_tokenizers(src, tmp, (pipe.tokenizer.pad_token, pipe.tokenizer_2.pad_token))
        if vae_src:
            pipe.register_modules(vae=load_vae(vae_src, dict(pipe.vae.config), device, dtype, log))
    elif src.is_file():
        configs = configs_of(config_dir)
        parts = load_checkpoint(src, configs, device, dtype, need_vae=vae_src is None, log=log)
        copy_tokenizers(config_dir, tmp, tokenizer_pads(config_dir))
        toks = [CLIPTokenizer.from_pretrained(str(tmp / sub)) for sub in ("tokenizer", "tokenizer_2")]
        vae = load_vae(vae_src, configs["vae"], device, dtype, log) if vae_src else parts["vae"]
        pipe = StableDiffusionXLPipeline(vae=vae, text_encoder=parts["text_encoder"],
                                         text_encoder_2=parts["text_encoder_2"], tokenizer=toks[0], tokenizer_2=toks[1],
                                         unet=parts["unet"], scheduler=EulerDiscreteScheduler.from_config(configs["scheduler"]),
                                         force_zeros_for_empty_prompt=True, add_watermarker=False)
        meta["source_file"] = {"name": src.name, "sha256": sha256_file(src)}
    else:
        raise SystemExit(f"--from {src}: no such file or folder")
    weights = vae_weights_file(vae_src) if vae_src else None
    if weights is not None:
        meta["vae_file"] = {"name": weights.name, "sha256": sha256_file(weights)}
    for m in (pipe.text_encoder, pipe.text_encoder_2, pipe.unet, pipe.vae):
        m.eval().requires_grad_(False)
    name = src.stem if src.is_file() else src.name
    return pipe, name, f"from:{src}" + (f" vae:{vae_src}" if vae_src else ""), meta


def file_digests(folder: Path) -> dict:
    """Size and sha256 of every file under folder (model.json "files": --verify-model checks them)."""
    from checkpoint_file import sha256_file

    return {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted(folder.rglob("*")) if p.is_file()}


def publish(tmp: Path, out: Path) -> None:
    """Replace out by tmp atomically: readers see the old folder or the new one, never a mix."""
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)


def export_vae_only(a, dtype_name: str, dtype: torch.dtype, device: str, out: Path, tmp: Path) -> int:
    """--vae-only --vae FILE|DIR: a VAE folder that sdxl-batch swaps in per task ("vae" in a
    batch file, --vae on the CLI): vae_decoder.ts, vae_encoder.ts and model.json (kind "vae")."""
    from checkpoint_file import load_vae, sha256_file, vae_weights_file

    torch.set_grad_enabled(False)
    src = Path(a.vae).resolve()
    vae = load_vae(src, configs_of(Path(a.config).resolve() if a.config else None)["vae"], device, dtype, log)
    vae_dtype = torch.float32 if (dtype == torch.float16 and vae.config.force_upcast) else dtype
    vae.to(vae_dtype)
    down = 2 ** (len(vae.config.block_out_channels) - 1)
    chans = int(vae.config.latent_channels)
    gen = torch.Generator().manual_seed(99)
    z = torch.randn(1, chans, 11, 13, generator=gen).to(device, vae_dtype)
    img = (torch.rand(1, 3, 11 * down, 13 * down, generator=gen) * 2 - 1).to(device, vae_dtype)
    trace_module(VaeDecoderTS(vae, vae_dtype), (z,), tmp / "vae_decoder.ts")
    trace_module(VaeEncoderTS(vae, vae_dtype), (img,), tmp / "vae_encoder.ts")
    check_names(tmp / "vae_decoder.ts", VaeDecoderTS(vae, vae_dtype), device, "vae_decoder")
    check_names(tmp / "vae_encoder.ts", VaeEncoderTS(vae, vae_dtype), device, "vae_encoder")
    chk = Checker(vae_dtype, device)
    dec, enc = (torch.jit.load(str(tmp / f), map_location=device) for f in ("vae_decoder.ts", "vae_encoder.ts"))
    for (b, h, w) in ((1, 32, 32), (2, 33, 25)):
        chk.run_safe("vae_decoder.ts", dict(batch=b, width=8 * w, height=8 * h), dec, VaeDecoderTS(vae, vae_dtype),
                     (torch.randn(b, chans, h, w, generator=gen).to(device, vae_dtype),))
        chk.run_safe("vae_encoder.ts", dict(batch=b, width=8 * w, height=8 * h), enc, VaeEncoderTS(vae, vae_dtype),
                     ((torch.rand(b, 3, h * down, w * down, generator=gen) * 2 - 1).to(device, vae_dtype),))
    bad = [r for r in chk.results if not r["ok"]]
    if bad:
        raise SystemExit(f"the traced VAE does not match the eager one: {bad[0]}")
    weights = vae_weights_file(src)
    meta = {
        "format_version": 1, "kind": "vae", "name": src.stem if src.is_file() else src.name, "source": f"vae:{src}",
        "dtype": dtype_name, "vae_dtype": {v: k for k, v in DTYPES.items()}[vae_dtype], "export_device": device,
        "torch_version": torch.__version__, "vae_scaling_factor": float(vae.config.scaling_factor),
        "vae_downsample": down, "latent_channels": chans,
        "vae_decoder": {"file": "vae_decoder.ts"}, "vae_encoder": {"file": "vae_encoder.ts"},
        **({"vae_file": {"name": weights.name, "sha256": sha256_file(weights)}} if weights else {}),
        "check": {"level": "quick", "modules": summarize_checks(chk.results), "notes": []},
        "files": file_digests(tmp),
    }
    (tmp / "model.json").write_text(json.dumps(meta, indent=1) + "\n")
    publish(tmp, out)
    log(f"  wrote VAE {out} (decode dtype {meta['vae_dtype']}, scaling factor {meta['vae_scaling_factor']})")
    return 0


# --- main -------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tiny", action="store_true")
    src.add_argument("--random-full", action="store_true")
    src.add_argument("--vae-only", action="store_true",
                     help="export only the VAE given by --vae, as a VAE folder that tasks can swap in "
                          "(\"vae\" in a batch file, --vae on the CLI)")
    src.add_argument("--from", dest="from_path", metavar="DIR|FILE",
                     help="real weights: a diffusers SDXL folder, or a single-file checkpoint (.safetensors, the "
                          "original Stability / A1111 layout)")
    src.add_argument("--controlnet", metavar="DIR|FILE",
                     help="export one SDXL ControlNet (a diffusers folder, or a .safetensors file in the diffusers "
                          "or the original layout) as a ControlNet folder a task can name")
    src.add_argument("--ip-adapter", metavar="FILE",
                     help="export one SDXL IP-Adapter (.safetensors: image_proj.*, ip_adapter.*; plain or plus) "
                          "and its --image-encoder as an IP-Adapter folder a task can name")
    ap.add_argument("--print-config", choices=["tiny", "full"], action=PrintConfig,
                    help="print the diffusers / transformers configs and the scheduler config of the --tiny or "
                         "--random-full architecture as JSON, and exit")
    ap.add_argument("--config", metavar="DIR",
                    help="with --from FILE: the architecture as a diffusers-layout folder (configs, scheduler, "
                         "tokenizers; weights not needed); default: SDXL base 1.0's built-in configs. With "
                         "--controlnet FILE: the ControlNet's config.json (or a folder holding it, or a diffusers "
                         "SDXL folder whose unet/config.json the ControlNet is derived from)")
    ap.add_argument("--vae", metavar="FILE|DIR",
                    help="with --from: this VAE instead of the checkpoint's (a diffusers VAE folder, or a "
                         ".safetensors VAE file in the original or the diffusers layout)")
    ap.add_argument("--image-encoder", metavar="DIR",
                    help="with --ip-adapter: the CLIP vision encoder it was trained with, a transformers folder "
                         "(config.json + model.safetensors, CLIPVisionModelWithProjection)")
    ap.add_argument("--dtype", choices=sorted(DTYPES))
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-diffusers", metavar="DIR")
    ap.add_argument("--check", choices=["none", "quick", "full"], default="quick")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--json-report", metavar="FILE", help="write every check result here")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: 1 for --tiny on cpu, whose tensors are too small to gain "
                         "from more and which runs >10x slower with OpenMP on a busy 2-core box; else torch's)")
    ap.add_argument("--aoti", action="store_true",
                    help="also compile the UNet with torch.export + AOTInductor into unet.pt2 (minutes; "
                         "for --device; run it with sdxl-batch --unet-backend aoti)")
    ap.add_argument("--aoti-size", metavar="dynamic|WxH", default="dynamic",
                    help="latent size of unet.pt2: dynamic within the model's limits (default), or one "
                         "fixed size in pixels, e.g. 1024x1024 (other sizes then run on unet.ts)")
    ap.add_argument("--aoti-config", metavar="KEY=VALUE", action="append", default=[],
                    help="extra torch._inductor config for the AOTI compile (repeatable), "
                         "e.g. max_autotune=True")
    ap.add_argument("--batch-max", type=int, metavar="N", default=8,
                    help="images per UNet call the model is made for (default 8; model.json limits.batch_max): "
                         "sdxl-batch caps --max-batch at it, and the AOTI packages take 1 .. 2*N rows (CFG)")
    ap.add_argument("--fp8", action="store_true",
                    help="also write unet_fp8.ts: the transformer blocks' linear layers in FP8 e4m3 with scales "
                         "calibrated on --fp8-prompts (sdxl-batch --precision fp8; docs/models-and-export.md#fp8-unet)")
    ap.add_argument("--fp8-prompts", metavar="FILE", default=str(REPO / "configs" / "fp8-calibration-prompts.txt"),
                    help="calibration prompts, one per line (default: configs/fp8-calibration-prompts.txt)")
    ap.add_argument("--fp8-steps", type=int, metavar="N",
                    help="sampling steps per calibration prompt (default: the model's default steps)")
    ap.add_argument("--aoti-variants", metavar="LIST", default="all",
                    help="with --aoti: which packages to compile, comma-separated: 'fp16' (the model dtype's "
                         "unet.pt2), 'fp8' (unet_fp8.pt2, with --fp8), 'vae' (vae_decoder.pt2) or 'all' (default)")
    return ap


def check_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Refuses combinations of options that do not go together (ap.error: exit 2, naming
    them); turns --aoti-variants into the set of packages to compile."""
    if a.config and not (a.from_path or a.vae_only or a.controlnet):
        ap.error("--config goes with --from, --vae-only or --controlnet")
    if a.vae and not (a.from_path or a.vae_only):
        ap.error("--vae goes with --from or --vae-only")
    if a.vae_only and not a.vae:
        ap.error("--vae-only needs --vae FILE|DIR")
    if bool(a.ip_adapter) != bool(a.image_encoder):
        ap.error("--ip-adapter FILE and --image-encoder DIR go together")
    if not 1 <= a.batch_max <= 64:
        ap.error(f"--batch-max {a.batch_max}: must be 1..64 (sdxl-batch --max-batch takes 1..64)")
    names = set(a.aoti_variants.replace(" ", "").split(","))
    if not names <= {"all", "fp16", "fp8", "vae"}:
        ap.error(f"--aoti-variants '{a.aoti_variants}': {', '.join(sorted(names - {'all', 'fp16', 'fp8', 'vae'}))} "
                 "is not one of fp16, fp8, vae, all")
    variants = {"fp16", "fp8", "vae"} if "all" in names else names
    a.aoti_variants = variants if a.fp8 else variants - {"fp8"}
    if a.aoti and not a.aoti_variants:
        ap.error("--aoti-variants fp8 needs --fp8")
    if a.aoti and "fp8" in a.aoti_variants and a.device != "cuda":
        ap.error("--fp8 --aoti compiles unet_fp8.pt2 for CUDA only (Inductor's CPU code has no FP8 types): "
                 "add --device cuda, or --aoti-variants fp16 to compile only unet.pt2")
    if a.fp8 and (a.vae_only or a.controlnet or a.ip_adapter):
        ap.error("--fp8 goes with a model export (--tiny, --random-full or --from)")


def main() -> int:
    # A crash in native code (e.g. the AOTInductor loader on CUDA, see
    # bench/probes/gpu_aoti_probe.py) then names the Python line it came from.
    faulthandler.enable()
    ap = build_parser()
    a = ap.parse_args()
    check_args(ap, a)
    threads = a.threads if a.threads is not None else (1 if (a.tiny and a.device == "cpu") else 0)
    if threads > 0:
        torch.set_num_threads(threads)
    t_start = time.time()
    kind = ("tiny" if a.tiny else "random-full" if a.random_full else "vae-only" if a.vae_only
            else "controlnet" if a.controlnet else "ip-adapter" if a.ip_adapter else "from")
    dtype_name = a.dtype or ("fp32" if kind == "tiny" else "fp16")
    dtype = DTYPES[dtype_name]
    device = a.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available")
    out = Path(a.out).resolve()
    if out.exists() and not a.force:
        raise SystemExit(f"{out} exists (use --force to overwrite)")
    if a.save_diffusers and Path(a.save_diffusers).exists() and not a.force:
        raise SystemExit(f"{a.save_diffusers} exists (use --force to overwrite)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the temp dir is removed on kill
    try:
        if kind == "vae-only":
            rc = export_vae_only(a, dtype_name, dtype, device, out, tmp)
        elif kind == "controlnet":
            from controlnet_export import export_controlnet

            rc = export_controlnet(a, dtype_name, dtype, device, out, tmp)
        elif kind == "ip-adapter":
            from ip_adapter_export import export_ip_adapter

            rc = export_ip_adapter(a, dtype_name, dtype, device, out, tmp)
        else:
            rc = export(a, kind, dtype_name, dtype, device, out, tmp, t_start)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return rc


def export(a, kind, dtype_name, dtype, device, out: Path, tmp: Path, t_start: float) -> int:
    """A model folder: the traced modules, their checks, the optional AOTI and FP8 UNets and
    model.json, built in tmp and published to out."""
    torch.set_grad_enabled(False)
    log(f"export {kind}: dtype {dtype_name}, device {device}, torch {torch.__version__} -> {out}")
    files_meta = {}
    if kind == "from":
        pipe, name, source, files_meta = load_source(a, device, dtype, tmp)
        seed = None
    else:
        pipe = build_random_pipeline(kind, device, dtype, a.seed, tmp)
        name, source, seed = f"sdxl-{kind}", kind, a.seed
    t_built = time.time()
    d = model_dims(pipe, dtype)
    if a.save_diffusers:
        sd = Path(a.save_diffusers).resolve()
        if sd.exists():
            shutil.rmtree(sd)
        pipe.save_pretrained(str(sd), safe_serialization=True)
        log(f"  saved diffusers pipeline -> {sd}")

    gen = torch.Generator().manual_seed(99)
    timings = {}
    vae = pipe.vae
    vae_orig_dtype = vae.dtype
    if d["vae_dtype"] != vae_orig_dtype:  # upcast to fp32 for fp16 + force_upcast, as the pipeline does
        vae.to(d["vae_dtype"])
    trace_inputs = trace_modules(pipe, d, tmp, dtype, device, gen, timings)

    tiny = kind == "tiny"
    limits = {
        "batch_max": a.batch_max,
        "width_min": 256 if tiny else 512, "width_max": 1536,
        "height_min": 256 if tiny else 512, "height_max": 1536,
        "size_multiple": 8,
        "context_chunks_max": 4,
        # The --check level that verified the traces in this range (none: not verified).
        # sdxl-batch runs other multiples of size_multiple too, with a warning.
        "checked": a.check,
    }
    check = None
    if a.check != "none":
        check = check_traces(a, tiny, tmp, pipe, dtype, d, device, limits, timings)
    if d["vae_dtype"] != vae_orig_dtype:
        vae.to(vae_orig_dtype)

    aoti_meta = None
    if a.aoti and "fp16" in a.aoti_variants:
        t0 = time.time()
        aoti_meta = export_unet_aoti(pipe.unet, dtype, device, tmp, limits, d["vae_down"], d["ctx_dim"], d["pdim"],
                                     a.aoti_size, parse_inductor_configs(a.aoti_config), gen)
        timings["aoti_unet"] = time.time() - t0
    defaults = ({"width": 256, "height": 256, "steps": 8, "cfg": 5.0} if tiny
                else {"width": 1024, "height": 1024, "steps": 28, "cfg": 7.0})
    vae_aoti_meta = None
    if a.aoti and "vae" in a.aoti_variants:
        t0 = time.time()
        vae_aoti_meta = export_vae_decoder_aoti(vae, dtype, device, tmp, a.aoti_size, limits, d["vae_down"],
                                                (defaults["width"], defaults["height"]),
                                                parse_inductor_configs(a.aoti_config), gen)
        timings["aoti_vae_decoder"] = time.time() - t0
    fp8_meta = None
    if a.fp8:
        fp8_meta = export_unet_fp8(a, pipe, tmp, dtype, device, defaults, trace_inputs[:3], timings,
                                   dict(limits=limits, vae_down=d["vae_down"], ctx_dim=d["ctx_dim"], pdim=d["pdim"],
                                        gen=gen))

    t0 = time.time()
    files = file_digests(tmp)
    timings["sha256"] = time.time() - t0
    parts = {"aoti": aoti_meta, "fp8": fp8_meta, "control": trace_inputs[3], "ip_adapter": trace_inputs[4],
             "vae_aoti": vae_aoti_meta}
    meta = model_meta(pipe, d, dtype_name, device, dict(name=name, source=source, seed=seed), parts, defaults,
                      limits, files_meta, files)
    if check is not None:
        meta["check"] = check
    (tmp / "model.json").write_text(json.dumps(meta, indent=1) + "\n")

    publish(tmp, out)
    log_export_summary(pipe, files, timings, t_built - t_start, time.time() - t_start, device, out)
    return 0


def model_dims(pipe, dtype) -> dict:
    """The sizes export() and model.json need: the text encoders' widths, the UNet's
    context and pooled widths, pad tokens, the VAE's dtype (fp32 for an fp16 model whose
    VAE asks for upcasting), scaling and downsampling."""
    te1, te2, unet, vae = pipe.text_encoder, pipe.text_encoder_2, pipe.unet, pipe.vae
    h1, h2 = te1.config.hidden_size, te2.config.hidden_size
    assert unet.config.cross_attention_dim == h1 + h2, (unet.config.cross_attention_dim, h1, h2)
    pad1, pad2 = pipe.tokenizer.pad_token, pipe.tokenizer_2.pad_token
    return dict(h1=h1, h2=h2, pdim=te2.config.projection_dim, ctx_dim=h1 + h2, pad1=pad1, pad2=pad2,
                pad1_id=pipe.tokenizer.convert_tokens_to_ids(pad1), pad2_id=pipe.tokenizer_2.convert_tokens_to_ids(pad2),
                vae_dtype=torch.float32 if (dtype == torch.float16 and vae.config.force_upcast) else dtype,
                scaling=float(vae.config.scaling_factor), vae_down=2 ** (len(vae.config.block_out_channels) - 1),
                n_up=len(unet.config.block_out_channels) - 1)  # n_up: the UNet's num_upsamplers


def trace_modules(pipe, d: dict, tmp: Path, dtype, device, gen, timings: dict) -> tuple:
    """Traces text_encoder.ts, text_encoder_2.ts, unet.ts (four methods) and the VAE (in
    d["vae_dtype"], which the caller has set) into tmp; returns the UNet's trace inputs
    (inp, res, kv) and its control and ip_adapter layouts."""
    te1, te2, unet, vae = pipe.text_encoder, pipe.text_encoder_2, pipe.unet, pipe.vae
    warns = {}
    t0 = time.time()
    ids = make_ids(2, d["pad1_id"], gen, device)
    warns["text_encoder.ts"] = trace_text_encoder(TextEncoderTS(te1), te1, ids, tmp / "text_encoder.ts",
                                                  "text_encoder", "text_model.")
    ids = make_ids(2, d["pad2_id"], gen, device)
    warns["text_encoder_2.ts"] = trace_text_encoder(TextEncoder2TS(te2), te2, ids, tmp / "text_encoder_2.ts",
                                                    "text_encoder_2")
    timings["trace_text"] = time.time() - t0

    # UNet: trace at a latent size that is not a multiple of 2**n_up (forward_upsample_size path)
    t0 = time.time()
    lat_w, lat_h = 4 * 3 + 1, 4 * 2 + 3  # 13 x 11 latent = 104 x 88 px
    assert lat_w % (2 ** d["n_up"]) and lat_h % (2 ** d["n_up"])
    inp = unet_inputs(2, lat_w * 8, lat_h * 8, 1, d["ctx_dim"], d["pdim"], dtype, device, gen)
    control = control_layout(unet.config)
    res = control_residuals(control, 2, lat_h, lat_w, dtype, device, gen)
    ip = ip_layout(unet)
    kv = ip_kv_inputs(ip, 2, 5, dtype, device, gen)  # 5 tokens: no count of a real adapter gets baked in
    warns["unet.ts"] = trace_module(UNetTS(unet, dtype), {"forward": inp, "forward_control": inp + (res,),
                                                          "forward_ip": inp + (kv,),
                                                          "forward_control_ip": inp + (res, kv)}, tmp / "unet.ts")
    check_names(tmp / "unet.ts", unet, device, "unet")
    timings["trace_unet"] = time.time() - t0

    t0 = time.time()
    vae_dtype = d["vae_dtype"]
    z = torch.randn(1, 4, lat_h, lat_w, generator=gen).to(device, vae_dtype)
    warns["vae_decoder.ts"] = trace_module(VaeDecoderTS(vae, vae_dtype), (z,), tmp / "vae_decoder.ts")
    img = (torch.rand(1, 3, lat_h * d["vae_down"], lat_w * d["vae_down"], generator=gen) * 2 - 1).to(device, vae_dtype)
    warns["vae_encoder.ts"] = trace_module(VaeEncoderTS(vae, vae_dtype), (img,), tmp / "vae_encoder.ts")
    check_names(tmp / "vae_decoder.ts", VaeDecoderTS(vae, vae_dtype), device, "vae_decoder")
    check_names(tmp / "vae_encoder.ts", VaeEncoderTS(vae, vae_dtype), device, "vae_encoder")
    timings["trace_vae"] = time.time() - t0

    for f, msgs in warns.items():
        if msgs:
            log(f"  {f}: {len(msgs)} distinct tracer warning(s): " + " | ".join(m.split(": Converting")[0] for m in msgs))
    return inp, res, kv, control, ip


def check_traces(a, tiny: bool, tmp: Path, pipe, dtype, d: dict, device, limits: dict, timings: dict) -> dict:
    """--check quick|full: the traces against eager over the limits (narrowing them where a
    case fails, with a note); writes --json-report; returns model.json's "check"."""
    t0 = time.time()
    chk, vchk = run_checks(a.check, tiny, tmp, pipe, dtype, d["vae_dtype"], device,
                           dict(h1=d["h1"], h2=d["h2"], pooled=d["pdim"]))
    results = chk.results + vchk.results
    timings[f"check_{a.check}"] = time.time() - t0
    summary = summarize_checks(results)
    for m, s in summary.items():
        log(f"  check {a.check:5s} {m:40s} cases {s['cases']:3d}  failed {s['failed']:2d}  max|diff| {s['max_abs_diff']:.3g}")
    notes = settle_limits(limits, results)
    for n in notes:
        log(f"  LIMIT NARROWED: {n}")
    if a.json_report:
        Path(a.json_report).write_text(json.dumps(dict(results=results, summary=summary, notes=notes), indent=1))
    return {"level": a.check, "modules": summary, "notes": notes}


def model_meta(pipe, d: dict, dtype_name: str, device, origin: dict, parts: dict, defaults: dict, limits: dict,
               files_meta: dict, files: dict) -> dict:
    """model.json (docs/models-and-export.md: the model directory contract); origin: name,
    source, seed; parts: the UNet's optional aoti and fp8 parts and its control / ip_adapter
    layouts, and vae_aoti: the VAE decoder's optional AOTI package."""
    te1, te2, unet = pipe.text_encoder, pipe.text_encoder_2, pipe.unet
    sc = pipe.scheduler.config
    return {
        "format_version": 1,
        "name": origin["name"],
        "source": origin["source"],
        "architecture": "sdxl-base",
        "dtype": dtype_name,
        "vae_dtype": {v: k for k, v in DTYPES.items()}[d["vae_dtype"]],
        "export_device": device,
        "torch_version": torch.__version__,
        "seed": origin["seed"],
        "vae_scaling_factor": d["scaling"],
        "vae_downsample": d["vae_down"],
        "latent_channels": int(unet.config.in_channels),
        "text_encoders": [
            {"file": "text_encoder.ts", "tokenizer": "tokenizer", "pad_token": d["pad1"], "hidden_dim": d["h1"],
             "hidden_states": te1.config.num_hidden_layers + 1},
            {"file": "text_encoder_2.ts", "tokenizer": "tokenizer_2", "pad_token": d["pad2"], "hidden_dim": d["h2"],
             "pooled_dim": d["pdim"], "hidden_states": te2.config.num_hidden_layers + 1},
        ],
        "unet": {"file": "unet.ts", "in_channels": int(unet.config.in_channels), "context_dim": d["ctx_dim"],
                 "pooled_dim": d["pdim"], "time_ids_dim": 6, "parameters": count_params(unet),
                 "control": parts["control"], "ip_adapter": parts["ip_adapter"],
                 **({"aoti": parts["aoti"]} if parts["aoti"] else {}),
                 **({"fp8": parts["fp8"]} if parts["fp8"] else {})},
        "vae_decoder": {"file": "vae_decoder.ts", **({"aoti": parts["vae_aoti"]} if parts["vae_aoti"] else {})},
        "vae_encoder": {"file": "vae_encoder.ts"},
        "scheduler": {k: sc[k] for k in ("num_train_timesteps", "beta_start", "beta_end", "beta_schedule",
                                          "timestep_spacing", "steps_offset", "prediction_type")},
        "defaults": defaults,
        "limits": limits,
        **files_meta,
        "files": files,
    }


def log_export_summary(pipe, files: dict, timings: dict, t_build: float, total: float, device, out: Path) -> None:
    import resource

    log("summary:")
    log(f"  params: text_encoder {count_params(pipe.text_encoder) / 1e6:,.3f} M, "
        f"text_encoder_2 {count_params(pipe.text_encoder_2) / 1e6:,.3f} M, "
        f"unet {count_params(pipe.unet) / 1e6:,.3f} M, vae {count_params(pipe.vae) / 1e6:,.3f} M")
    for f, info in files.items():
        log(f"  {f:28s} {info['bytes'] / 2**20:10.2f} MiB")
    log(f"  build {t_build:.1f}s, " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()) + f", total {total:.1f}s")
    peak = f"  peak memory: host {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB (max RSS)"
    if device == "cuda":
        peak += f", GPU {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB allocated"
    log(peak)
    log(f"  wrote {out}")

if __name__ == "__main__":
    sys.exit(main())
