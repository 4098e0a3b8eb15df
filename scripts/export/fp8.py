"""export_sdxl.py --fp8: the export step of the FP8 UNet: calibrate, quantise (fp8_quant holds the
layer contract), with --fp8-conv the 3x3 convolutions too (fp8_conv), with --fp8-geglu fuse each
feed-forward's GEGLU into its first GEMM (fp8_geglu), trace unet_fp8.ts with unet.ts's methods, check
it, and with --aoti compile unet_fp8.pt2; model.json's unet.fp8 (docs/models-and-export.md#fp8-unet)."""
from __future__ import annotations

import copy
import hashlib
import json
import time
from pathlib import Path

import torch

from . import fp8_conv, fp8_quant
from .aoti import export_unet_aoti, parse_inductor_configs
from .common import Checker, check_names, log, trace_module
from .sdxl_modules import UNetTS


def read_prompts(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise SystemExit(f"--fp8-prompts {path}: {e.strerror}")
    prompts = [l.strip() for l in lines if l.strip() and not l.lstrip().startswith("#")]
    if not prompts:
        raise SystemExit(f"--fp8-prompts {path}: no prompt in it (one per line, '#' starts a comment)")
    return prompts


def fp8_geglu_module(a):
    """fp8_geglu with --fp8-geglu (imported only then: it registers its op), its kernel variant checked
    before the calibration; else None."""
    if not a.fp8_geglu:
        return None
    from . import fp8_geglu

    try:
        fp8_geglu.kernel_variant()
    except ValueError as e:
        raise SystemExit(f"--fp8-geglu: {e}")
    return fp8_geglu


def export_unet_fp8(a, pipe, tmp: Path, dtype, device: str, defaults: dict, trace_inputs: tuple, timings: dict,
                    aoti_args: dict) -> dict:
    """Calibrates, quantises pipe.unet in place (fp8_quant), traces unet_fp8.ts with unet.ts's
    methods, checks it against the eager FP8 UNet, compiles unet_fp8.pt2 with --aoti; returns
    model.json's unet.fp8."""
    unet = pipe.unet
    inp, res, kv = trace_inputs
    prompts = read_prompts(Path(a.fp8_prompts))
    steps = a.fp8_steps or defaults["steps"]
    names = fp8_quant.fp8_layer_names(unet)
    conv_names = fp8_conv.fp8_conv_names(unet) if a.fp8_conv else []
    geglu = fp8_geglu_module(a)
    pipe.set_progress_bar_config(disable=True)
    ref = UNetTS(unet, dtype)(*inp)
    t0 = time.time()
    # One calibration run for the linear layers' and the convolutions' inputs: the same prompts and steps.
    amax = fp8_quant.calibrate(pipe, names + conv_names, prompts, steps, defaults["width"], defaults["height"],
                               defaults["cfg"], seed=1234)
    conv_amax = {k: amax.pop(k) for k in conv_names}
    timings["fp8_calibrate"] = time.time() - t0
    aoti_fp8 = a.aoti and "fp8" in a.aoti_variants
    unet16 = copy.deepcopy(unet) if aoti_fp8 else None  # the reference of unet_fp8.pt2's check
    n = fp8_quant.quantize_unet(unet, amax)  # in place: every later use of pipe.unet is the FP8 UNet
    n_conv = fp8_conv.quantize_convs(unet, conv_amax)
    # After the quantisation, before the error check: the rel. L2 below is the fused UNet's.
    n_geglu = geglu.fuse_geglu(unet) if geglu else 0
    if geglu and not n_geglu:
        raise SystemExit("--fp8-geglu: no feed-forward of this UNet has a GEGLU between two FP8 linear layers")
    wrapper = UNetTS(unet, dtype)
    got = wrapper(*inp)
    rel = float((got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12))
    convs = f" and {n_conv} 3x3 convolutions" if n_conv else ""
    fused = f", {n_geglu} feed-forwards' GEGLU fused into their first GEMM" if n_geglu else ""
    log(f"  fp8: {n} linear layers{convs} quantised{fused}, calibrated on {len(prompts)} prompts x {steps} steps at "
        f"{defaults['width']}x{defaults['height']} ({timings['fp8_calibrate']:.1f}s); "
        f"rel. L2 vs the {a.dtype or 'model'} UNet on the trace inputs {rel:.4f}")
    t0 = time.time()
    trace_module(wrapper, {"forward": inp, "forward_control": inp + (res,), "forward_ip": inp + (kv,),
                           "forward_control_ip": inp + (res, kv)}, tmp / "unet_fp8.ts")
    check_names(tmp / "unet_fp8.ts", unet, device, "unet_fp8")
    ts = torch.jit.load(str(tmp / "unet_fp8.ts"), map_location=device)
    chk = Checker(dtype, device)
    key = dict(batch=int(inp[0].shape[0]), width=int(inp[0].shape[3]) * 8, height=int(inp[0].shape[2]) * 8)
    with fp8_conv.emulated():  # the FP8 convolutions and fused GEGLUs as unet_fp8.ts runs them (fp8_conv's docstring)
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
    if n_conv:
        # --fp8-conv: sdxl-batch needs nothing of this (unet_fp8.pt2 holds the kernels); a record of the export.
        meta["conv"] = {"layers": n_conv, "format": fp8_conv.FORMAT, "op": fp8_conv.OP,
                        "kept_in_model_dtype": sorted(f"{ci}->{co} stride {st}" for ci, co, st in fp8_conv.FP16_SHAPES)
                        + list(fp8_conv.KEEP)}
    if n_geglu:
        # --fp8-geglu: likewise a record; unet_fp8.ts keeps the layers' tensors and names (net.0.proj, net.2).
        meta["geglu"] = {"layers": n_geglu, "format": geglu.FORMAT, "op": geglu.OP, "kernel": geglu.kernel_variant(),
                         "experimental": True}
    if aoti_fp8:
        t0 = time.time()
        meta["aoti"] = export_unet_aoti(unet, dtype, device, tmp, aoti_args["limits"], aoti_args["vae_down"],
                                        aoti_args["ctx_dim"], aoti_args["pdim"], a.aoti_size,
                                        parse_inductor_configs(a.aoti_config), aoti_args["gen"], file="unet_fp8.pt2",
                                        fp16_reference=UNetTS(unet16, dtype).eval())
        del unet16
        timings["aoti_unet_fp8"] = time.time() - t0
    return meta

