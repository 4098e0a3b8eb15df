#!/usr/bin/env python3
"""Probe (GPU machine): would cuDNN's own FP8 attention (sdpa_fp8) and FP8 convolution (conv_fprop on
e4m3 inputs), reached through the cudnn-frontend graph API, be faster than the fp16 cuDNN kernels the
compiled FP8 UNet step runs now (~33 ms of flash attention, ~35 ms of 3x3 convolutions per step at
16 rows), and how far are their outputs from fp16?

torch 2.11 has no FP8 attention or FP8 convolution that helps; a C++ custom op over the cudnn-frontend
graph API would be the way in. This probe builds the same graphs with the frontend's Python package
(nvidia-cudnn-frontend 1.23, `import cudnn`, loaded after torch's own libcudnn so both use one library).

Attention (head dim 64, attn_scale 0.125, --rows = batch; q, k, v in the [b, s, h, d] layout the UNet's
projections write, given to cuDNN as (b, h, s, d) with strides (s*h*d, d, h*d, 1)):
  self level 1   10 heads, 4096 x 4096 tokens   (10 calls per UNet step)
  self level 2   20 heads, 1024 x 1024          (60)
  cross level 1  10 heads, 4096 x 77            (10)
  cross level 2  20 heads, 1024 x 77            (60)
  fp16-cudnn / fp16-default  F.scaled_dot_product_attention on the (b, h, s, d) views, cuDNN backend / default choice
  fp8   sdpa_fp8 on e4m3 q, k, v (per-tensor scale 448/amax; softmax P scale 448); output HALF first (frontend
        1.23 allows it on Blackwell only), else e4m3 with scale_o = 448/amax(reference output), dequantised in
        torch (timed apart); for 77 kv tokens, if the plain graph is refused, k/v padded with zeros to a
        multiple of 64 plus a padding mask (seq_len_kv = 77)
  quantise  fp16 q, k, v to e4m3 in torch eager (what an un-fused quantisation would cost)
Convolution (3x3, padding 1, with bias, --rows = N, NHWC):
  level 0 320->320 at 128x128, level 1 640->640 at 64x64, level 2 1280->1280 at 32x32
  fp16  F.conv2d channels-last (cudnn.benchmark on); fp8  X e4m3 NHWC, W e4m3 KRSC, conv_fprop (fp32
  compute), x descale_x*descale_w, + bias (HALF), Y HALF NHWC; refused graphs retried without the fused
  bias (added in torch), then with Y in FLOAT; quantise  X to e4m3 in torch eager
Every output is compared with an fp32 reference (math SDPA / conv without TF32): relative L2. Timing: CUDA
events, 3 warm-up calls, median of --iters calls. A failing case records its error and the run goes on.
Results: --out/cudnn-fp8-probe.json (rewritten after each case) and a markdown table on stdout.

    PYTHONPATH=<site with nvidia-cudnn-frontend> python3 bench/lab/2026-12-fp8-unet/cudnn_fp8_probe.py --out DIR
        [--rows 16] [--iters 20] [--cases attn,conv]
    python3 bench/lab/2026-12-fp8-unet/cudnn_fp8_probe.py --dry-build [--sm 90] [--out DIR]   # no GPU: graphs up to validate()
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

E4M3_MAX = 448.0
HEAD_DIM = 64
ATTN_SCALE = 0.125
# (name, heads, q tokens, kv tokens, calls per UNet step)
ATTN_CASES = [("self level 1", 10, 4096, 4096, 10), ("self level 2", 20, 1024, 1024, 60),
              ("cross level 1", 10, 4096, 77, 10), ("cross level 2", 20, 1024, 77, 60)]
# (name, channels in = out, height = width)
CONV_CASES = [("conv level 0", 320, 128), ("conv level 1", 640, 64), ("conv level 2", 1280, 32)]
SDPA_UID = {n: i + 1 for i, n in enumerate(("q", "k", "v", "o", "descale_q", "descale_k", "descale_v", "descale_s",
                                            "scale_s", "scale_o", "amax_s", "amax_o", "seq_len_q", "seq_len_kv"))}
CONV_UID = {"x": 1, "w": 2, "descale": 3, "bias": 4, "y": 5}


@dataclasses.dataclass
class Ctx:
    cudnn: object
    graph_kwargs: dict  # {"handle": h} on the GPU, {"sm_version": 90} for --dry-build
    handle: int | None = None
    iters: int = 20
    dry: bool = False


def short(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[:800]}"


def rel_l2(a, ref) -> float:
    return round(float((a.float() - ref.float()).norm() / ref.float().norm()), 5)


def median_ms(fn, iters: int, warmup: int = 3) -> float:
    """Median of iters calls of fn, each between two CUDA events on the current stream."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in pairs:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return round(statistics.median(s.elapsed_time(e) for s, e in pairs), 4)


