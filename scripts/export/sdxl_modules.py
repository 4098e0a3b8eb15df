"""The TorchScript wrappers of an SDXL model folder (their contracts: export_sdxl.py --help, i.e.
export/cli.py, and docs/models-and-export.md), the layouts of what forward_control and forward_ip
take (model.json unet.control, unet.ip_adapter), and example inputs of each module. Each wrapper
registers the diffusers / transformers module's children as its own, so the traced parameter names
are the state-dict keys."""
from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn as nn

from .common import SharedChildren


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


def attn2_downscales(unet) -> list[int]:
    """Each cross-attention layer's downscale relative to the latent, in ip_attentions order, from its
    block: down_blocks.i -> 2^i, mid_block -> 2^(n-1), up_blocks.j -> 2^(n-1-j) (n = len(block_out_channels));
    the regional methods check it against the hidden states' token count while tracing."""
    n = len(unet.config.block_out_channels)
    out = []
    for name, _ in ip_attentions(unet):
        block, _, rest = name.partition(".")
        if block == "mid_block":
            out.append(2 ** (n - 1))
        elif block in ("down_blocks", "up_blocks"):
            i = int(rest.split(".")[0])
            out.append(2 ** (i if block == "down_blocks" else n - 1 - i))
        else:
            raise ValueError(f"cross-attention layer {name} is in no down, mid or up block: no downscale for it")
    return out


def regions_layout(unet, max_regions: int) -> dict:
    """model.json unet.regions: the sorted downscales of the cross-attention layers (one weights and
    one ip_masks tensor each in forward_regional*), each layer's index into them (ip_attentions
    order), and --max-regions (regions beside the task's own prompt a row may carry)."""
    per_layer = attn2_downscales(unet)
    downscales = sorted(set(per_layer))
    return {"downscales": downscales, "layers": [downscales.index(d) for d in per_layer], "max_regions": max_regions}


class RegionalAttnProcessor:
    """The attn2 processor of the forward_regional* methods: for R prompts per row (contexts
    [B, R, L, C]) and their weights at this layer's resolution ([B, R, N], N = the hidden states'
    tokens), out = to_out(sum_r weights[:, r, :, None] * sdpa(q, to_k(contexts[:, r]), to_v(contexts[:, r])))
    in one sdpa over B*R rows; with ip = (k, v, masks) ([B, M, T, C], [B, M, T, C], [B, M, N]) it adds
    sum_m masks[:, m, :, None] * sdpa(q, k[:, m], v[:, m]) before to_out (diffusers'
    IPAdapterAttnProcessor2_0 with ip_adapter_masks: each image its own softmax; the scale in v).
    Not an nn.Module: the k/v projections of the image tokens run in ip_adapter.ts."""

    def __init__(self, contexts: torch.Tensor, weights: torch.Tensor, ip: tuple | None, layer: str):
        self.contexts, self.weights, self.ip, self.layer = contexts, weights, ip, layer

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None,
                 *args, **kwargs):
        # As IPAttnProcessor: 3-D hidden states, no mask, no spatial / group / q-k norm, no cross norm.
        assert hidden_states.ndim == 3 and attention_mask is None and not attn.norm_cross
        assert attn.spatial_norm is None and attn.group_norm is None and attn.norm_q is None and attn.norm_k is None
        tokens = hidden_states.shape[1]
        with warnings.catch_warnings():  # a check of the trace's own shapes, meant to be evaluated once, there
            warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
            if self.weights.shape[-1] != tokens:  # the layer's downscale (attn2_downscales) is not its resolution's
                raise ValueError(f"{self.layer}: {tokens} tokens, but the weights of its downscale have "
                                 f"{self.weights.shape[-1]}")
        query = attn.to_q(hidden_states)
        heads, head_dim = attn.heads, attn.to_q.out_features // attn.heads
        query = query.unflatten(-1, (heads, head_dim)).transpose(1, 2)
        out = self._mixed(query, attn.to_k(self.contexts), attn.to_v(self.contexts), self.weights, heads, head_dim)
        if self.ip is not None:
            k_ip, v_ip, masks = self.ip
            out = out + self._mixed(query, k_ip, v_ip, masks, heads, head_dim)
        out = attn.to_out[1](attn.to_out[0](out))
        if attn.residual_connection:
            out = out + hidden_states
        return out / attn.rescale_output_factor

    @staticmethod
    def _mixed(query, key, value, weights, heads: int, head_dim: int):
        """sum_g weights[:, g, :, None] * sdpa(query, key[:, g], value[:, g]) over the G groups of
        key / value [B, G, L, H*D] (query [B, H, N, D]): G dynamic, one sdpa over B*G rows. Sizes come
        from constants or -1 where they can (every size read from a tensor is a node of the traced graph)."""
        groups = key.shape[1]

        def split(x):  # [B, G, L, H*D] -> [B*G, H, L, D]
            return x.flatten(0, 1).unflatten(-1, (heads, head_dim)).transpose(1, 2)

        q = query.unsqueeze(1).expand(-1, groups, -1, -1, -1).flatten(0, 1)
        o = torch.nn.functional.scaled_dot_product_attention(q, split(key), split(value), dropout_p=0.0,
                                                             is_causal=False)
        o = o.transpose(1, 2).flatten(2).unflatten(0, (-1, groups))  # [B, G, N, H*D]
        return (o * weights.unsqueeze(-1)).sum(1)


