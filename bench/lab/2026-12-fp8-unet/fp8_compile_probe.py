#!/usr/bin/env python3
"""Probe (GPU machine): how fast is the FP8 UNet once Inductor fuses its input quantisation,
and where does the time of a compiled step go?

The full-size SDXL UNet with random weights (fp16, cuda), one CFG batch of --rows rows at
1024² (latent 128x128, 77 tokens). torch.compile (mode default, static shapes) of:
  fp16  the UNet as diffusers builds it;
  fp8   the same UNet with scripts/export/fp8_quant.py's layers (the layers export_sdxl.py --fp8
        quantises; input scales from one forward pass on the same inputs: the speed does
        not depend on their values).
For each: compile seconds (first call), then the median of --iters timed calls (CUDA
events), TFLOP/s from the UNet's FLOPs (13.52 TFLOP per CFG pair at 1024²), and the top
kernels of two profiled calls, and every kernel's time by class (GEMM, attention, convolution,
layout copies, and Inductor's Triton kernels by what they fuse) against the step's wall time.
--tuned KEY=VALUE (repeatable) adds a variant "fp8-tuned": the FP8 UNet compiled with those
Inductor settings (e.g. coordinate_descent_tuning=True). "fp16-dynamic" and "fp8-dynamic"
compile for dynamic row and token counts, as the AOTInductor packages are: their
step against the static one is what the packages lose to dynamic shapes. "fp8-dynamic-h2" is
fp8-dynamic compiled (and its Triton kernels tuned) on the export's example inputs (2 rows,
154 tokens, export_sdxl.py export_unet_aoti), then timed at --rows: the size hints the
packages were built with. "fp8-attn" adds FP8 attention
(Fp8FlexAttention: flex_attention with e4m3 q, k, v) to the FP8 linear layers, on the
self-attention layers (--fp8-attn-scope all: the cross-attention ones too); torch 2.11's
Inductor cannot lower it ("convert FlexibleLayout to FixedLayout first": the variant records
the error), and bench/lab/2026-12-fp8-unet/fp8_attention_probe.py measures the kernel on its own. Each variant's
output is compared with fp16's and fp8's (relative L2, same inputs). Results are written to
--out/fp8-compile-probe.json after each stage, so a cut-off run keeps what it measured.

This is torch.compile, not the AOTInductor package sdxl-batch loads; both lower the graph
with Inductor, so the step time is what unet_fp8.pt2 should reach (to be confirmed by
bench/gpu_runtime.sh fp8-aoti).

    python3 bench/lab/2026-12-fp8-unet/fp8_compile_probe.py --out DIR [--rows 8] [--iters 20] [--variants fp8,fp8-dynamic]
        [--tuned KEY=VALUE ...]
    python3 bench/lab/2026-12-fp8-unet/fp8_compile_probe.py --out DIR --cpu-check   # fp8-attn's scales, on the CPU
"""
from __future__ import annotations

import argparse
import ast
import collections
import contextlib
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "scripts"))
from export import fp8_quant  # noqa: E402  (scripts/export/, the export's package)
from export.architecture import architecture  # noqa: E402

VARIANTS = ("fp16", "fp16-dynamic", "fp8-dynamic-h2", "fp8-dynamic", "fp8", "fp8-tuned", "fp8-attn")
TFLOP_PER_PAIR = 13.52  # UNet FLOPs of one CFG pair (2 rows) at 1024² (bench/results speed tables)


def build_unet():
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    with torch.device("cuda"):
        torch.set_default_dtype(torch.float16)
        unet = UNet2DConditionModel(**architecture("full")["unet"])
        torch.set_default_dtype(torch.float32)
    return unet.eval().requires_grad_(False)


def inputs(rows: int, tokens: int = 77):
    g = torch.Generator("cuda").manual_seed(1)
    lat = torch.randn(rows, 4, 128, 128, generator=g, device="cuda", dtype=torch.float16)
    t = torch.full((rows,), 500.0, device="cuda")
    ctx = torch.randn(rows, tokens, 2048, generator=g, device="cuda", dtype=torch.float16)
    added = {"text_embeds": torch.randn(rows, 1280, generator=g, device="cuda", dtype=torch.float16),
             "time_ids": torch.tensor([[1024, 1024, 0, 0, 1024, 1024]] * rows, device="cuda", dtype=torch.float16)}
    return lat, t, ctx, added


def calibrate_one_pass(unet, inp) -> dict[str, float]:
    lat, t, ctx, added = inp
    with fp8_quant.input_amax(unet, fp8_quant.fp8_layer_names(unet)) as amax:
        unet(lat, t, ctx, added_cond_kwargs=added)
    return amax


