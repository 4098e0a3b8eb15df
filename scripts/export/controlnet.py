"""SDXL ControlNets for export_sdxl.py --controlnet SRC: a "ControlNet folder" that sdxl-batch loads
next to a model (controlnet.ts + model.json, kind "controlnet").

Sources: a diffusers folder (config.json + diffusion_pytorch_model[.fp16].safetensors, or shards
with their index), or one .safetensors file with diffusers keys (controlnet_cond_embedding.*,
controlnet_down_blocks.*, down_blocks.*) or in the original layout (input_blocks.*, zero_convs.*,
input_hint_block.*, middle_block_out.*, bare or under "control_model."). Rules kept here:
  - a file is checked before anything is loaded (inputs.read_header: truncated files,
    pickles); what is not an SDXL ControlNet is refused with a message naming it: an SD 1.x / 2.x
    ControlNet, a T2I-Adapter, a Control-LoRA, a ControlLLLite, ControlNet-XS, a whole checkpoint,
    a LoRA, a Union ControlNet in another layout than diffusers' keys;
  - the architecture of a single file is SDXL base's ControlNet (ControlNetModel.from_unet of the
    SDXL base UNet: conditioning channels 3, embedding channels (16, 32, 96, 256)) unless --config
    gives one; a folder has its own config.json;
  - the module is built on the meta device and filled by assignment: every tensor must arrive
    from the source with its shape (weights.fill_module);
  - the original layout is converted by diffusers' convert_controlnet_checkpoint, plus the SDXL
    size-conditioning embedding (label_emb.* -> add_embedding.*), which that function does not map;
    the names come from diffusers' own table (DIFFUSERS_TO_LDM_MAPPING["controlnet"]).

controlnet.ts contract (traced on --device, weights in the model dtype, parameter names = the
diffusers state-dict keys):
  forward(latent [B,4,h,w], timestep f32 [B], context [B,77k,C], text_embeds [B,P], time_ids [B,6],
          cond [B,3,8h,8w] float in [0,1]) -> tuple of N+1 tensors: the N down-block residuals in
          diffusers' order, then the mid residual, in the model dtype; conditioning_scale 1.0, no
          guess mode (the caller multiplies by the strength). With global_pool_conditions the
          residuals are spatial means [B,c,1,1] (they broadcast when added).
The residual layout (model.json controlnet.residuals / channels / downscales) equals the UNet's
unet.control entry of a model of the same architecture.

A Union ControlNet (diffusers' ControlNetUnionModel: xinsir's controlnet-union-sdxl-1.0 and ProMax)
traces instead
  forward(latent, timestep, context, text_embeds, time_ids, cond [K,B,3,8h,8w] (K control images),
          control_type [B,T] float one-hot of the types used, type_idx [K] int64, scales [K] f32)
          -> the same N+1 residuals,
diffusers' ControlNetUnionModel.forward with control_type_idx = type_idx and conditioning_scale =
scales: with K = 1 the caller passes scales [1] and multiplies the residuals by the strength
(diffusers scales the outputs then), with K > 1 each image's scale acts inside (on its condition and
its token) and the outputs are not scaled. Its transformer (nn.MultiheadAttention, sequence-first,
given [B, K+1, C]) attends across the B rows, as diffusers does: a caller reproduces diffusers' image
by calling it with one image's rows (its CFG pair). model.json records "union": the number of types
and each type's names (UNION_TYPE_NAMES) with its index.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from torch import nn

from .architecture import FULL_UNET
from .common import (Checker, Job, SharedChildren, check_names, count_params, file_digests, log, publish,
                     sha256_file, summarize_checks, trace_module)
from .controlnet_family import LDM_PREFIX, UNION_CLASSES, classify, config_not_sdxl, is_union, ldm_layout
from .inputs import ExportError
from .sdxl_modules import control_layout, residual_size, unet_inputs
from .weights import check_finite, fill_module

def sdxl_config(unet_config: dict) -> dict:
    """The ControlNet config ControlNetModel.from_unet makes of a UNet config (built on meta)."""
    from diffusers import ControlNetModel, UNet2DConditionModel

    with torch.device("meta"):
        unet = UNet2DConditionModel.from_config(unet_config)
        cn = ControlNetModel.from_unet(unet, load_weights_from_unet=False)
    return {k: v for k, v in dict(cn.config).items() if not k.startswith("_")}


def config_for_file(config: str | None) -> dict:
    """--config for a single file: a config.json, a folder holding one, or a diffusers SDXL folder (its
    unet/config.json, as from_unet derives it); default SDXL base's ControlNet."""
    if config is None:
        return sdxl_config(FULL_UNET)
    p = Path(config).resolve()
    if p.is_file():
        return json.loads(p.read_text())
    if (p / "config.json").is_file():
        return json.loads((p / "config.json").read_text())
    if (p / "unet" / "config.json").is_file():
        return sdxl_config(json.loads((p / "unet" / "config.json").read_text()))
    raise ExportError(f"--config {p}: neither a config.json nor a folder with config.json or unet/config.json")