@contextlib.contextmanager
def regional_processors(unet, contexts, weights: tuple, ip_kv: tuple | None, ip_masks: tuple | None, dtype):
    """RegionalAttnProcessor on every cross-attention layer for one inner call: the layer's
    downscale (regions_layout) picks its weights and ip_masks; ip_kv gives its (k, v) pair as
    forward_ip's, each [B, M, T, C_l]. The original processors are put back after."""
    layers = ip_attentions(unet)
    index = regions_layout(unet, 1)["layers"]
    n_scales = max(index) + 1
    if len(weights) != n_scales or (ip_masks is not None and len(ip_masks) != n_scales):
        raise ValueError(f"weights / ip_masks have {len(weights)} / {len(ip_masks or ())} tensors; this UNet takes "
                         f"{n_scales} (one per downscale of model.json unet.regions.downscales)")
    if ip_kv is not None and len(ip_kv) != 2 * len(layers):
        raise ValueError(f"ip_kv has {len(ip_kv)} tensors; this UNet takes {2 * len(layers)} "
                         f"(a k and a v for each of its {len(layers)} cross-attention layers)")
    contexts = contexts.to(dtype)
    saved = [m.processor for _, m in layers]
    try:
        for i, (name, m) in enumerate(layers):
            d = index[i]
            ip = None if ip_kv is None else (ip_kv[2 * i].to(dtype), ip_kv[2 * i + 1].to(dtype), ip_masks[d].to(dtype))
            m.set_processor(RegionalAttnProcessor(contexts, weights[d].to(dtype), ip, name))
        yield
    finally:
        for (_, m), proc in zip(layers, saved):
            m.set_processor(proc)


