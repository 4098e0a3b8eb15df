"""The model folder (export_sdxl.py --tiny, --tiny-aoti, --random-full, --from DIR|FILE): the pipeline from its
source (sdxl_sources), the two text encoders, the UNet (eight methods: plain, ControlNet, IP-Adapter, both, and
each of them regional) and the VAE traced
(sdxl_modules), their --check (sdxl_checks), the optional AOTInductor packages (aoti) and FP8 UNet
(fp8), and model.json, the export contract (docs/models-and-export.md)."""
from __future__ import annotations

import json
import shutil
import time
import warnings
from pathlib import Path

import torch
import torch.nn as nn

from .aoti import export_unet_aoti, export_vae_decoder_aoti, parse_inductor_configs
from .architecture import TINY_KINDS
from .checkpoint_family import checkpoint_markers, prediction_settings
from .common import Job, check_names, count_params, dtype_str, file_digests, log, publish, trace_module, tracer_warnings
from .sdxl_checks import check_traces
from .sdxl_modules import (TextEncoder2TS, TextEncoderTS, UNetTS, VaeDecoderTS, VaeEncoderTS, control_layout,
                           control_residuals, ip_kv_inputs, ip_layout, make_ids, regional_inputs, regions_layout,
                           unet_inputs)
from .sdxl_sources import build_random_pipeline, load_source