# xinsir's control types, as diffusers' StableDiffusionXLControlNetUnionPipeline documents control_mode:
# index -> the names a batch file may use for it (6 and 7 are ProMax's: a model with fewer types lacks them).
UNION_TYPE_NAMES = (("openpose",), ("depth",), ("hed", "pidi", "scribble", "ted"),
                    ("canny", "lineart", "anime_lineart", "mlsd"), ("normal",), ("segment",), ("tile",),
                    ("repaint", "inpaint", "outpaint"))
UNION_HEADS = 8  # num_trans_head of xinsir's models: the only union setting the tensors' shapes do not show


def union_config(cfg: dict, shapes: dict[str, list[int]]) -> dict:
    """A ControlNetUnionModel config: `cfg`'s architecture, its union part read from the tensors' shapes
    (the number of types, the transformer's width and layers, the projection) and the heads from cfg
    (UNION_HEADS when it has none)."""
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    types, width = shapes["task_embedding"]
    layers = len({k.split(".")[1] for k in shapes if k.startswith("transformer_layes.")})
    proj = shapes.get("spatial_ch_projs.weight", [width])[0]
    return dict(cfg, num_control_type=types, num_trans_channel=width, num_trans_layer=layers, num_proj_channel=proj,
                num_trans_head=cfg.get("num_trans_head", UNION_HEADS))


def union_types(num_types: int) -> dict:
    """model.json's "union": the number of types and each name's index (xinsir's names; an index past
    them is named "type<i>")."""
    names = {}
    for i in range(num_types):
        for n in (UNION_TYPE_NAMES[i] if i < len(UNION_TYPE_NAMES) else (f"type{i}",)):
            names[n] = i
    return {"num_control_type": num_types, "types": names}