def loaded_cudnn_libs() -> list[str]:
    """The libcudnn*.so files this process has mapped (one copy of libcudnn.so.9 expected)."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    return sorted({ln.split()[-1] for ln in maps if "libcudnn" in ln and ln.split()[-1].startswith("/")})


def load_cudnn_frontend(on_gpu: bool):
    """torch loads its libcudnn first (one conv on cuda), then `import cudnn` finds that library."""
    info = {"torch_cudnn": torch.backends.cudnn.version()}
    if on_gpu:
        x = torch.randn(1, 8, 8, 8, device="cuda", dtype=torch.float16)
        F.conv2d(x, torch.randn(8, 8, 3, 3, device="cuda", dtype=torch.float16), padding=1)
        torch.cuda.synchronize()
    try:
        import cudnn
    except Exception as e:  # noqa: BLE001  (a missing package or a library it cannot load)
        info["import_error"] = short(e)
        return None, info
    info.update(frontend=getattr(cudnn, "__version__", "?"), backend=cudnn.backend_version(),
                backend_string=cudnn.backend_version_string(), module=str(Path(cudnn.__file__).parent))
    info["libcudnn_loaded"] = loaded_cudnn_libs()
    return cudnn, info


def finish_graph(ctx: Ctx, g):
    """validate .. build_plans; --dry-build stops after validate()."""
    g.validate()
    if ctx.dry:
        return g
    g.build_operation_graph()
    g.create_execution_plans([ctx.cudnn.heur_mode.A, ctx.cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return g


def quantise(x, amax: float):
    """Per-tensor e4m3 (scale 448/amax) in torch eager; returns the e4m3 tensor and its descale (1,1,1,1) fp32."""
    scale = E4M3_MAX / amax
    return (x * scale).to(torch.float8_e4m3fn), torch.full((1, 1, 1, 1), 1 / scale, device=x.device)


def scalar(v: float):
    return torch.full((1, 1, 1, 1), v, device="cuda", dtype=torch.float32)


def bshd_stride(h: int, s: int, d: int = HEAD_DIM) -> tuple:
    return (s * h * d, d, h * d, 1)


# ---------------------------------------------------------------------------------------------- attention


def sdpa_fp8_graph(ctx: Ctx, b: int, h: int, sq: int, skv: int, out_fp8: bool, padded: bool):
    """The sdpa_fp8 forward graph on [b, s, h, d] e4m3 q, k, v (skv: the kv length the buffers hold)."""
    dt = ctx.cudnn.data_type
    g = ctx.cudnn.pygraph(io_data_type=dt.FP8_E4M3, intermediate_data_type=dt.FLOAT, compute_data_type=dt.FLOAT,
                          **ctx.graph_kwargs)

    def t(name, dim, stride, dtype):
        return g.tensor(name=name, uid=SDPA_UID[name], dim=dim, stride=stride, data_type=dtype)

    q = t("q", (b, h, sq, HEAD_DIM), bshd_stride(h, sq), dt.FP8_E4M3)
    k = t("k", (b, h, skv, HEAD_DIM), bshd_stride(h, skv), dt.FP8_E4M3)
    v = t("v", (b, h, skv, HEAD_DIM), bshd_stride(h, skv), dt.FP8_E4M3)
    one = ((1, 1, 1, 1), (1, 1, 1, 1), dt.FLOAT)
    scales = {n: t(n, *one) for n in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")}
    extra = {}
    if padded:
        extra = {"use_padding_mask": True,
                 "seq_len_q": t("seq_len_q", (b, 1, 1, 1), (1, 1, 1, 1), dt.INT32),
                 "seq_len_kv": t("seq_len_kv", (b, 1, 1, 1), (1, 1, 1, 1), dt.INT32)}
    o, _stats, amax_s, amax_o = g.sdpa_fp8(q=q, k=k, v=v, **scales, generate_stats=False, attn_scale=ATTN_SCALE,
                                           **extra)
    o.set_uid(SDPA_UID["o"]).set_output(True).set_dim((b, h, sq, HEAD_DIM)).set_stride(bshd_stride(h, sq))
    o.set_data_type(dt.FP8_E4M3 if out_fp8 else dt.HALF)
    for name, a in (("amax_s", amax_s), ("amax_o", amax_o)):
        a.set_uid(SDPA_UID[name]).set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1))
        a.set_data_type(dt.FLOAT)
    return finish_graph(ctx, g)


def sdpa_attempts(skv: int) -> list[dict]:
    """Output HALF, then e4m3; for a kv length not a multiple of 64 the same again on padded k/v."""
    tries = [{"out": "HALF", "kv_padded_to": None}, {"out": "FP8_E4M3", "kv_padded_to": None}]
    if skv % 64:
        pad = -(-skv // 64) * 64
        tries += [{"out": "HALF", "kv_padded_to": pad}, {"out": "FP8_E4M3", "kv_padded_to": pad}]
    return tries


def pad_tokens(x8, n: int):
    """[b, s, h, d] e4m3 -> [b, n, h, d] with zeros after s (copied as bytes)."""
    b, s, h, d = x8.shape
    out = torch.zeros(b, n, h, d, device=x8.device, dtype=torch.uint8)
    out[:, :s].copy_(x8.view(torch.uint8))
    return out.view(torch.float8_e4m3fn)


def fp8_attention_setup(ctx: Ctx, q8, k8, v8, descales: dict, o_amax: float, cfg: dict):
    """Builds the graph for cfg and its buffers; returns run() (the graph alone), read() (the output as
    fp32, (b, h, s, d)) and dequant() (the e4m3 -> fp16 step, None for a HALF output)."""
    b, sq, h, _ = q8.shape
    skv = k8.shape[1]
    out_fp8, pad = cfg["out"] == "FP8_E4M3", cfg["kv_padded_to"]
    g = sdpa_fp8_graph(ctx, b, h, sq, pad or skv, out_fp8, pad is not None)
    if pad:
        k8, v8 = pad_tokens(k8, pad), pad_tokens(v8, pad)
    scale_o = E4M3_MAX / o_amax if out_fp8 else 1.0
    o = torch.empty(b, sq, h, HEAD_DIM, device="cuda", dtype=torch.float8_e4m3fn if out_fp8 else torch.float16)
    bufs = {"q": q8, "k": k8, "v": v8, "o": o, **descales, "descale_s": scalar(1 / E4M3_MAX),
            "scale_s": scalar(E4M3_MAX), "scale_o": scalar(scale_o), "amax_s": scalar(0.0), "amax_o": scalar(0.0)}
    if pad:
        bufs["seq_len_q"] = torch.full((b, 1, 1, 1), sq, device="cuda", dtype=torch.int32)
        bufs["seq_len_kv"] = torch.full((b, 1, 1, 1), skv, device="cuda", dtype=torch.int32)
    ws = torch.empty(max(g.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
    pack = {SDPA_UID[n]: t.data_ptr() for n, t in bufs.items()}
    bufs["workspace"] = ws  # keeps every buffer alive with the closures

    def run():
        g.execute(pack, ws.data_ptr(), handle=ctx.handle)

    def dequant():
        return o.to(torch.float16).mul_(1 / scale_o)

    def read():
        return (dequant() if out_fp8 else o).float().transpose(1, 2)

    run.bufs = bufs
    return run, read, (dequant if out_fp8 else None)


def first_that_runs(ctx: Ctx, attempts: list[dict], setup, ref, flops: float, extra_key: str) -> dict:
    """Times the first configuration whose graph cuDNN builds and runs (setup(cfg) -> run, read, extra:
    the graph alone, its output as fp32, and the torch step it leaves over, timed as extra_key); the
    configurations refused before it are listed with their errors."""
    refused = []
    for cfg in attempts:
        try:
            run, read, extra = setup(cfg)
            run()
            torch.cuda.synchronize()
            out = read()
            ms = median_ms(run, ctx.iters)
        except Exception as e:  # noqa: BLE001  (cudnnGraphNotSupportedError, or a failure to run)
            refused.append({**cfg, "error": short(e)})
            continue
        r = {"config": cfg, "ms": ms, "tflops": round(flops / ms / 1e9, 1), "rel_l2_vs_fp32": rel_l2(out, ref),
             "finite": bool(torch.isfinite(out).all()), "refused": refused}
        if extra is not None:
            r[extra_key] = median_ms(extra, ctx.iters)
        return r
    return {"error": "no configuration built and ran", "refused": refused}


def fp8_attention(ctx: Ctx, q, k, v, ref, flops: float) -> dict:
    """cuDNN FP8 SDPA: the first configuration of sdpa_attempts that builds and runs."""
    q8, dq = quantise(q, float(q.abs().amax()))
    k8, dk = quantise(k, float(k.abs().amax()))
    v8, dv = quantise(v, float(v.abs().amax()))
    descales = {"descale_q": dq, "descale_k": dk, "descale_v": dv}
    o_amax = float(ref.abs().amax())
    return first_that_runs(ctx, sdpa_attempts(k.shape[1]),
                           lambda cfg: fp8_attention_setup(ctx, q8, k8, v8, descales, o_amax, cfg), ref, flops,
                           "dequant_ms")


def reference_attention(q, k, v, chunk: int = 2):
    """fp32 math-backend SDPA on the (b, h, s, d) views, a few rows at a time (the 4096² score matrices)."""
    outs = []
    with sdpa_kernel([SDPBackend.MATH]):
        for i in range(0, q.shape[0], chunk):
            qs, ks, vs = (t[i:i + chunk].transpose(1, 2).float() for t in (q, k, v))
            outs.append(F.scaled_dot_product_attention(qs, ks, vs))
    return torch.cat(outs)


def timed_output(fn, iters: int, flops: float, ref) -> dict:
    try:
        out = fn()
        torch.cuda.synchronize()
        ms = median_ms(fn, iters)
        return {"ms": ms, "tflops": round(flops / ms / 1e9, 1), "rel_l2_vs_fp32": rel_l2(out, ref)}
    except Exception as e:  # noqa: BLE001
        return {"error": short(e)}


def attention_case(ctx: Ctx, rows: int, heads: int, sq: int, skv: int, calls: int, seed: int) -> dict:
    g = torch.Generator("cuda").manual_seed(seed)
    q = torch.randn(rows, sq, heads, HEAD_DIM, generator=g, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(rows, skv, heads, HEAD_DIM, generator=g, device="cuda", dtype=torch.float16) for _ in "kv")
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    flops = 4 * rows * heads * sq * skv * HEAD_DIM
    ref = reference_attention(q, k, v)
    r = {"kind": "attention", "shape": {"b": rows, "heads": heads, "s_q": sq, "s_kv": skv, "d": HEAD_DIM},
         "calls_per_step": calls}

    def sdpa_cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qt, kt, vt)

    r["fp16_cudnn"] = timed_output(sdpa_cudnn, ctx.iters, flops, ref)
    r["fp16_default"] = timed_output(lambda: F.scaled_dot_product_attention(qt, kt, vt), ctx.iters, flops, ref)
    amax = [float(t.abs().amax()) for t in (q, k, v)]
    r["quantise_ms"] = median_ms(lambda: [quantise(t, a) for t, a in zip((q, k, v), amax)], ctx.iters)
    r["fp8"] = fp8_attention(ctx, q, k, v, ref, flops)
    return summarise(r, calls)


def summarise(r: dict, calls: int | None) -> dict:
    """Speed-up of the FP8 kernel against fp16 (cuDNN SDPA where it ran, else the default / the conv), and the
    saving per call and per UNet step, also with the eager quantise/dequantise/bias added to the FP8 side."""
    base = next((r[k] for k in ("fp16_cudnn", "fp16_default", "fp16") if "ms" in r.get(k, {})), None)
    fp8 = r.get("fp8", {})
    if base is None or "ms" not in fp8:
        return r
    eager = r.get("quantise_ms", 0.0) + fp8.get("dequant_ms", 0.0) + fp8.get("bias_ms", 0.0)
    r["fp16_base_ms"] = base["ms"]
    r["speedup"] = round(base["ms"] / fp8["ms"], 3)
    r["speedup_with_eager_quant"] = round(base["ms"] / (fp8["ms"] + eager), 3)
    r["per_call_saving_ms"] = round(base["ms"] - fp8["ms"], 4)
    if calls:
        r["per_step_saving_ms"] = round(calls * (base["ms"] - fp8["ms"]), 3)
        r["per_step_saving_with_eager_quant_ms"] = round(calls * (base["ms"] - fp8["ms"] - eager), 3)
    return r


# -------------------------------------------------------------------------------------------- convolution


def conv_fp8_graph(ctx: Ctx, n: int, c: int, hw: int, bias: bool, y_float: bool):
    """X e4m3 NHWC, W e4m3 KRSC, conv_fprop (fp32 compute), x (descale_x*descale_w), [+ bias], Y NHWC."""
    dt = ctx.cudnn.data_type
    g = ctx.cudnn.pygraph(io_data_type=dt.HALF, intermediate_data_type=dt.FLOAT, compute_data_type=dt.FLOAT,
                          **ctx.graph_kwargs)
    x = g.tensor(name="x", uid=CONV_UID["x"], dim=(n, c, hw, hw), stride=(c * hw * hw, 1, c * hw, c),
                 data_type=dt.FP8_E4M3)
    w = g.tensor(name="w", uid=CONV_UID["w"], dim=(c, c, 3, 3), stride=(c * 9, 1, c * 3, c), data_type=dt.FP8_E4M3)
    descale = g.tensor(name="descale", uid=CONV_UID["descale"], dim=(1, 1, 1, 1), stride=(1, 1, 1, 1),
                       data_type=dt.FLOAT)
    y = g.conv_fprop(image=x, weight=w, padding=[1, 1], stride=[1, 1], dilation=[1, 1], compute_data_type=dt.FLOAT)
    y = g.scale(input=y, scale=descale)
    if bias:
        b = g.tensor(name="bias", uid=CONV_UID["bias"], dim=(1, c, 1, 1), stride=(c, 1, c, c), data_type=dt.HALF)
        y = g.bias(input=y, bias=b)
    y.set_uid(CONV_UID["y"]).set_output(True).set_dim((n, c, hw, hw)).set_stride((c * hw * hw, 1, c * hw, c))
    y.set_data_type(dt.FLOAT if y_float else dt.HALF)
    return finish_graph(ctx, g)


CONV_ATTEMPTS = [{"bias_fused": True, "y": "HALF"}, {"bias_fused": False, "y": "HALF"},
                 {"bias_fused": True, "y": "FLOAT"}, {"bias_fused": False, "y": "FLOAT"}]


def fp8_conv_setup(ctx: Ctx, x8, w8, descale: float, bias, cfg: dict):
    """x8 [n, h, w, c] and w8 [k, r, s, c] e4m3; returns run() and read() (the output NCHW view, bias added)."""
    n, hw, _, c = x8.shape
    g = conv_fp8_graph(ctx, n, c, hw, cfg["bias_fused"], cfg["y"] == "FLOAT")
    y = torch.empty(n, hw, hw, c, device="cuda", dtype=torch.float32 if cfg["y"] == "FLOAT" else torch.float16)
    bufs = {"x": x8, "w": w8, "descale": scalar(descale), "y": y}
    if cfg["bias_fused"]:
        bufs["bias"] = bias
    ws = torch.empty(max(g.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
    pack = {CONV_UID[k]: t.data_ptr() for k, t in bufs.items()}
    bufs["workspace"] = ws

    def run():
        g.execute(pack, ws.data_ptr(), handle=ctx.handle)

    def add_bias():
        return y.permute(0, 3, 1, 2) + bias.view(1, c, 1, 1)

    def read():
        return y.permute(0, 3, 1, 2) if cfg["bias_fused"] else add_bias()

    run.bufs = bufs
    return run, read, (None if cfg["bias_fused"] else add_bias)


def fp8_conv(ctx: Ctx, x_nhwc, w_krsc, bias, ref, flops: float) -> dict:
    """cuDNN FP8 convolution: the first configuration of CONV_ATTEMPTS that builds and runs."""
    (x8, dx), (w8, dw) = quantise(x_nhwc, float(x_nhwc.abs().amax())), quantise(w_krsc, float(w_krsc.abs().amax()))
    descale = float(dx) * float(dw)
    return first_that_runs(ctx, CONV_ATTEMPTS, lambda cfg: fp8_conv_setup(ctx, x8, w8, descale, bias, cfg), ref, flops,
                           "bias_ms")


def conv_case(ctx: Ctx, rows: int, c: int, hw: int, seed: int) -> dict:
    g = torch.Generator("cuda").manual_seed(seed)
    x_nhwc = torch.randn(rows, hw, hw, c, generator=g, device="cuda", dtype=torch.float16)
    w_krsc = (torch.randn(c, 3, 3, c, generator=g, device="cuda") / (9 * c) ** 0.5).half()
    bias = (torch.randn(c, generator=g, device="cuda") * 0.1).half()
    x, w = x_nhwc.permute(0, 3, 1, 2), w_krsc.permute(0, 3, 1, 2)  # channels-last NCHW / KCRS views
    flops = 2 * rows * hw * hw * c * c * 9
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=False, allow_tf32=False):
        ref = F.conv2d(x.float(), w.float(), bias.float(), padding=1)
    r = {"kind": "conv", "shape": {"n": rows, "c": c, "k": c, "h": hw, "w": hw, "kernel": 3}}
    r["fp16"] = timed_output(lambda: F.conv2d(x, w, bias, padding=1), ctx.iters, flops, ref)
    x_amax = float(x_nhwc.abs().amax())
    r["quantise_ms"] = median_ms(lambda: quantise(x_nhwc, x_amax), ctx.iters)
    r["fp8"] = fp8_conv(ctx, x_nhwc, w_krsc, bias, ref, flops)
    return summarise(r, None)


# ------------------------------------------------------------------------------------------------ driver


def dry_build(ctx: Ctx, rows: int, cases: list[str]) -> dict:
    """Every graph configuration up to validate(), without a GPU (sm_version given to the graph)."""
    res = {}
    for name, heads, sq, skv, _ in ATTN_CASES if "attn" in cases else []:
        for cfg in sdpa_attempts(skv):
            key = f"{name} out={cfg['out']} pad={cfg['kv_padded_to']}"
            try:
                sdpa_fp8_graph(ctx, rows, heads, sq, cfg["kv_padded_to"] or skv, cfg["out"] == "FP8_E4M3",
                               cfg["kv_padded_to"] is not None)
                res[key] = "validated"
            except Exception as e:  # noqa: BLE001
                res[key] = short(e)
    for name, c, hw in CONV_CASES if "conv" in cases else []:
        for cfg in CONV_ATTEMPTS:
            key = f"{name} bias_fused={cfg['bias_fused']} y={cfg['y']}"
            try:
                conv_fp8_graph(ctx, rows, c, hw, cfg["bias_fused"], cfg["y"] == "FLOAT")
                res[key] = "validated"
            except Exception as e:  # noqa: BLE001
                res[key] = short(e)
    for key, v in res.items():
        print(f"{key}: {v[:200]}", flush=True)
    return res


def fmt(d: dict, key: str = "ms") -> str:
    v = d.get(key) if isinstance(d, dict) else None
    return "err" if v is None else f"{v:g}"


def print_table(cases: dict) -> None:
    print("\n| case | shape | fp16 ms (cuDNN / default) | fp8 ms | fp8 config | quant ms | dequant/bias ms "
          "| rel L2 fp16 / fp8 | TFLOP/s fp16 / fp8 | speed-up | calls/step | saving ms/step (per call) |")
    print("|" + "---|" * 12)
    for name, r in cases.items():
        if "error" in r and "kind" not in r:
            print(f"| {name} | error: {r['error'][:80]} |" + " |" * 10)
            continue
        f16 = r.get("fp16_cudnn", r.get("fp16", {}))
        f16b = f" / {fmt(r['fp16_default'])}" if "fp16_default" in r else ""
        fp8 = r.get("fp8", {})
        shape = "x".join(str(v) for v in r["shape"].values())
        extra = fp8.get("dequant_ms", fp8.get("bias_ms", "-"))
        save = r.get("per_step_saving_ms", f"({r['per_call_saving_ms']})" if "per_call_saving_ms" in r else "-")
        print(f"| {name} | {shape} | {fmt(f16)}{f16b} | {fmt(fp8)} | {json.dumps(fp8.get('config', 'none'))} "
              f"| {r.get('quantise_ms', '-')} | {extra} | {fmt(f16, 'rel_l2_vs_fp32')} / {fmt(fp8, 'rel_l2_vs_fp32')} "
              f"| {fmt(f16, 'tflops')} / {fmt(fp8, 'tflops')} | {r.get('speedup', '-')} "
              f"| {r.get('calls_per_step', '-')} | {save} |")


def run_cases(ctx: Ctx, a, res: dict, out: Path) -> None:
    jobs = []
    if "attn" in a.cases:
        jobs += [(n, lambda h=h, sq=sq, skv=skv, c=c, i=i: attention_case(ctx, a.rows, h, sq, skv, c, i))
                 for i, (n, h, sq, skv, c) in enumerate(ATTN_CASES)]
    if "conv" in a.cases:
        torch.backends.cudnn.benchmark = True
        jobs += [(n, lambda c=c, hw=hw, i=i: conv_case(ctx, a.rows, c, hw, 100 + i))
                 for i, (n, c, hw) in enumerate(CONV_CASES)]
    for name, job in jobs:
        try:
            res["cases"][name] = job()
        except Exception as e:  # noqa: BLE001  (an fp16 baseline or reference that cannot run: say why, go on)
            res["cases"][name] = {"error": short(e)}
        torch.cuda.empty_cache()
        print(f"{name}: {json.dumps(res['cases'][name])[:600]}", flush=True)
        (out / "cudnn-fp8-probe.json").write_text(json.dumps(res, indent=1))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", help="result folder (required unless --dry-build)")
    ap.add_argument("--rows", type=int, default=16, help="batch rows (CFG: 2 per image), default 16")
    ap.add_argument("--iters", type=int, default=20, help="timed calls per measurement, default 20")
    ap.add_argument("--cases", default="attn,conv", help="comma list of attn, conv (default both)")
    ap.add_argument("--dry-build", action="store_true", help="no GPU: build the cuDNN graphs up to validate() only")
    ap.add_argument("--sm", type=int, default=90, help="SM version the --dry-build graphs validate for (default 90)")
    a = ap.parse_args()
    a.cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    if not a.cases or set(a.cases) - {"attn", "conv"}:
        ap.error(f"--cases takes attn and/or conv, got {a.cases}")
    if not a.dry_build and not a.out:
        ap.error("--out is required (unless --dry-build)")
    if a.rows < 1 or a.iters < 1:
        ap.error("--rows and --iters must be positive")
    return a


def main() -> int:
    a = parse_args()
    if not a.dry_build and not torch.cuda.is_available():
        print("cudnn_fp8_probe: no CUDA device here; run it on the GPU machine (or use --dry-build)", file=sys.stderr)
        return 2
    out = Path(a.out) if a.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    cudnn, versions = load_cudnn_frontend(on_gpu=not a.dry_build)
    res = {"rows": a.rows, "iters": a.iters, "torch": torch.__version__, "cuda": torch.version.cuda,
           "versions": versions, "cases": {}}
    if cudnn is None:
        print(f"cudnn_fp8_probe: `import cudnn` failed, nothing measured: {versions['import_error']}", flush=True)
    elif a.dry_build:
        res["dry_build"] = dry_build(Ctx(cudnn, {"sm_version": a.sm}, dry=True), a.rows, a.cases)
    else:
        torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 references
        res["gpu"], res["capability"] = torch.cuda.get_device_name(), list(torch.cuda.get_device_capability())
        handle = cudnn.create_handle()
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
        run_cases(Ctx(cudnn, {"handle": handle}, handle=handle, iters=a.iters), a, res, out)
        print_table(res["cases"])
    if out:
        (out / "cudnn-fp8-probe.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