def timed(fn, iters: int) -> list[float]:
    out = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return out


# Kernel classes, first match wins (names lower-cased). Library kernels by their library's
# names; Inductor's Triton kernels (triton_poi/per/red_fused_<aten ops>_N) by the ops they fuse
# -- a Triton kernel named after _scaled_mm is the quantisation of the matmul's input, not a GEMM.
LIBRARY_CLASSES = (
    ("attention", ("flash", "fmha", "sdpa", "attention")),
    ("convolution", ("fprop", "conv", "implicit_gemm", "dgrad")),
    ("gemm", ("nvjet", "gemm", "cutlass", "cublas")),
    ("layout copy", ("nchwtonhwc", "nhwctonchw", "transpose", "copy_kernel", "memcpy")),
)
TRITON_CLASSES = (
    ("GEGLU + FP8 quantise (Triton)", ("gelu",)),
    ("layer norm (+ FP8 quantise) (Triton)", ("layer_norm",)),
    ("group norm (Triton)", ("group_norm",)),
    ("FP8 quantise (Triton)", ("clamp",)),
    ("other Triton", ("",)),
)


def kernel_class(name: str) -> str:
    low = name.lower()
    classes = TRITON_CLASSES if low.startswith("triton_") else LIBRARY_CLASSES
    return next((c for c, keys in classes if any(k in low for k in keys)), "other")


def profile_kernels(fn, n: int = 25, classify=kernel_class) -> dict:
    """Two profiled calls: the top n kernels and every kernel's time summed by class (classify(kernel
    name)), per step."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        fn()
        torch.cuda.synchronize()
    rows, classes = [], collections.defaultdict(lambda: [0.0, 0])
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            ms, calls = t / 2 / 1000.0, e.count // 2
            rows.append({"kernel": e.key[:110], "class": classify(e.key), "calls": calls, "ms_per_step": round(ms, 3)})
            classes[rows[-1]["class"]][0] += ms
            classes[rows[-1]["class"]][1] += calls
    rows.sort(key=lambda r: -r["ms_per_step"])
    by_class = {c: {"ms_per_step": round(ms, 2), "kernel_calls": calls}
                for c, (ms, calls) in sorted(classes.items(), key=lambda kv: -kv[1][0])}
    return {"top_kernels": rows[:n], "by_class": by_class,
            "kernel_ms_per_step": round(sum(v[0] for v in classes.values()), 2),
            "kernel_calls_per_step": sum(v[1] for v in classes.values())}


def quantize_amax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x in e4m3 with a per-tensor scale from x's own amax (dynamic, per call)."""
    s = x.abs().amax().float().clamp(min=1e-12) / fp8_quant.E4M3_MAX
    return fp8_quant.quantize_tensor(x, s), s


def column_major(x: torch.Tensor) -> torch.Tensor:
    """The same values with the last two dimensions stored transposed (P @ V's right operand)."""
    return x.transpose(-2, -1).contiguous().transpose(-2, -1)


def flex_on_fp8(flex, q8, k8, v8, sq, sk, sv, upcast: bool = False, pin: bool = False) -> torch.Tensor:
    """flex_attention on e4m3 q, k, v ([B, H, N, D]) with their scales: the q/k scales applied to
    the scores (score_mod), v's to the output (fp32). upcast: the e4m3 values in fp32 (the CPU
    has no FP8 matmul). pin: each input as an as_strided view (a fixed layout for Inductor)."""
    if pin:
        q8, k8, v8 = (torch.as_strided(x, x.shape, x.stride()) for x in (q8, k8, v8))
    if upcast:
        q8, k8, v8 = q8.float(), k8.float(), v8.float()
    qk = sq * sk

    def descale(score, batch, head, q_idx, kv_idx):
        return score * qk

    return flex(q8, k8, v8, score_mod=descale).float() * sv


def fp8_flex_attention(flex, q, k, v, upcast: bool = False, pin: bool = False) -> torch.Tensor:
    """Attention of high-precision q, k, v ([B, H, N, D]) through flex_on_fp8: each quantised
    with its own amax, v stored column-major as the FP8 template wants it."""
    (q8, sq), (k8, sk), (v8, sv) = quantize_amax(q), quantize_amax(k), quantize_amax(v)
    return flex_on_fp8(flex, q8, k8, column_major(v8), sq, sk, sv, upcast, pin)


