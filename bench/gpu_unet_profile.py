#!/usr/bin/env python3
"""Where the UNet's time goes on the GPU (issue 9), for an exported model:
    gpu_unet_profile.py MODEL_DIR [--json OUT.json]

1. cold cost of a new shape: the first three calls at 1024x1024 and then at
   832x1216 (CFG batch 2), each timed; the first call of each shape profiled
   on the CPU side (which aten ops spend the time: e.g. cuDNN plan building);
2. the warm step's kernels (torch.profiler, CUDA time by kernel and by class:
   attention, GEMM, convolution, normalisation, elementwise/other) and which
   scaled-dot-product-attention kernel runs;
3. warm ms per CFG step (the call captured as a CUDA graph and replayed) for the SDPA backends torch offers (flash, cuDNN,
   memory-efficient, math: each alone), for channels-last weights and
   activations, and for bf16 instead of fp16 -- all on the same traced module,
   which dispatches aten ops at run time.
The module is loaded as sdxl-batch loads it (on the CPU, then moved), with
TorchScript's optimising executor off, as in the C++ program."""
import argparse
import collections
import json
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--json", default="")
ap.add_argument("--reps", type=int, default=10)
args = ap.parse_args()
torch._C._set_graph_executor_optimize(False)
cfg = json.load(open(f"{args.model}/model.json"))
unet = torch.jit.load(f"{args.model}/unet.ts", map_location="cpu")
unet.to("cuda")
torch.cuda.synchronize()
out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}


def inputs(h, w, dtype=torch.float16, channels_last=False):
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(2, 4, h // 8, w // 8, generator=g).to("cuda", dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return (x, torch.full((2,), 500.0, device="cuda"),
            torch.randn(2, 77, cfg["unet"]["context_dim"], generator=g).to("cuda", dtype),
            torch.randn(2, cfg["unet"]["pooled_dim"], generator=g).to("cuda", dtype),
            torch.tensor([[h, w, 0, 0, h, w]] * 2, device="cuda", dtype=dtype))


def timed(fn, reps):
    """ms per call of fn, replayed as a CUDA graph as sdxl-batch does (plain
    calls from Python are bound by the interpreter's CPU time, not the GPU)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1000


def classify(name):
    n = name.lower()
    if any(k in n for k in ("flash", "fmha", "attention", "sdpa", "cudnn_generated_fort_native_sdpa", "mha")):
        return "attention"
    if any(k in n for k in ("conv", "implicit_gemm", "cudnn", "xmma_fprop", "dgrad", "fprop")):
        return "convolution"
    if any(k in n for k in ("gemm", "cutlass", "sm90_xmma", "cublas", "matmul", "nvjet")):
        return "gemm"
    if any(k in n for k in ("norm", "welford")):
        return "normalisation"
    return "elementwise/other"


with torch.inference_mode():
    # 1. cold cost per shape
    cold = []
    for (h, w) in ((1024, 1024), (1216, 832)):
        xs = inputs(h, w)
        for k in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if k == 0:
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                    unet(*xs)
                    torch.cuda.synchronize()
            else:
                unet(*xs)
                torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1000
            row = {"shape": f"{w}x{h}", "call": k + 1, "ms": round(ms, 1)}
            # (the first call's time includes the profiler's own cost)
            if k == 0:
                ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:8]
                row["top_cpu_ops"] = [(e.key, e.count, round(e.self_cpu_time_total / 1000, 1)) for e in ops]
            cold.append(row)
            print(f"cold {w}x{h} call {k + 1}: {ms:.1f} ms" + (f"  top CPU ops (name, calls, self ms): {row['top_cpu_ops']}" if k == 0 else ""), flush=True)
    out["cold"] = cold

    # 2. the warm step's kernels
    xs = inputs(1024, 1024)
    unet(*xs)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            unet(*xs)
        torch.cuda.synchronize()
    kernels = collections.Counter()
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA or getattr(e, "self_device_time_total", 0) > 0:
            kernels[e.key] += getattr(e, "self_device_time_total", 0) / 3 / 1000
    total = sum(kernels.values())
    by_class = collections.Counter()
    for k, v in kernels.items():
        by_class[classify(k)] += v
    out["warm_kernels_ms_per_step"] = round(total, 2)
    out["by_class_ms"] = {k: round(v, 2) for k, v in by_class.most_common()}
    out["top_kernels_ms"] = [(k[:120], round(v, 3)) for k, v in kernels.most_common(15)]
    print(f"warm step, GPU kernel time {total:.1f} ms; by class: {out['by_class_ms']}")
    for k, v in out["top_kernels_ms"]:
        print(f"  {v:7.3f} ms  {k}")

    # 3. variants, same module
    b = torch.backends.cuda
    backends = {"flash": b.enable_flash_sdp, "cudnn": b.enable_cudnn_sdp, "efficient": b.enable_mem_efficient_sdp,
                "math": b.enable_math_sdp}
    state = {"flash": b.flash_sdp_enabled(), "cudnn": b.cudnn_sdp_enabled(), "efficient": b.mem_efficient_sdp_enabled(),
             "math": b.math_sdp_enabled()}
    variants = {"default (" + ",".join(k for k, v in state.items() if v) + ")": timed(lambda: unet(*xs), args.reps)}
    for only in backends:
        for k, f in backends.items():
            f(k == only)
        try:
            variants[f"sdpa {only} only"] = timed(lambda: unet(*xs), args.reps)
        except Exception as e:  # a backend that cannot run these shapes
            variants[f"sdpa {only} only"] = f"failed: {str(e)[:120]}"
    for k, f in backends.items():
        f(state[k])
    try:
        for p in unet.parameters():
            if p.dim() == 4:
                p.data = p.data.contiguous(memory_format=torch.channels_last)
        xcl = inputs(1024, 1024, channels_last=True)
        variants["channels-last weights and latents"] = timed(lambda: unet(*xcl), args.reps)
        for p in unet.parameters():
            if p.dim() == 4:
                p.data = p.data.contiguous()
    except Exception as e:
        variants["channels-last weights and latents"] = f"failed: {str(e)[:120]}"
    try:
        unet.to(torch.bfloat16)
        xb = inputs(1024, 1024, dtype=torch.bfloat16)
        variants["bf16 weights and activations"] = timed(lambda: unet(*xb), args.reps)
    except Exception as e:
        variants["bf16 weights and activations"] = f"failed: {str(e)[:120]}"
    out["variants_ms_per_cfg_step"] = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in variants.items()}
    for k, v in out["variants_ms_per_cfg_step"].items():
        print(f"  {k}: {v}{' ms per CFG step (1024x1024, batch 2, CUDA graph replay)' if isinstance(v, float) else ''}")
if args.json:
    json.dump(out, open(args.json, "w"), indent=1)