def convert_ldm(sd: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """Original layout -> diffusers keys: diffusers' convert_controlnet_checkpoint, plus label_emb ->
    add_embedding from diffusers' own table (the function leaves SDXL's size embedding out)."""
    from diffusers.loaders import single_file_utils as sfu

    bare = {k.removeprefix(LDM_PREFIX): v for k, v in sd.items()}
    out = sfu.convert_controlnet_checkpoint(bare, config)
    for new, old in sfu.DIFFUSERS_TO_LDM_MAPPING["controlnet"]["addition_embed_type"].items():
        if old in bare:
            out[new] = bare[old]
    return {k: v for k, v in out.items() if v is not None}  # .get() of an absent tensor gives None


def load_controlnet(src: Path, config: str | None, device: str, dtype: torch.dtype):
    """-> (ControlNetModel on device in dtype, model.json entries naming the source). The file is
    classified from its header before diffusers is imported, so a refusal costs no diffusers import."""
    cfg, files, shapes = classify(src, config)
    if cfg is None:
        cfg = config_for_file(config)
        config_not_sdxl(cfg, f"--config for {src.name}")
    union = is_union(shapes)
    if union:
        cfg = union_config(cfg, shapes)
    elif cfg.get("_class_name") in UNION_CLASSES:
        raise ExportError(f"{src}: the config is a Union ControlNet's ({cfg['_class_name']}) but the weights have "
                          "no task_embedding / transformer_layes.* tensors")
    from diffusers import ControlNetModel, ControlNetUnionModel
    from safetensors.torch import load_file

    sd = {}
    for f in files:
        sd.update(load_file(str(f), device="cpu"))
    check_finite(sd, src)
    if ldm_layout(shapes):
        sd = convert_ldm(sd, cfg)
    log(f"  {src.name}: {len(shapes)} tensors, {'original' if ldm_layout(shapes) else 'diffusers'} layout")
    with torch.device("meta"):
        cn = (ControlNetUnionModel if union else ControlNetModel).from_config(cfg)
    cn = fill_module(cn, sd, "the Union ControlNet" if union else "the ControlNet", src, device, dtype)
    meta = {"source": f"controlnet:{src}"}
    if len(files) == 1:
        meta["source_file"] = {"name": files[0].name, "sha256": sha256_file(files[0])}
    return cn, meta


class ControlNetTS(SharedChildren):
    def __init__(self, cn, dtype):
        super().__init__(cn)
        self._dtype = dtype

    def forward(self, latent, timestep, context, text_embeds, time_ids, cond):
        dt = self._dtype
        down, mid = self._inner(
            latent.to(dt),
            timestep.to(torch.float32),
            encoder_hidden_states=context.to(dt),
            controlnet_cond=cond.to(dt),
            conditioning_scale=1.0,
            added_cond_kwargs={"text_embeds": text_embeds.to(dt), "time_ids": time_ids.to(dt)},
            guess_mode=False,
            return_dict=False,
        )
        return tuple(down) + (mid,)


class UnionControlNetTS(nn.Module):
    """ControlNetUnionModel.forward (diffusers 0.42) with K control images as one tensor [K, B, 3, H, W]
    (the module's contract is in the module docstring): the per-image loop is written over the K axis,
    so the trace holds for every K; the sum over the images is in another order than diffusers' loop
    (float rounding only)."""

    def __init__(self, cn, dtype):
        super().__init__()
        for n, m in cn.named_children():
            self.add_module(n, m)
        self.task_embedding = cn.task_embedding  # the same Parameter: the traced name is the state-dict key
        object.__setattr__(self, "_inner", cn)
        self._dtype = dtype

    def embedding(self, timestep, text_embeds, time_ids, control_type, rows: int):
        cn, dt = self._inner, self._dtype
        t_emb = cn.time_proj(timestep.to(torch.float32).expand(rows)).to(dt)
        emb = cn.time_embedding(t_emb, None)
        time_embeds = cn.add_time_proj(time_ids.to(dt).flatten()).reshape(rows, -1)
        aug = cn.add_embedding(torch.cat([text_embeds.to(dt), time_embeds.to(dt)], dim=-1).to(emb.dtype))
        control = cn.control_type_proj(control_type.to(dt).flatten()).reshape(rows, -1).to(emb.dtype)
        return emb + cn.control_add_embedding(control) + aug

    def fuse(self, sample, cond, type_idx, scales):
        """sample + the sum over the images of (condition + alpha) * scale (diffusers' controlnet_cond_fuser)."""
        cn, k = self._inner, cond.shape[0]
        condition = cn.controlnet_cond_embedding(cond.flatten(0, 1)).unflatten(0, (k, sample.shape[0]))
        s = scales.to(condition.dtype).view(-1, 1, 1)
        feat = (condition.mean(dim=(3, 4)) + self.task_embedding[type_idx].unsqueeze(1)) * s  # [K, B, C]
        x = torch.cat([feat.transpose(0, 1), sample.mean(dim=(2, 3)).unsqueeze(1)], dim=1)
        for layer in cn.transformer_layes:
            x = layer(x)
        alpha = cn.spatial_ch_projs(x[:, :k]).transpose(0, 1)[..., None, None]  # [K, B, C, 1, 1]
        return sample + ((condition + alpha) * s.unsqueeze(-1).unsqueeze(-1)).sum(0)

    def forward(self, latent, timestep, context, text_embeds, time_ids, cond, control_type, type_idx, scales):
        cn, dt = self._inner, self._dtype
        context = context.to(dt)
        emb = self.embedding(timestep, text_embeds, time_ids, control_type, latent.shape[0])
        sample = self.fuse(cn.conv_in(latent.to(dt)), cond.to(dt), type_idx, scales)
        res = (sample,)
        for block in cn.down_blocks:
            if getattr(block, "has_cross_attention", False):
                sample, more = block(hidden_states=sample, temb=emb, encoder_hidden_states=context)
            else:
                sample, more = block(hidden_states=sample, temb=emb)
            res += more
        sample = cn.mid_block(sample, emb, encoder_hidden_states=context)
        down = [b(r) for r, b in zip(res, cn.controlnet_down_blocks)]
        mid = cn.controlnet_mid_block(sample)
        if cn.config.global_pool_conditions:
            down, mid = [torch.mean(d, dim=(2, 3), keepdim=True) for d in down], torch.mean(mid, dim=(2, 3), keepdim=True)
        return tuple(down) + (mid,)


class DiffusersUnion(nn.Module):
    """The reference of UnionControlNetTS: diffusers' own ControlNetUnionModel.forward, called as
    StableDiffusionXLControlNetUnionPipeline calls it (lists of images, indices and scales)."""

    def __init__(self, cn, dtype):
        super().__init__()
        object.__setattr__(self, "_inner", cn)
        self._dtype = dtype

    def forward(self, latent, timestep, context, text_embeds, time_ids, cond, control_type, type_idx, scales):
        dt = self._dtype
        down, mid = self._inner(
            latent.to(dt), timestep.to(torch.float32), encoder_hidden_states=context.to(dt),
            controlnet_cond=[c.to(dt) for c in cond], control_type=control_type.to(dt),
            control_type_idx=[int(i) for i in type_idx], conditioning_scale=[float(v) for v in scales],
            added_cond_kwargs={"text_embeds": text_embeds.to(dt), "time_ids": time_ids.to(dt)}, return_dict=False)
        return tuple(down) + (mid,)


def union_inputs(cn, batch: int, lat_h: int, lat_w: int, k: int, dtype, device, gen) -> tuple:
    """controlnet_inputs with K control images, K distinct types, their one-hot and scales (1 for K = 1)."""
    inp = controlnet_inputs(cn, batch, lat_h, lat_w, dtype, device, gen)
    n = cn.config["num_control_type"]
    idx = torch.randperm(n, generator=gen)[:k]
    cond = torch.rand(k, *inp[-1].shape, generator=gen).to(device, dtype)
    one_hot = torch.zeros(batch, n).index_fill_(1, idx, 1.0).to(device, dtype)
    scales = torch.ones(1) if k == 1 else 0.3 + torch.rand(k, generator=gen)
    return inp[:-1] + (cond, one_hot, idx.to(device), scales.to(device))


def controlnet_inputs(cn, batch: int, lat_h: int, lat_w: int, dtype, device, gen) -> tuple:
    """Example inputs: latent lat_h x lat_w, one 77-token chunk, a control image in [0, 1]."""
    c = cn.config
    pooled = c["projection_class_embeddings_input_dim"] - 6 * c["addition_time_embed_dim"]
    inp = unet_inputs(batch, 8 * lat_w, 8 * lat_h, 1, c["cross_attention_dim"], pooled, dtype, device, gen)
    cond = torch.rand(batch, c["conditioning_channels"], 8 * lat_h, 8 * lat_w, generator=gen).to(device, dtype)
    return inp + (cond,)


def check_layout(cn, outs: tuple, lat_h: int, lat_w: int) -> dict:
    """The residuals' channels / sizes must be what control_layout says (it describes unet.ts's input)."""
    layout = control_layout(cn.config)
    got = [(int(o.shape[1]), int(o.shape[2]), int(o.shape[3])) for o in outs]
    pool = cn.config["global_pool_conditions"]
    want = [(c, 1 if pool else residual_size(lat_h, d), 1 if pool else residual_size(lat_w, d))
            for c, d in zip(layout["channels"], layout["downscales"])]
    if got != want:
        raise SystemExit(f"internal: the ControlNet's residuals {got} are not the layout {want}")
    return layout


def export(a, job: Job) -> int:
    """--controlnet SRC: controlnet.ts + model.json (kind "controlnet") into tmp, checked, published to out."""
    dtype_name, dtype, device, out, tmp = job.dtype_name, job.dtype, job.device, job.out, job.tmp
    torch.set_grad_enabled(False)
    src = Path(a.controlnet).resolve()
    log(f"export controlnet: {src} dtype {dtype_name}, device {device}, torch {torch.__version__} -> {out}")
    t0 = time.time()
    cn, src_meta = load_controlnet(src, a.config, device, dtype)
    union = "num_control_type" in cn.config
    gen = torch.Generator().manual_seed(99)
    lat_h, lat_w = 11, 13  # odd: no size a multiple of the down-sampling gets baked in

    def inputs(b, h, w, k=2):  # a union trace takes 2 images and 2 rows: neither count gets baked in
        return (union_inputs(cn, b, h, w, k, dtype, device, gen) if union
                else controlnet_inputs(cn, b, h, w, dtype, device, gen))

    inp = inputs(2, lat_h, lat_w)
    wrapper = UnionControlNetTS(cn, dtype) if union else ControlNetTS(cn, dtype)
    layout = check_layout(cn, wrapper(*inp), lat_h, lat_w)
    msgs = trace_module(wrapper, inp, tmp / "controlnet.ts")
    check_names(tmp / "controlnet.ts", cn, device, "controlnet")
    if msgs:
        log(f"  controlnet.ts: {len(msgs)} distinct tracer warning(s): "
            + " | ".join(m.split(": Converting")[0] for m in msgs))
    chk = Checker(dtype, device)
    if a.check != "none":
        ts = torch.jit.load(str(tmp / "controlnet.ts"), map_location=device)
        # a union's trace is checked against diffusers' own forward, with 1, 2 and 3 images
        ref = DiffusersUnion(cn, dtype) if union else wrapper
        for (b, h, w, k) in ((2, lat_h, lat_w, 1), (1, 64, 96, 2), (2, 40, 56, 3), (1, 32, 32, 1)):
            chk.run_safe("controlnet.ts", dict(batch=b, width=8 * w, height=8 * h, **({"images": k} if union else {})), ts, ref,
                         inputs(b, h, w, k))
        bad = [r for r in chk.results if not r["ok"]]
        if bad:
            raise SystemExit(f"the traced ControlNet does not match the eager one: {bad[0]}")
        for m, s in summarize_checks(chk.results).items():
            log(f"  check {a.check:5s} {m:24s} cases {s['cases']:3d}  failed {s['failed']:2d}  "
                f"max|diff| {s['max_abs_diff']:.3g}")
    write_meta(a, cn, src, src_meta, layout, dtype_name, device, chk, tmp)
    publish(tmp, out)
    log(f"  wrote {'Union ' if union else ''}ControlNet {out} ({count_params(cn) / 1e6:,.3f} M params, "
        f"{layout['residuals']} + 1 residuals, {time.time() - t0:.1f}s)")
    return 0


def write_meta(a, cn, src: Path, src_meta: dict, layout: dict, dtype_name: str, device: str, chk, tmp: Path):
    c = cn.config
    meta = {
        "format_version": 1, "kind": "controlnet", "name": src.stem if src.is_file() else src.name,
        "dtype": dtype_name, "export_device": device, "torch_version": torch.__version__,
        "controlnet": {
            "file": "controlnet.ts", "in_channels": int(c["in_channels"]),
            "context_dim": int(c["cross_attention_dim"]),
            "pooled_dim": int(c["projection_class_embeddings_input_dim"] - 6 * c["addition_time_embed_dim"]),
            "time_ids_dim": 6, "cond_channels": int(c["conditioning_channels"]),
            "downscale": 2 ** (len(c["conditioning_embedding_out_channels"]) - 1),
            **layout, "parameters": count_params(cn),
            "global_pool_conditions": bool(c["global_pool_conditions"]),
            "channel_order": c["controlnet_conditioning_channel_order"],
            **({"union": union_types(int(c["num_control_type"]))} if "num_control_type" in c else {}),
        },
        **src_meta,
        "check": {"level": a.check, "modules": summarize_checks(chk.results), "notes": []},
        "files": file_digests(tmp),
    }
    (tmp / "model.json").write_text(json.dumps(meta, indent=1) + "\n")