class Fp8FlexAttention:
    """diffusers attention processor (fp8-attn variant): fp8_flex_attention in place of SDPA
    (Inductor's Triton template runs both GEMMs in FP8, the softmax in fp32; P is cast to e4m3
    for P @ V). The layout of the transformer blocks' attention in SDXL: 3-D input, no mask,
    no norms, no residual inside the processor. upcast=True: see flex_on_fp8."""

    def __init__(self, upcast: bool = False) -> None:
        from torch.nn.attention.flex_attention import flex_attention

        self.flex, self.upcast = flex_attention, upcast

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, **kwargs):
        ctx = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        b, n, _ = hidden_states.shape
        q, k, v = attn.to_q(hidden_states), attn.to_k(ctx), attn.to_v(ctx)
        d = q.shape[-1] // attn.heads
        q, k, v = (x.view(b, -1, attn.heads, d).transpose(1, 2) for x in (q, k, v))
        out = fp8_flex_attention(self.flex, q, k, v, self.upcast)
        out = out.to(hidden_states.dtype).transpose(1, 2).reshape(b, n, attn.heads * d)
        return attn.to_out[1](attn.to_out[0](out))


def use_fp8_attention(unet, upcast: bool = False, scope: str = "self") -> int:
    """Sets Fp8FlexAttention on the self-attention layers (attn1: 1,024 or 4,096 tokens, where
    the attention FLOPs are) or, scope "all", on the cross-attention ones too (77 text tokens)."""
    from diffusers.models.attention_processor import Attention

    layers = [m for n, m in unet.named_modules()
              if isinstance(m, Attention) and (scope == "all" or n.endswith(".attn1"))]
    for m in layers:
        m.set_processor(Fp8FlexAttention(upcast))
    return len(layers)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def dynamic_inputs(inp):
    """Copies of the inputs whose row and token counts are dynamic, as in the AOTInductor
    packages sdxl-batch loads (export_sdxl.py --aoti: rows 1..16, tokens 77..308, latent fixed)."""
    lat, t, ctx = (x.clone() for x in inp[:3])
    added = {k: v.clone() for k, v in inp[3].items()}
    for x in (lat, t, ctx, *added.values()):  # maybe_: a guard narrowing the range is no error
        torch._dynamo.maybe_mark_dynamic(x, 0)
    torch._dynamo.maybe_mark_dynamic(ctx, 1)
    return lat, t, ctx, added