class UNetTS(SharedChildren):
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


    def forward_regional(self, latent, timestep, contexts, text_embeds, time_ids, weights: tuple):
        """forward with R prompts per row (contexts [B, R, 77k, C], index 0 the task's own prompt) mixed in
        every cross-attention layer by weights (one [B, R, n_d] per unet.regions downscale; RegionalAttnProcessor)."""
        with regional_processors(self._inner, contexts, weights, None, None, self._dtype):
            return self.forward(latent, timestep, contexts[:, 0], text_embeds, time_ids)

    def forward_regional_control(self, latent, timestep, contexts, text_embeds, time_ids, weights: tuple,
                                 residuals: tuple):
        """forward_regional plus a ControlNet's residuals (as forward_control)."""
        with regional_processors(self._inner, contexts, weights, None, None, self._dtype):
            return self.forward_control(latent, timestep, contexts[:, 0], text_embeds, time_ids, residuals)

    def forward_regional_ip(self, latent, timestep, contexts, text_embeds, time_ids, weights: tuple, ip_kv: tuple,
                            ip_masks: tuple):
        """forward_regional plus M masked groups of image tokens: ip_kv a k and a v [B, M, T, C_l] per
        cross-attention layer (scale in v), ip_masks one [B, M, n_d] per downscale."""
        with regional_processors(self._inner, contexts, weights, ip_kv, ip_masks, self._dtype):
            return self.forward(latent, timestep, contexts[:, 0], text_embeds, time_ids)

    def forward_regional_control_ip(self, latent, timestep, contexts, text_embeds, time_ids, weights: tuple,
                                    residuals: tuple, ip_kv: tuple, ip_masks: tuple):
        """forward_regional_ip plus a ControlNet's residuals."""
        with regional_processors(self._inner, contexts, weights, ip_kv, ip_masks, self._dtype):
            return self.forward_control(latent, timestep, contexts[:, 0], text_embeds, time_ids, residuals)


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


def regional_inputs(layout: dict, ip: dict, batch: int, regions: int, groups: int, lat_h: int, lat_w: int, k: int,
                    ctx_dim: int, dtype, device, gen, tokens: int = 5) -> tuple:
    """Random (contexts, weights, ip_kv, ip_masks) for forward_regional*: contexts [B, R, 77k, C]; weights
    per downscale [B, R, n_d], positive and summing to 1 over R; ip_kv [B, M, T, C_l] per layer; ip_masks
    per downscale [B, M, n_d] in [0, 1]."""
    ctx = torch.randn(batch, regions, 77 * k, ctx_dim, generator=gen).to(device, dtype)
    cells = [residual_size(lat_h, d) * residual_size(lat_w, d) for d in layout["downscales"]]
    weights = []
    for n in cells:
        w = torch.rand(batch, regions, n, generator=gen) + 0.05
        weights.append((w / w.sum(1, keepdim=True)).to(device, dtype))
    kv = tuple(t.view(batch, groups, tokens, -1) for t in ip_kv_inputs(ip, batch * groups, tokens, dtype, device, gen))
    masks = tuple(torch.rand(batch, groups, n, generator=gen).to(device, dtype) for n in cells)
    return ctx, tuple(weights), kv, masks


class VaeDecoderTS(SharedChildren):
    def __init__(self, vae, dtype):
        super().__init__(vae, ("post_quant_conv", "decoder"))
        self._dtype = dtype

    def forward(self, z):
        return self._inner.decode(z.to(self._dtype), return_dict=False)[0]


class VaeEncoderTS(SharedChildren):
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


def make_ids(batch: int, pad_id: int, gen: torch.Generator, device) -> torch.Tensor:
    ids = torch.full((batch, 77), pad_id, dtype=torch.int64)
    for b in range(batch):
        n = int(torch.randint(0, 76, (1,), generator=gen))
        ids[b, 0] = 49406
        if n:
            ids[b, 1 : 1 + n] = torch.randint(1, 49406, (n,), generator=gen)
        ids[b, 1 + n] = 49407
    return ids.to(device)


def unet_inputs(batch, width, height, k, ctx_dim, pooled_dim, dtype, device, gen, channels=4):
    """Example inputs of the UNet; `channels` is its in_channels (9 for an inpainting UNet: the
    latents, the mask and the masked image's latents, concatenated by the caller at run time)."""
    h, w = height // 8, width // 8
    lat = torch.randn(batch, channels, h, w, generator=gen).to(device, dtype)
    t = (torch.rand(batch, generator=gen) * 999).to(device, torch.float32)
    ctx = torch.randn(batch, 77 * k, ctx_dim, generator=gen).to(device, dtype)
    emb = torch.randn(batch, pooled_dim, generator=gen).to(device, dtype)
    tid = torch.tensor([[height, width, 0, 0, height, width]] * batch, dtype=torch.float32).to(device, dtype)
    return (lat, t, ctx, emb, tid)