def export(a, job: Job) -> int:
    """A model folder: the traced modules, their checks, the optional AOTI and FP8 UNets and
    model.json, built in job.tmp and published to job.out."""
    kind, dtype, device, out, tmp, t_start = job.kind, job.dtype, job.device, job.out, job.tmp, job.t_start
    torch.set_grad_enabled(False)
    log(f"export {kind}: dtype {job.dtype_name}, device {device}, torch {torch.__version__} -> {out}")
    files_meta = {}
    if kind == "from":
        pipe, name, source, files_meta = load_source(a, device, dtype, tmp)
        seed = None
    else:
        pipe = build_random_pipeline(kind, device, dtype, a.seed, tmp)
        name, source, seed = f"sdxl-{kind}", kind, a.seed
    pred = apply_prediction(a, pipe, kind)
    t_built = time.time()
    d = model_dims(pipe, dtype)
    if a.fp8 and d["unet_in"] != d["latent_channels"]:
        raise SystemExit("--fp8 calibrates its scales on text-to-image runs, which an inpainting UNet "
                         f"({d['unet_in']} input channels) does not make: export it without --fp8")
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

    tiny = kind in TINY_KINDS
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
    if pred["guidance_rescale"]:
        defaults["guidance_rescale"] = pred["guidance_rescale"]
    vae_aoti_meta = None
    if a.aoti and "vae" in a.aoti_variants:
        t0 = time.time()
        vae_aoti_meta = export_vae_decoder_aoti(vae, dtype, device, tmp, a.aoti_size, limits, d["vae_down"],
                                                (defaults["width"], defaults["height"]),
                                                parse_inductor_configs(a.aoti_config), gen)
        timings["aoti_vae_decoder"] = time.time() - t0
    fp8_meta = None
    if a.fp8:
        # Imported here: fp8 brings in Triton and torch._dynamo (about 2 s), which no other export needs.
        from .fp8 import export_unet_fp8

        fp8_meta = export_unet_fp8(a, pipe, tmp, dtype, device, defaults, trace_inputs[:3], timings,
                                   dict(limits=limits, vae_down=d["vae_down"], ctx_dim=d["ctx_dim"], pdim=d["pdim"],
                                        gen=gen))

    t0 = time.time()
    files = file_digests(tmp)
    timings["sha256"] = time.time() - t0
    parts = {"aoti": aoti_meta, "fp8": fp8_meta, "control": trace_inputs[3], "ip_adapter": trace_inputs[4],
             "regions": regions_layout(pipe.unet, a.max_regions), "vae_aoti": vae_aoti_meta}
    meta = model_meta(pipe, d, job.dtype_name, device, dict(name=name, source=source, seed=seed), parts, defaults,
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
    lat, unet_in = int(vae.config.latent_channels), int(unet.config.in_channels)
    if unet_in not in (lat, 2 * lat + 1):  # diffusers' inpaint pipeline takes these two (4 and 9 for SDXL)
        raise SystemExit(f"the UNet takes {unet_in} input channels: sdxl-batch runs a UNet of the VAE's {lat} latent "
                         f"channels, or an inpainting UNet of {2 * lat + 1} (latents, mask, masked image latents)")
    assert unet.config.cross_attention_dim == h1 + h2, (unet.config.cross_attention_dim, h1, h2)
    pad1, pad2 = pipe.tokenizer.pad_token, pipe.tokenizer_2.pad_token
    return dict(h1=h1, h2=h2, pdim=te2.config.projection_dim, ctx_dim=h1 + h2, pad1=pad1, pad2=pad2,
                pad1_id=pipe.tokenizer.convert_tokens_to_ids(pad1), pad2_id=pipe.tokenizer_2.convert_tokens_to_ids(pad2),
                vae_dtype=torch.float32 if (dtype == torch.float16 and vae.config.force_upcast) else dtype,
                scaling=float(vae.config.scaling_factor), vae_down=2 ** (len(vae.config.block_out_channels) - 1),
                latent_channels=lat, unet_in=unet_in,
                n_up=len(unet.config.block_out_channels) - 1)  # n_up: the UNet's num_upsamplers


def trace_modules(pipe, d: dict, tmp: Path, dtype, device, gen, timings: dict) -> tuple:
    """Traces text_encoder.ts, text_encoder_2.ts, unet.ts (eight methods) and the VAE (in
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
    inp = unet_inputs(2, lat_w * 8, lat_h * 8, 1, d["ctx_dim"], d["pdim"], dtype, device, gen, d["unet_in"])
    control = control_layout(unet.config)
    res = control_residuals(control, 2, lat_h, lat_w, dtype, device, gen)
    ip = ip_layout(unet)
    kv = ip_kv_inputs(ip, 2, 5, dtype, device, gen)  # 5 tokens: no count of a real adapter gets baked in
    # The regional methods: 3 prompts and 2 image groups a row (no count of 1 gets baked in as a broadcast),
    # drawn from a generator of their own (gen's later draws, the VAE's, AOTI's and FP8's inputs, stay as they were).
    ctx, weights, rkv, masks = regional_inputs(regions_layout(unet, 1), ip, 2, 3, 2, lat_h, lat_w, 1, d["ctx_dim"],
                                               dtype, device, torch.Generator().manual_seed(59))
    rin = (*inp[:2], ctx, *inp[3:], weights)
    warns["unet.ts"] = trace_module(UNetTS(unet, dtype), {"forward": inp, "forward_control": inp + (res,),
                                                          "forward_ip": inp + (kv,),
                                                          "forward_control_ip": inp + (res, kv),
                                                          "forward_regional": rin,
                                                          "forward_regional_control": rin + (res,),
                                                          "forward_regional_ip": rin + (rkv, masks),
                                                          "forward_regional_control_ip": rin + (res, rkv, masks)},
                                    tmp / "unet.ts")
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
    msgs = tracer_warnings(caught)
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


def apply_prediction(a, pipe, kind: str) -> dict:
    """The source's prediction settings with the flags over them (checkpoint_family.prediction_settings)
    put into the pipeline's scheduler, which model.json and --save-diffusers record."""
    from diffusers import EulerDiscreteScheduler

    src = Path(a.from_path) if kind == "from" else None
    markers = checkpoint_markers(src.resolve()) if src is not None and src.is_file() else None
    pred = prediction_settings(a, dict(pipe.scheduler.config) if src is not None else {}, markers)
    sched = {k: pred[k] for k in ("prediction_type", "rescale_betas_zero_snr", "timestep_spacing") if k in pred}
    pipe.scheduler = EulerDiscreteScheduler.from_config(pipe.scheduler.config, **sched)
    log(f"  scheduler: {pred['prediction_type']}, zero-SNR {'on' if pred['rescale_betas_zero_snr'] else 'off'}, "
        f"spacing {pipe.scheduler.config.timestep_spacing}, default guidance_rescale {pred['guidance_rescale']}")
    return pred


def model_meta(pipe, d: dict, dtype_name: str, device, origin: dict, parts: dict, defaults: dict, limits: dict,
               files_meta: dict, files: dict) -> dict:
    """model.json (docs/models-and-export.md: the model directory contract); origin: name,
    source, seed; parts: the UNet's optional aoti and fp8 parts and its control / ip_adapter / regions
    layouts, and vae_aoti: the VAE decoder's optional AOTI package."""
    te1, te2, unet = pipe.text_encoder, pipe.text_encoder_2, pipe.unet
    sc = pipe.scheduler.config
    return {
        "format_version": 1,
        "name": origin["name"],
        "source": origin["source"],
        "architecture": "sdxl-base",
        "dtype": dtype_name,
        "vae_dtype": dtype_str(d["vae_dtype"]),
        "export_device": device,
        "torch_version": torch.__version__,
        "seed": origin["seed"],
        "vae_scaling_factor": d["scaling"],
        "vae_downsample": d["vae_down"],
        "latent_channels": d["latent_channels"],
        "text_encoders": [
            {"file": "text_encoder.ts", "tokenizer": "tokenizer", "pad_token": d["pad1"], "hidden_dim": d["h1"],
             "hidden_states": te1.config.num_hidden_layers + 1},
            {"file": "text_encoder_2.ts", "tokenizer": "tokenizer_2", "pad_token": d["pad2"], "hidden_dim": d["h2"],
             "pooled_dim": d["pdim"], "hidden_states": te2.config.num_hidden_layers + 1},
        ],
        "unet": {"file": "unet.ts", "in_channels": int(unet.config.in_channels), "context_dim": d["ctx_dim"],
                 "pooled_dim": d["pdim"], "time_ids_dim": 6, "parameters": count_params(unet),
                 "control": parts["control"], "ip_adapter": parts["ip_adapter"], "regions": parts["regions"],
                 **({"aoti": parts["aoti"]} if parts["aoti"] else {}),
                 **({"fp8": parts["fp8"]} if parts["fp8"] else {})},
        "vae_decoder": {"file": "vae_decoder.ts", **({"aoti": parts["vae_aoti"]} if parts["vae_aoti"] else {})},
        "vae_encoder": {"file": "vae_encoder.ts"},
        "scheduler": {**{k: sc[k] for k in ("num_train_timesteps", "beta_start", "beta_end", "beta_schedule",
                                            "timestep_spacing", "steps_offset", "prediction_type")},
                      "rescale_betas_zero_snr": bool(sc.get("rescale_betas_zero_snr", False))},
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