def measure(variant: str, unet, inp, iters: int, rows: int, settings) -> tuple[dict, torch.Tensor]:
    """Compile (timed first call), median step time, kernel profile, and the step's output.
    A "-dynamic" variant compiles for the packages' dynamic rows and tokens, the others for
    the inputs' own shapes; "-h2" compiles on the export's example shapes first."""
    torch._dynamo.reset()
    torch.cuda.reset_peak_memory_stats()
    compiled = torch.compile(unet)
    lat, t, ctx, added = dynamic_inputs(inp) if "-dynamic" in variant else inp

    def step(args=None):
        la, ta, ca, ad = args or (lat, t, ctx, added)
        with torch.no_grad():
            return compiled(la, ta, ca, added_cond_kwargs=ad).sample

    extra = {}
    t0 = time.time()
    with settings:  # Inductor reads its settings while compiling, on the first call
        out = step(dynamic_inputs(inputs(2, tokens=154)) if variant.endswith("-h2") else None)
        torch.cuda.synchronize()
        if variant.endswith("-h2"):  # the same graph at --rows: no new compile expected
            t1 = time.time()
            out = step()
            torch.cuda.synchronize()
            extra["first_call_at_rows_s"] = round(time.time() - t1, 2)
    compile_s = time.time() - t0
    ms = sorted(timed(step, iters))
    med = ms[len(ms) // 2]
    tflops = TFLOP_PER_PAIR * (rows / 2) / (med / 1000.0)
    r = {"compile_s": round(compile_s, 1), "step_ms_median": round(med, 2), "step_ms_min": round(ms[0], 2),
         "ms_per_image_step": round(med / (rows / 2), 2), "tflops_fp16_equivalent": round(tflops, 1),
         "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2), **extra}
    print(f"{variant}: compile {compile_s:.1f} s, step {med:.2f} ms (rows {rows}), "
          f"{med / (rows / 2):.2f} ms per image-step, {tflops:.0f} TFLOP/s", flush=True)
    r.update(profile_kernels(step))
    classes = ", ".join(f"{c} {v['ms_per_step']}" for c, v in r["by_class"].items())
    print(f"{variant}: kernels {r['kernel_ms_per_step']} ms per step ({r['kernel_calls_per_step']} launches): {classes}",
          flush=True)
    return r, out.float().clone()


def cpu_check(scope: str) -> dict:
    """Fp8FlexAttention's scale arithmetic off the GPU (upcast=True): relative L2 against diffusers'
    own attention for one self- and one cross-attention layer and for the tiny UNet (seeded), its
    attention layers chosen by --fp8-attn-scope."""
    from diffusers import UNet2DConditionModel
    from diffusers.models.attention_processor import Attention

    torch.manual_seed(0)
    res = {}
    with torch.no_grad():
        for name, cross in (("self_attention", None), ("cross_attention", 64)):
            layer = Attention(query_dim=128, cross_attention_dim=cross, heads=2, dim_head=64).eval()
            x, ctx = torch.randn(2, 256, 128), (torch.randn(2, 77, cross) if cross else None)
            ref = layer(x, ctx)
            layer.set_processor(Fp8FlexAttention(upcast=True))
            res[name] = round(rel_l2(layer(x, ctx), ref), 5)
        unet = UNet2DConditionModel(**architecture("tiny")["unet"]).eval()
        c = unet.config
        args = (torch.randn(2, 4, 32, 32), torch.full((2,), 500.0), torch.randn(2, 77, c.cross_attention_dim))
        added = {"text_embeds": torch.randn(2, c.projection_class_embeddings_input_dim - 6 * c.addition_time_embed_dim),
                 "time_ids": torch.tensor([[256.0, 256, 0, 0, 256, 256]] * 2)}
        ref = unet(*args, added_cond_kwargs=added).sample
        use_fp8_attention(unet, upcast=True, scope=scope)
        res["tiny_unet"] = round(rel_l2(unet(*args, added_cond_kwargs=added).sample, ref), 5)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=8, help="UNet rows per call (CFG: 2 per image)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--variants", default="fp16,fp8,fp8-tuned", help="comma-separated, of " + ",".join(VARIANTS))
    ap.add_argument("--tuned", action="append", default=[], metavar="KEY=VALUE",
                    help="Inductor setting of the fp8-tuned variant (Python literal value)")
    ap.add_argument("--fp8-attn-scope", choices=("self", "all"), default="self",
                    help="fp8-attn on self-attention only (default) or on cross-attention too")
    ap.add_argument("--cpu-check", action="store_true",
                    help="only check fp8-attn's scale arithmetic on the CPU (no GPU, no compile)")
    a = ap.parse_args()
    if a.cpu_check:
        print(json.dumps({"fp8_attention_cpu_check_rel_l2": cpu_check(a.fp8_attn_scope)}))
        return 0
    tuned = {k: ast.literal_eval(v) for k, v in (kv.split("=", 1) for kv in a.tuned)}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"rows": a.rows, "iters": a.iters, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
           "tuned": a.tuned, "variants": {}}

    def save():
        (out / "fp8-compile-probe.json").write_text(json.dumps(res, indent=1))

    t0 = time.time()
    unet = build_unet()
    inp = inputs(a.rows)
    res["build_s"] = round(time.time() - t0, 1)
    outputs = {}
    for variant in VARIANTS:  # in this order: fp8-tuned and fp8-attn change the UNet further
        if variant not in a.variants.split(",") or (variant == "fp8-tuned" and not tuned):
            continue
        if variant.startswith("fp8") and "fp8_layers" not in res:
            with torch.no_grad():
                res["fp8_layers"] = fp8_quant.quantize_unet(unet, calibrate_one_pass(unet, inp))
        if variant == "fp8-attn":
            res["fp8_attention_layers"] = use_fp8_attention(unet, scope=a.fp8_attn_scope)
        settings = torch._inductor.config.patch(tuned) if variant == "fp8-tuned" else contextlib.nullcontext()
        try:
            res["variants"][variant], outputs[variant] = measure(variant, unet, inp, a.iters, a.rows, settings)
        except Exception as e:  # a variant Inductor cannot compile: say why, measure the others
            res["variants"][variant] = {"error": f"{type(e).__name__}: {str(e)[:2000]}"}
            print(f"{variant}: failed: {res['variants'][variant]['error'][:400]}", flush=True)
            save()
            continue
        for ref in ("fp16", "fp8"):
            if ref in outputs and ref != variant:
                res["variants"][variant][f"rel_l2_vs_{ref}"] = round(rel_l2(outputs[variant], outputs[ref]), 5)
        save()
    for variant, base in (("fp8", "fp16"), ("fp16", "fp16-dynamic"), ("fp8", "fp8-dynamic"),
                          ("fp8-dynamic", "fp8-dynamic-h2"), ("fp8", "fp8-dynamic-h2"), ("fp8-tuned", "fp8"),
                          ("fp8-attn", "fp8")):
        if "step_ms_median" in res["variants"].get(variant, {}) and "step_ms_median" in res["variants"].get(base, {}):
            x = round(res["variants"][base]["step_ms_median"] / res["variants"][variant]["step_ms_median"], 3)
            res[f"speedup_{variant}_over_{base}"] = x
            print(f"{variant} / {base} step speed-up: {x}x", flush=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
