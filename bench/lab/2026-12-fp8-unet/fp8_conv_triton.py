#!/usr/bin/env python3
"""Probe (GPU machine): an FP8 3x3 convolution of our own in Triton (issue 44, item 1) against the fp16
cuDNN convolutions the compiled FP8 UNet step runs now (~35 ms of a 16-row step), with the GroupNorm +
SiLU that would feed it writing e4m3 directly.

Kernels (also imported by fp8_conv_triton_check_cpu.py beside it, which runs them on the CPU; the
convolution's kernels live in the product, scripts/export/fp8_conv.py, and are imported from there):
conv3x3_fp8   a 3x3 convolution (padding 1, stride 1 or 2) as an implicit GEMM: X NHWC e4m3 with a
              per-tensor scale, W [Cout, 3, 3, Cin] e4m3 with a per-output-channel (or per-tensor)
              scale, fp32 accumulation (wgmma), fp16 NHWC output with the descale, bias and an
              optional residual (fp16 NHWC) fused in the epilogue. GEMM view: M = N*Ho*Wo output
              pixels, N = Cout, K = 9*Cin ordered (tap, cin), so one K step of BLOCK_K channels lies in
              one tap and one NHWC row of X (BLOCK_K divides Cin). Variants (--impls):
                ptr    A (the shifted input rows, zero outside the image) and B by masked pointer loads,
                       pipelined by Triton (cp.async) into wgmma;
                tma_w  A as in ptr; B (the weights, K-major [Cout, 9*Cin]) through a TMA descriptor;
                tma    stride 1 only: A through a 4-D TMA descriptor on [N, H, W, Cin] whose box is a
                       BH x BW patch of output pixels shifted by the tap (the copy engine writes zeros
                       for the padding), B as in tma_w;
                tma_ws tma with tl.range(warp_specialize=True) (Triton 3.6 emits the same code on sm_90).
              Autotuned per shape over HOPPER_TILES (128-256 x 64-256 tiles, 3-5 stages, 4-8 warps).
groupnorm_silu_fp8   GroupNorm (32 groups) + SiLU on fp16 NHWC, written as e4m3 with a static per-tensor
              scale (or fp16): per-channel sums (atomics), per-group mean / rstd, one normalising pass.

The probe, for SDXL's 3x3 convolutions at --rows rows (CONV_CASES: every shape of a UNet step with its
count per step): error against fp32 (cuDNN without TF32) of cuDNN fp16 and of each FP8 variant (output
poisoned first), the median of --iters calls (CUDA events, fp8_compile_probe.timed) after warm-up and
autotuning, TFLOP/s; the resnets' conv2 shapes again with the residual fused (against cuDNN + add); the
GroupNorm + SiLU at each convolution's input: Triton to e4m3 / fp16, Inductor (torch.compile, static
shapes: the package's are static but for rows and tokens) to fp16 (what runs now) and to e4m3, eager;
a static quantise (Inductor) for the samplers' inputs; and the ms per UNet step saved. Inputs are
random (x ~ N(0,1), W ~ N(0, 1/(9 Cin))), per-tensor scale of X from its amax
(fp8_compile_probe.quantize_amax), weights per output channel (fp8_quant.quantize_tensor).
cuDNN fp16 is timed with its bias (a separate kernel in torch) and without (the compiled step fuses
the bias into the next GroupNorm): the saving counts against the latter. Errors also against a
float64 reference of the first two rows (the fp32 cuDNN reference is checked against it).
Results: --out/fp8-conv-triton.json (rewritten after each case) and fp8-conv-triton.md.

    python3 bench/lab/2026-12-fp8-unet/fp8_conv_triton.py --out DIR [--rows 16] [--iters 30] [--impls ptr,tma_w,tma]
        [--cases main|all] [--no-gn] [--no-inductor] [--workers 16] [--deadline-s 370]
    python3 bench/lab/2026-12-fp8-unet/fp8_conv_triton.py --derive-counts   # CPU: the per-step counts from the architecture
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fp8_compile_probe import fp8_quant, quantize_amax, rel_l2, timed  # noqa: E402

E4M3_MAX = 448.0


sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
# The kernels live in the product (the FP8 UNet's convolutions, export_sdxl.py --fp8-conv).
from export.fp8_conv import _conv3x3_fp8_ptr, _conv3x3_fp8_tma, _conv3x3_fp8_tma_w  # noqa: E402


KERNELS = {"ptr": _conv3x3_fp8_ptr, "tma_w": _conv3x3_fp8_tma_w, "tma": _conv3x3_fp8_tma, "tma_ws": _conv3x3_fp8_tma}
IMPLS = tuple(KERNELS)
# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps): large tiles, 3-5 stages, mostly 8 warps; pruned per shape
HOPPER_TILES = ((128, 128, 128, 4, 8), (128, 256, 128, 3, 8), (128, 256, 64, 4, 8), (256, 128, 128, 3, 8),
                (256, 128, 64, 4, 8), (128, 128, 64, 5, 4), (128, 64, 64, 5, 4), (128, 128, 128, 3, 4))
TUNE_KEY = ["H", "W", "HO", "C_IN", "C_OUT", "STRIDE", "HAS_RES", "PER_CHANNEL"]


def tma_bw(w: int) -> int:
    """The patch width of the tma kernel's M tiles: the image width up to 64 (it divides W)."""
    return min(w, 64)


def hopper_configs(impl: str, bw: int | None = None) -> list:
    out = []
    for m, n, k, stages, warps in HOPPER_TILES:
        kw = {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}
        if impl in ("tma", "tma_ws"):
            if bw is None or m % bw:
                continue
            kw.update(BW=bw, WS=impl == "tma_ws")
        out.append(triton.Config(kw, num_stages=stages, num_warps=warps))
    return out


def _prune(configs, named_args, **kwargs):
    """BLOCK_K must divide Cin (one K step = one tap); no 256-wide N tiles for 320 output channels."""
    c_in, c_out = named_args["C_IN"], named_args["C_OUT"]
    keep = [c for c in configs if c_in % c.kwargs["BLOCK_K"] == 0 and not (c.kwargs["BLOCK_N"] >= 256 and c_out <= 320)]
    return keep or configs[:1]


_TUNED: dict = {}


def _tuned(impl: str, bw: int | None):
    key = (impl, bw)
    if key not in _TUNED:
        _TUNED[key] = triton.autotune(configs=hopper_configs(impl, bw), key=TUNE_KEY,
                                      prune_configs_by={"early_config_prune": _prune})(KERNELS[impl])
    return _TUNED[key]


def best_config(impl: str, w: int | None = None) -> str | None:
    """The configuration the autotuner chose at its last call for impl (tma: for image width w)."""
    k = _TUNED.get((impl, tma_bw(w) if impl.startswith("tma") and impl != "tma_w" and w else None))
    cfg = None if k is None else k.best_config
    return None if cfg is None else str(cfg)


_ALLOCATOR_SET = False


def _ensure_allocator(device):
    """Device-side tensor descriptors need a scratch allocator."""
    global _ALLOCATOR_SET
    if not _ALLOCATOR_SET:
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=device))
        _ALLOCATOR_SET = True


def conv3x3_fp8(x8: torch.Tensor, x_scale: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor,
                bias: torch.Tensor | None = None, residual: torch.Tensor | None = None, stride: int = 1,
                impl: str = "ptr", config: dict | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """x8 [N, H, W, Cin] e4m3 (contiguous NHWC), x_scale fp32 [1] (x ~ x8 * x_scale); w8 [Cout, 3, 3, Cin]
    e4m3, w_scale fp32 [Cout] or [1]; bias fp16 [Cout]; residual fp16 [N, Ho, Wo, Cout]. Returns fp16
    [N, Ho, Wo, Cout]. config: {"BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages"[, "GROUP_M"]}
    (for tma/tma_ws also "BW", which divides W and BLOCK_M) instead of autotuning."""
    n, h, w, c_in = x8.shape
    c_out = w8.shape[0]
    assert impl in KERNELS, impl
    assert w8.shape == (c_out, 3, 3, c_in) and x8.is_contiguous() and w8.is_contiguous()
    assert c_in % 16 == 0 and stride in (1, 2)
    tma_x = impl in ("tma", "tma_ws")
    assert not tma_x or stride == 1, "the tma kernels take stride 1 only"
    ho, wo = (h - 1) // stride + 1, (w - 1) // stride + 1
    if out is None:
        out = torch.empty(n, ho, wo, c_out, device=x8.device, dtype=torch.float16)
    if residual is not None:
        assert residual.shape == out.shape and residual.is_contiguous()
    per_channel = w_scale.numel() == c_out and c_out > 1
    args = (x8, w8, out, bias if bias is not None else out, w_scale, x_scale,
            residual if residual is not None else out, n, h, w, ho, wo, c_in, c_out)
    flags = dict(STRIDE=stride, HAS_BIAS=bias is not None, HAS_RES=residual is not None, PER_CHANNEL=per_channel)
    if impl != "ptr":
        _ensure_allocator(x8.device)
    m = n * ho * wo

    def grid(meta):
        if tma_x:
            return (n * triton.cdiv(h, meta["BLOCK_M"] // meta["BW"]) * (w // meta["BW"])
                    * triton.cdiv(c_out, meta["BLOCK_N"]),)
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(c_out, meta["BLOCK_N"]),)

    if config is not None:
        cfg = dict(config)
        nw, ns = cfg.pop("num_warps", 4), cfg.pop("num_stages", 2)
        cfg.setdefault("GROUP_M", 8)
        if tma_x:
            cfg.setdefault("WS", impl == "tma_ws")
        KERNELS[impl][grid(cfg)](*args, **flags, **cfg, num_warps=nw, num_stages=ns)
    else:
        _tuned(impl, tma_bw(w) if tma_x else None)[grid](*args, **flags)
    return out


def precompile_job(job: tuple) -> str:
    """Compile one (impl, config, stride, has_res) without running it (a worker of a process pool
    fills Triton's cache; every SDXL shape has the same integer specialisation, all multiples of 16)."""
    impl, kw, warps, stages, stride, has_res, rows = job
    try:
        KERNELS[impl].warmup(torch.float8_e4m3fn, torch.float8_e4m3fn, torch.float16, torch.float16, torch.float32,
                             torch.float32, torch.float16, rows, 64, 64, 64 // stride, 64 // stride, 64, 64,
                             grid=(1,), STRIDE=stride, HAS_BIAS=True, HAS_RES=has_res, PER_CHANNEL=True,
                             **kw, num_warps=warps, num_stages=stages)
        return "ok"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e)[:300]}"


# ------------------------------------------------------------------------------ group norm + SiLU + e4m3


@triton.jit
def _gn_sums(x_ptr, sums_ptr, HW, C, ROWS_PER_PROG,
             BLOCK_HW: tl.constexpr, BLOCK_C: tl.constexpr):
    """Program (n, split): per-channel sum and sum of squares of ROWS_PER_PROG rows, atomically added."""
    n = tl.program_id(0)
    split = tl.program_id(1)
    offs_c = tl.arange(0, BLOCK_C)
    c_ok = offs_c < C
    s1 = tl.zeros([BLOCK_C], dtype=tl.float32)
    s2 = tl.zeros([BLOCK_C], dtype=tl.float32)
    r0 = split * ROWS_PER_PROG
    base = x_ptr + n.to(tl.int64) * HW * C
    for r in range(r0, tl.minimum(r0 + ROWS_PER_PROG, HW), BLOCK_HW):
        rows = r + tl.arange(0, BLOCK_HW)
        ok = (rows < tl.minimum(r0 + ROWS_PER_PROG, HW))[:, None] & c_ok[None, :]
        v = tl.load(base + rows[:, None] * C + offs_c[None, :], mask=ok, other=0.0).to(tl.float32)
        s1 += tl.sum(v, axis=0)
        s2 += tl.sum(v * v, axis=0)
    tl.atomic_add(sums_ptr + n * 2 * C + offs_c, s1, mask=c_ok)
    tl.atomic_add(sums_ptr + n * 2 * C + C + offs_c, s2, mask=c_ok)


@triton.jit
def _gn_stats(sums_ptr, stats_ptr, HW, C, CG, eps, G: tl.constexpr, BLOCK_CG: tl.constexpr):
    """Program n: mean and rstd of each of the G groups from the per-channel sums."""
    n = tl.program_id(0)
    g = tl.arange(0, G)
    j = tl.arange(0, BLOCK_CG)
    idx = g[:, None] * CG + j[None, :]
    ok = (j < CG)[None, :] & (g < G)[:, None]
    s1 = tl.sum(tl.load(sums_ptr + n * 2 * C + idx, mask=ok, other=0.0), axis=1)
    s2 = tl.sum(tl.load(sums_ptr + n * 2 * C + C + idx, mask=ok, other=0.0), axis=1)
    cnt = (HW * CG).to(tl.float32)
    mean = s1 / cnt
    var = tl.maximum(s2 / cnt - mean * mean, 0.0)
    tl.store(stats_ptr + n * 2 * G + g, mean)
    tl.store(stats_ptr + n * 2 * G + G + g, 1.0 / tl.sqrt(var + eps))


@triton.jit
def _gn_apply(x_ptr, y_ptr, stats_ptr, gamma_ptr, beta_ptr, inv_scale_ptr, HW, C, CG,
              G: tl.constexpr, OUT_FP8: tl.constexpr, SILU: tl.constexpr,
              BLOCK_HW: tl.constexpr, BLOCK_C: tl.constexpr):
    """Program (n, row block): y = silu((x - mean) * rstd * gamma + beta) [* 1/scale, e4m3]."""
    n = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_HW + tl.arange(0, BLOCK_HW)
    offs_c = tl.arange(0, BLOCK_C)
    c_ok = offs_c < C
    grp = offs_c // CG
    mean = tl.load(stats_ptr + n * 2 * G + grp, mask=c_ok, other=0.0)
    rstd = tl.load(stats_ptr + n * 2 * G + G + grp, mask=c_ok, other=0.0)
    a = rstd * tl.load(gamma_ptr + offs_c, mask=c_ok, other=0.0).to(tl.float32)
    b = tl.load(beta_ptr + offs_c, mask=c_ok, other=0.0).to(tl.float32) - mean * a
    ok = (rows < HW)[:, None] & c_ok[None, :]
    off = n.to(tl.int64) * HW * C + rows[:, None] * C + offs_c[None, :]
    v = tl.load(x_ptr + off, mask=ok, other=0.0).to(tl.float32) * a[None, :] + b[None, :]
    if SILU:
        v = v * tl.sigmoid(v)
    if OUT_FP8:
        v = tl.clamp(v * tl.load(inv_scale_ptr), -448.0, 448.0)
        tl.store(y_ptr + off, v.to(tl.float8e4nv), mask=ok)
    else:
        tl.store(y_ptr + off, v.to(tl.float16), mask=ok)


def groupnorm_silu_fp8(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, scale: torch.Tensor | None,
                       groups: int = 32, eps: float = 1e-5, silu: bool = True, splits: int | None = None,
                       block_hw: int | None = None) -> torch.Tensor:
    """x [N, H, W, C] fp16 contiguous (NHWC); scale fp32 [1] (y8 * scale ~ y), None: fp16 output.
    Returns [N, H, W, C] e4m3 (or fp16)."""
    n, h, w, c = x.shape
    hw = h * w
    assert c % groups == 0 and x.is_contiguous()
    cg = c // groups
    block_c = triton.next_power_of_2(c)
    sums = torch.zeros(n, 2, c, device=x.device, dtype=torch.float32)
    stats = torch.empty(n, 2, groups, device=x.device, dtype=torch.float32)
    bh = block_hw or max(1, min(64, 8192 // block_c))
    if splits is None:  # about 4 programs per SM on an H200 (132 SMs)
        splits = max(1, min(triton.cdiv(hw, bh), triton.cdiv(4 * 132, n)))
    rows_per = triton.cdiv(triton.cdiv(hw, splits), bh) * bh
    nw = 8 if block_c * bh >= 8192 else 4
    _gn_sums[(n, triton.cdiv(hw, rows_per))](x, sums, hw, c, rows_per, BLOCK_HW=bh, BLOCK_C=block_c, num_warps=nw)
    _gn_stats[(n,)](sums, stats, hw, c, cg, eps, G=groups, BLOCK_CG=triton.next_power_of_2(cg))
    fp8 = scale is not None
    y = torch.empty(x.shape, device=x.device, dtype=torch.float8_e4m3fn if fp8 else torch.float16)
    inv = (1.0 / scale).float() if fp8 else stats
    _gn_apply[(n, triton.cdiv(hw, bh))](x, y, stats, gamma, beta, inv, hw, c, cg, G=groups, OUT_FP8=fp8, SILU=silu,
                                        BLOCK_HW=bh, BLOCK_C=block_c, num_warps=nw)
    return y


# ============================================================================================ the probe
# (GPU machine) correctness against fp32 and speed against cuDNN fp16 at SDXL's 3x3 shapes, and the
# GroupNorm + SiLU + quantise that would feed the FP8 convolutions; ms per UNet step saved.

# SDXL's 3x3 convolutions in one UNet step (diffusers UNet2DConditionModel with the full architecture,
# `--derive-counts` re-derives this from export_sdxl.architecture("full") on the meta device; conv_in
# 4->320 and conv_out 320->4 stay fp16 as in TensorRT's recipe, and the 1x1 shortcuts are GEMMs):
# (name, Cin, Cout, input height = width, stride, convolutions per step, GroupNorm+SiLU before it, which)
CONV_CASES = (
    ("320->320 @128", 320, 320, 128, 1, 7, True, "down 0 resnets conv1 x2, conv2 x2; up 2 conv2 x3"),
    ("640->640 @64", 640, 640, 64, 1, 6, True, "down 1 resnet 1 conv1; down 1 conv2 x2; up 1 conv2 x3"),
    ("1280->1280 @32", 1280, 1280, 32, 1, 10, True, "down 2 resnet 1 conv1, conv2 x2; mid x4; up 0 conv2 x3"),
    ("320->640 @64", 320, 640, 64, 1, 1, True, "down 1 resnet 0 conv1"),
    ("640->1280 @32", 640, 1280, 32, 1, 1, True, "down 2 resnet 0 conv1"),
    ("320->320 @128 s2", 320, 320, 128, 2, 1, False, "down 0 downsampler (stride 2)"),
    ("640->640 @64 s2", 640, 640, 64, 2, 1, False, "down 1 downsampler (stride 2)"),
    ("2560->1280 @32", 2560, 1280, 32, 1, 2, True, "up 0 resnets 0, 1 conv1 (skip concatenated)"),
    ("1920->1280 @32", 1920, 1280, 32, 1, 1, True, "up 0 resnet 2 conv1"),
    ("1280->1280 @64", 1280, 1280, 64, 1, 1, False, "up 0 upsampler (after nearest 2x)"),
    ("1920->640 @64", 1920, 640, 64, 1, 1, True, "up 1 resnet 0 conv1"),
    ("1280->640 @64", 1280, 640, 64, 1, 1, True, "up 1 resnet 1 conv1"),
    ("960->640 @64", 960, 640, 64, 1, 1, True, "up 1 resnet 2 conv1"),
    ("640->640 @128", 640, 640, 128, 1, 1, False, "up 1 upsampler (after nearest 2x)"),
    ("960->320 @128", 960, 320, 128, 1, 1, True, "up 2 resnet 0 conv1"),
    ("640->320 @128", 640, 320, 128, 1, 2, True, "up 2 resnets 1, 2 conv1"),
)
RESIDUAL_CASES = ("320->320 @128", "640->640 @64", "1280->1280 @32")  # the resnets' conv2 + shortcut add
MAIN_CASES = 5  # the first five: the brief's shapes


def derive_counts() -> dict:
    """CPU: the UNet on the meta device, a forward hook on every Conv2d -> {(Cin, Cout, k, stride, H): calls}."""
    import collections

    from diffusers import UNet2DConditionModel
    from export.architecture import architecture  # scripts/ is on sys.path (above)

    with torch.device("meta"):
        unet = UNet2DConditionModel(**architecture("full")["unet"])
    seen = collections.Counter()

    def hook(m, inp, out):
        seen[(m.in_channels, m.out_channels, m.kernel_size[0], m.stride[0], inp[0].shape[-1])] += 1

    for m in unet.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(hook)
    rows = 2
    unet(torch.randn(rows, 4, 128, 128, device="meta"), torch.full((rows,), 500.0, device="meta"),
         torch.randn(rows, 77, 2048, device="meta"),
         added_cond_kwargs={"text_embeds": torch.randn(rows, 1280, device="meta"),
                            "time_ids": torch.randn(rows, 6, device="meta")})
    return dict(seen)


def check_counts() -> int:
    seen = derive_counts()
    three = {k: v for k, v in seen.items() if k[2] == 3 and 4 not in k[:2]}
    table = {(ci, co, 3, s, hw): n for _, ci, co, hw, s, n, _, _ in CONV_CASES}
    ok = three == table
    print(json.dumps({"derived_3x3": {str(k): v for k, v in sorted(three.items())}, "matches_CONV_CASES": ok,
                      "all_convs": sum(seen.values()), "3x3_quantised": sum(three.values())}, indent=1))
    return 0 if ok else 1


# ----------------------------------------------------------------------------------------------- helpers


DEVICE = "cuda"
SMOKE: dict | None = None  # --smoke-cpu: tiny shapes on the CPU under TRITON_INTERPRET=1, fixed configs


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def median_of(fn, iters: int, warmup: int = 3) -> float:
    """fp8_compile_probe.timed (CUDA events around each call) after warm-up calls; the median, ms."""
    if SMOKE is not None:  # the CPU smoke run: the probe's plumbing, not a timing
        fn()
        return 1.0
    for _ in range(warmup):
        fn()
    sync()
    return round(statistics.median(timed(fn, iters)), 4)


def quantise_weight(w: torch.Tensor, per_channel: bool = True):
    """W [Cout, 3, 3, Cin] -> e4m3 with a per-output-channel (or per-tensor) scale amax/448, fp8_quant's rule."""
    if per_channel:
        s = w.abs().amax(dim=(1, 2, 3)).float().clamp(min=1e-12) / E4M3_MAX
        return fp8_quant.quantize_tensor(w, s.view(-1, 1, 1, 1)).contiguous(), s.contiguous()
    w8, s = quantize_amax(w)
    return w8.contiguous(), s.reshape(1)


def short(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[:600]}"


def reference_conv(x_nhwc, w_krsc, bias, stride: int):
    """fp32 convolution without TF32 (cuDNN), NHWC out."""
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=False, allow_tf32=False):
        ref = F.conv2d(x_nhwc.permute(0, 3, 1, 2).float(), w_krsc.permute(0, 3, 1, 2).float(), bias.float(),
                       padding=1, stride=stride)
    return ref.permute(0, 2, 3, 1)


def tflops(flops: float, ms: float | None):
    return None if not ms else round(flops / ms / 1e9, 1)


# ------------------------------------------------------------------------------------------------ cases


def conv_case(case, rows: int, impls: list[str], iters: int, seed: int, residual: bool) -> dict:
    name, cin, cout, hw, stride, count, _gn, where = case
    g = torch.Generator(DEVICE).manual_seed(seed)
    x = torch.randn(rows, hw, hw, cin, generator=g, device=DEVICE, dtype=torch.float16)
    w = (torch.randn(cout, 3, 3, cin, generator=g, device=DEVICE) / (9 * cin) ** 0.5).half()
    bias = (torch.randn(cout, generator=g, device=DEVICE) * 0.1).half()
    ho = (hw - 1) // stride + 1
    flops = 2.0 * rows * ho * ho * cout * cin * 9
    res = torch.randn(rows, ho, ho, cout, generator=g, device=DEVICE, dtype=torch.float16) if residual else None
    ref = reference_conv(x, w, bias, stride)
    if res is not None:
        ref = ref + res.float()
    r64 = min(rows, 2)  # a float64 reference (no cuDNN) of the first rows: a check on the fp32 one
    ref64 = F.conv2d(x[:r64].permute(0, 3, 1, 2).double(), w.permute(0, 3, 1, 2).double(), bias.double(),
                     padding=1, stride=stride).permute(0, 2, 3, 1)
    if res is not None:
        ref64 = ref64 + res[:r64].double()
    xc, wc = x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2)  # channels-last NCHW / KCRS views
    rc = res.permute(0, 3, 1, 2) if res is not None else None
    r = {"case": name, "cin": cin, "cout": cout, "h_in": hw, "h_out": ho, "stride": stride, "rows": rows,
         "per_step": count, "where": where, "residual": residual, "gflop": round(flops / 1e9, 1)}

    def fp16():
        y = F.conv2d(xc, wc, bias, padding=1, stride=stride)
        return y.add_(rc) if rc is not None else y

    def fp16_nobias():  # the bias is added by a kernel of its own after cuDNN's; the compiled step fuses it
        y = F.conv2d(xc, wc, None, padding=1, stride=stride)
        return y.add_(rc) if rc is not None else y

    y16 = None
    try:
        y = fp16()
        y16 = y.permute(0, 2, 3, 1)
        r["fp16_cudnn"] = {"rel_l2": round(rel_l2(y16, ref), 6),
                           "rel_l2_fp64_rows": round(rel_l2(y16[:r64].double(), ref64), 6),
                           "channels_last_out": y.is_contiguous(memory_format=torch.channels_last)}
        r["fp16_cudnn"]["ms"] = median_of(fp16, iters)
        r["fp16_cudnn"]["tflops"] = tflops(flops, r["fp16_cudnn"]["ms"])
        r["fp16_cudnn"]["ms_without_bias"] = median_of(fp16_nobias, iters)
    except Exception as e:  # noqa: BLE001
        r["fp16_cudnn"] = {"error": short(e)}
    r["ref_fp32_vs_fp64_rows"] = round(rel_l2(ref[:r64].double(), ref64), 6)
    x8, xs = quantize_amax(x)
    x8, xs = x8.contiguous(), xs.float().reshape(1)
    w8, ws = quantise_weight(w)
    out = torch.empty(rows, ho, ho, cout, device=DEVICE, dtype=torch.float16)
    for impl in impls:
        if impl in ("tma", "tma_ws") and stride != 1:
            continue
        d = {}
        try:
            def fp8(impl=impl):
                return conv3x3_fp8(x8, xs, w8, ws, bias, res, stride=stride, impl=impl, out=out,
                                   config=SMOKE and SMOKE[impl])

            t0 = time.time()
            fp8()  # autotunes on the first call
            sync()
            d["first_call_s"] = round(time.time() - t0, 2)
            out.fill_(float("nan"))  # poisoned: every element must be written
            fp8()
            sync()
            d["all_written_finite"] = bool(torch.isfinite(out).all())
            d["rel_l2"] = round(rel_l2(out, ref), 6)
            d["rel_l2_fp64_rows"] = round(rel_l2(out[:r64].double(), ref64), 6)
            if y16 is not None:
                d["rel_l2_vs_fp16"] = round(rel_l2(out, y16), 6)
            d["ms"] = median_of(fp8, iters)
            d["tflops"] = tflops(flops, d["ms"])
            d["config"] = best_config(impl, hw)
        except Exception as e:  # noqa: BLE001
            d["error"] = short(e)
        r[f"fp8_{impl}"] = d
    fast = [(v["ms"], k) for k, v in r.items() if k.startswith("fp8_") and isinstance(v, dict) and v.get("ms")
            and v.get("all_written_finite")]
    if fast and "ms" in r["fp16_cudnn"]:
        ms, best = min(fast)
        base = r["fp16_cudnn"]["ms_without_bias"]  # the fair baseline: the FP8 kernel's bias costs nothing
        r["best_fp8"] = best[4:]
        r["speedup"] = round(base / ms, 3)
        r["speedup_vs_with_bias"] = round(r["fp16_cudnn"]["ms"] / ms, 3)
        r["saving_ms_per_step"] = round(count * (base - ms), 3)
    return r


def per_tensor_check(rows: int, seed: int, c: int = 640, hw: int = 64) -> dict:
    """The per-tensor weight scale against per-channel at c->c @hw (one fixed configuration), on weights
    whose output channels span 0.2x..2x in range."""
    g = torch.Generator(DEVICE).manual_seed(seed)
    x = torch.randn(rows, hw, hw, c, generator=g, device=DEVICE, dtype=torch.float16)
    w = (torch.randn(c, 3, 3, c, generator=g, device=DEVICE) / (9 * c) ** 0.5
         * torch.linspace(0.2, 2.0, c, device=DEVICE).view(-1, 1, 1, 1)).half()
    bias = torch.zeros(c, device=DEVICE, dtype=torch.float16)
    ref = reference_conv(x, w, bias, 1)
    x8, xs = quantize_amax(x)
    cfg = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 8, "num_stages": 4}
    out = {}
    for mode, pc in (("per_channel", True), ("per_tensor", False)):
        w8, ws = quantise_weight(w, pc)
        y = conv3x3_fp8(x8.contiguous(), xs.float().reshape(1), w8, ws, bias, config=SMOKE["ptr"] if SMOKE else cfg)
        out[mode] = round(rel_l2(y, ref), 6)
    return {"case": f"{c}->{c} @{hw}, weights whose output channels span 0.2x..2x in range", "rel_l2": out}


GN_GROUPS, GN_EPS = 32, 1e-5


def gn_silu_fp16(x, gamma, beta):
    return F.silu(F.group_norm(x, GN_GROUPS, gamma, beta, GN_EPS))


def gn_silu_e4m3(x, gamma, beta, inv_scale):
    return (F.silu(F.group_norm(x, GN_GROUPS, gamma, beta, GN_EPS)) * inv_scale).clamp(-E4M3_MAX, E4M3_MAX).to(
        torch.float8_e4m3fn)


def quantise_static(x, inv_scale):
    return (x * inv_scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


_COMPILED: dict = {}


def compiled(fn):
    if fn not in _COMPILED:
        # static shapes, as the package's convolutions and norms are (only rows and tokens are dynamic there)
        _COMPILED[fn] = torch.compile(fn, dynamic=False)
    return _COMPILED[fn]


def gn_case(c: int, hw: int, count: int, rows: int, iters: int, seed: int, inductor: bool) -> dict:
    """GroupNorm(32) + SiLU on fp16 NHWC [rows, hw, hw, c]: Triton fused to e4m3 and to fp16, Inductor's
    fp16 (what the step runs now) and e4m3, eager fp16; error against fp32."""
    g = torch.Generator(DEVICE).manual_seed(seed)
    x = (torch.randn(rows, hw, hw, c, generator=g, device=DEVICE) * 1.5
         + torch.randn(c, generator=g, device=DEVICE) * 0.5).half()
    gamma = (1 + 0.2 * torch.randn(c, generator=g, device=DEVICE)).half()
    beta = (0.2 * torch.randn(c, generator=g, device=DEVICE)).half()
    xc = x.permute(0, 3, 1, 2)  # channels-last view
    ref = gn_silu_fp16(xc.float(), gamma.float(), beta.float()).permute(0, 2, 3, 1)
    scale = (ref.abs().amax() / E4M3_MAX).reshape(1)  # the static calibrated scale
    inv = (1 / scale).float()
    nbytes_fp8, nbytes_fp16 = x.numel() * 3, x.numel() * 4  # read fp16 once + write e4m3 / fp16
    r = {"c": c, "h": hw, "rows": rows, "per_step": count, "mbytes_min_e4m3": round(nbytes_fp8 / 1e6, 1)}

    def run(key, fn, to_float, nbytes):
        try:
            y = fn()
            sync()
            d = {"rel_l2": round(rel_l2(to_float(y), ref), 6)}
            d["ms"] = median_of(fn, iters)
            d["gb_s_min_bytes"] = round(nbytes / d["ms"] / 1e6, 0)
        except Exception as e:  # noqa: BLE001
            d = {"error": short(e)}
        r[key] = d

    run("triton_e4m3", lambda: groupnorm_silu_fp8(x, gamma, beta, scale), lambda y: y.float() * scale, nbytes_fp8)
    run("triton_fp16", lambda: groupnorm_silu_fp8(x, gamma, beta, None), lambda y: y, nbytes_fp16)
    run("eager_fp16", lambda: gn_silu_fp16(xc, gamma, beta), lambda y: y.permute(0, 2, 3, 1), nbytes_fp16)
    if inductor:
        run("inductor_fp16", lambda: compiled(gn_silu_fp16)(xc, gamma, beta), lambda y: y.permute(0, 2, 3, 1),
            nbytes_fp16)
        run("inductor_e4m3", lambda: compiled(gn_silu_e4m3)(xc, gamma, beta, inv),
            lambda y: y.permute(0, 2, 3, 1).float() * scale, nbytes_fp8)
    base = r.get("inductor_fp16", {}).get("ms")
    new = [r[k]["ms"] for k in ("triton_e4m3", "inductor_e4m3") if r.get(k, {}).get("ms")]
    if base and new:
        r["saving_ms_per_step"] = round(count * (base - min(new)), 3)
    return r


def quantise_case(c: int, hw: int, count: int, rows: int, iters: int, seed: int) -> dict:
    """A plain static quantise (Inductor) of the fp16 input of an up/down-sampler convolution."""
    g = torch.Generator(DEVICE).manual_seed(seed)
    x = torch.randn(rows, hw, hw, c, generator=g, device=DEVICE, dtype=torch.float16).permute(0, 3, 1, 2)
    inv = torch.full((1,), 100.0, device=DEVICE)
    try:
        return {"c": c, "h": hw, "per_step": count, "ms": median_of(lambda: compiled(quantise_static)(x, inv), iters)}
    except Exception as e:  # noqa: BLE001
        return {"c": c, "h": hw, "per_step": count, "error": short(e)}


# ----------------------------------------------------------------------------------------------- driver


def precompile(impls: list[str], rows: int, workers: int) -> dict:
    """Fills Triton's cache with every configuration the autotuner will try, in parallel processes."""
    import concurrent.futures as cf
    import multiprocessing as mp

    jobs = []
    for impl in impls:
        for stride, has_res in ((1, False), (1, True), (2, False)):
            if impl in ("tma", "tma_ws") and stride == 2:
                continue
            for bw in ((32, 64) if impl in ("tma", "tma_ws") else (None,)):
                for c in hopper_configs(impl, bw):
                    jobs.append((impl, dict(c.kwargs), c.num_warps, c.num_stages, stride, has_res, rows))
    t0 = time.time()
    errors = {}
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        for job, msg in zip(jobs, pool.map(precompile_job, jobs)):
            if msg != "ok":
                errors[str(job)] = msg
    return {"jobs": len(jobs), "seconds": round(time.time() - t0, 1), "errors": errors}


def fmt(v, nd: int = 3) -> str:
    return "—" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def conv_table(cases: list[dict], impls: list[str]) -> list[str]:
    head = ["shape (16 rows)", "per step", "cuDNN fp16 ms (+ bias)"] + [f"FP8 {i} ms" for i in impls] + [
        "best × fp16", "TFLOP/s fp16 / best FP8", "rel. L2 fp16 / FP8 (fp64 ref.)", "ms saved per step"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in cases:
        if "fp16_cudnn" not in r:
            lines.append(f"| {r.get('case')} | {r.get('error', r.get('skipped', ''))[:100]} |")
            continue
        f16 = r["fp16_cudnn"]
        best = r.get(f"fp8_{r['best_fp8']}", {}) if "best_fp8" in r else {}
        cells = [r["case"] + (" + residual" if r["residual"] else ""), str(r["per_step"]),
                 f"{fmt(f16.get('ms_without_bias'))} ({fmt(f16.get('ms'))})"]
        for i in impls:
            d = r.get(f"fp8_{i}")
            cells.append("—" if d is None else ("error" if "error" in d else fmt(d.get("ms"))))
        fp8_err = best.get("rel_l2_fp64_rows")
        cells += [fmt(r.get("speedup"), 2) + (f" ({r['best_fp8']})" if "best_fp8" in r else ""),
                  f"{fmt(tflops(r['gflop'] * 1e9, f16.get('ms_without_bias')), 0)} / {fmt(best.get('tflops'), 0)}",
                  f"{fmt(f16.get('rel_l2_fp64_rows'), 4)} / {fmt(fp8_err, 4)}",
                  fmt(r.get("saving_ms_per_step"), 2) if not r["residual"] else "(see text)"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def gn_table(cases: list[dict]) -> list[str]:
    keys = ("inductor_fp16", "inductor_e4m3", "triton_e4m3", "triton_fp16", "eager_fp16")
    head = ["GroupNorm+SiLU input (16 rows)", "per step"] + [f"{k} ms" for k in keys] + [
        "rel. L2 triton_e4m3 / inductor_e4m3", "ms saved per step vs inductor_fp16"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in cases:
        cells = [f"{r['c']} ch @{r['h']}", str(r["per_step"])]
        cells += ["err" if "error" in r.get(k, {}) else fmt(r.get(k, {}).get("ms")) for k in keys]
        errs = [fmt(r.get(k, {}).get("rel_l2"), 4) for k in ("triton_e4m3", "inductor_e4m3")]
        cells += [" / ".join(errs),
                  fmt(r.get("saving_ms_per_step"), 3)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def estimate(res: dict) -> dict:
    convs = [r for r in res["conv"] if not r.get("residual") and "fp16_cudnn" in r]
    fp16_total = sum(r["per_step"] * r["fp16_cudnn"]["ms_without_bias"] for r in convs if "ms" in r["fp16_cudnn"])
    fp16_bias_total = sum(r["per_step"] * r["fp16_cudnn"]["ms"] for r in convs if "ms" in r["fp16_cudnn"])
    fp8_total = sum(r["per_step"] * r["fp16_cudnn"]["ms_without_bias"] / r["speedup"] for r in convs
                    if "speedup" in r)
    covered = sum(r["per_step"] for r in convs if "speedup" in r)
    conv_saving = sum(r["saving_ms_per_step"] for r in convs if "saving_ms_per_step" in r)
    gn_saving = sum(r["saving_ms_per_step"] for r in res["gn"] if "saving_ms_per_step" in r)
    q_cost = sum(r["per_step"] * r["ms"] for r in res["quantise"] if "ms" in r)
    return {"convs_per_step_measured": covered, "convs_per_step": sum(c[5] for c in CONV_CASES),
            "cudnn_fp16_ms_per_step": round(fp16_total, 2),
            "cudnn_fp16_with_bias_ms_per_step": round(fp16_bias_total, 2),
            "fp8_best_ms_per_step": round(fp8_total, 2),
            "conv_saving_ms": round(conv_saving, 2), "gn_saving_ms": round(gn_saving, 2),
            "sampler_quantise_cost_ms": round(q_cost, 2),
            "total_saving_ms": round(conv_saving + gn_saving - q_cost, 2)}


def write_out(res: dict, out: Path, impls: list[str]) -> None:
    res["estimate"] = estimate(res)
    (out / "fp8-conv-triton.json").write_text(json.dumps(res, indent=1))
    md = ["## 3x3 convolutions", *conv_table(res["conv"], impls), "", "## GroupNorm + SiLU (+ e4m3)",
          *gn_table(res["gn"]), "", "## sampler inputs: static quantise (Inductor)",
          *[f"- {q['c']} ch @{q['h']}: {q.get('ms', q.get('error'))} ms × {q['per_step']}" for q in res["quantise"]],
          "", "## per UNet step (16 rows)", "```", json.dumps(res["estimate"], indent=1), "```",
          "", f"per-tensor weight scale check: {json.dumps(res.get('per_tensor_check'))}"]
    (out / "fp8-conv-triton.md").write_text("\n".join(md) + "\n")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", help="result folder (fp8-conv-triton.json and .md); required on the GPU")
    ap.add_argument("--rows", type=int, default=16, help="batch rows (CFG: 2 per image), default 16")
    ap.add_argument("--iters", type=int, default=30, help="timed calls per measurement (median), default 30")
    ap.add_argument("--impls", default="ptr,tma_w,tma",
                    help=f"comma list of {', '.join(IMPLS)} (default ptr,tma_w,tma)")
    ap.add_argument("--cases", default="all", help="'main' (the first five shapes) or 'all' (default)")
    ap.add_argument("--no-gn", action="store_true", help="skip the GroupNorm + SiLU part")
    ap.add_argument("--no-inductor", action="store_true", help="no torch.compile baselines for the GroupNorm")
    ap.add_argument("--workers", type=int, default=16, help="processes that precompile the kernels (0: none)")
    ap.add_argument("--deadline-s", type=float, default=370, help="skip what is left after this many seconds")
    ap.add_argument("--smoke-cpu", action="store_true",
                    help="CPU, under TRITON_INTERPRET=1: the whole probe at tiny shapes, fixed configurations")
    ap.add_argument("--derive-counts", action="store_true",
                    help="CPU: re-derive the per-step 3x3 counts from the architecture (needs diffusers) and exit")
    a = ap.parse_args()
    a.impls = [i.strip() for i in a.impls.split(",") if i.strip()]
    if set(a.impls) - set(IMPLS) or not a.impls:
        ap.error(f"--impls takes {IMPLS}")
    if not a.derive_counts and not a.out:
        ap.error("--out is required")
    return a


def main() -> int:
    a = parse_args()
    if a.derive_counts:
        return check_counts()
    global DEVICE, SMOKE, CONV_CASES, RESIDUAL_CASES
    if a.smoke_cpu:
        DEVICE = "cpu"
        SMOKE = {i: {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "BW": 8} for i in IMPLS}
        CONV_CASES = (("smoke 32->48 @8", 32, 48, 8, 1, 2, True, "smoke"),
                      ("smoke 32->32 @8 s2", 32, 32, 8, 2, 1, False, "smoke"),
                      ("smoke 64->64 @8", 64, 64, 8, 1, 3, True, "smoke"))
        RESIDUAL_CASES = ("smoke 64->64 @8",)
        a.rows, a.workers, a.no_inductor = 2, 0, True
    elif not torch.cuda.is_available():
        print("fp8_conv_triton: no CUDA device here (TRITON_INTERPRET=1 runs the kernels on the CPU: see "
              "fp8_conv_triton_check_cpu.py beside this probe)", file=sys.stderr)
        return 2
    t_start = time.time()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch._dynamo.config.cache_size_limit = 64
    res = {"gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (smoke)",
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "triton": triton.__version__, "rows": a.rows, "iters": a.iters,
           "impls": a.impls, "argv": sys.argv[1:], "conv": [], "gn": [], "quantise": []}
    if a.workers:
        res["precompile"] = precompile(a.impls, a.rows, a.workers)
        print(f"precompile: {json.dumps(res['precompile'])[:1500]}", flush=True)
    cases = CONV_CASES[:MAIN_CASES] if a.cases == "main" else CONV_CASES
    jobs = [("conv", c, False) for c in cases[:MAIN_CASES]]
    jobs += [("conv", c, True) for c in cases if c[0] in RESIDUAL_CASES]
    jobs += [("pt", None, None)]
    gn_shapes = [(c[1], c[3], c[5]) for c in cases if c[6]]
    if not a.no_gn:
        jobs += [("gn", s, None) for s in gn_shapes[:MAIN_CASES]]
    jobs += [("conv", c, False) for c in cases[MAIN_CASES:]]
    if not a.no_gn:
        jobs += [("gn", s, None) for s in gn_shapes[MAIN_CASES:]]
        jobs += [("quantise", (c[1], c[3], c[5]), None) for c in cases if not c[6]]
    for i, (kind, spec, residual) in enumerate(jobs):
        if time.time() - t_start > a.deadline_s:
            res.setdefault("skipped_by_deadline", []).append(f"{kind} {spec[0] if kind == 'conv' else spec}")
            continue
        t0 = time.time()
        try:
            if kind == "conv":
                r = conv_case(spec, a.rows, a.impls, a.iters, 100 + i, residual)
                res["conv"].append(r)
            elif kind == "pt":
                r = res["per_tensor_check"] = per_tensor_check(a.rows, 7, *((64, 8) if SMOKE else (640, 64)))
            elif kind == "gn":
                r = gn_case(*spec, a.rows, a.iters, 200 + i, not a.no_inductor)
                res["gn"].append(r)
            else:
                r = quantise_case(*spec, a.rows, a.iters, 300 + i)
                res["quantise"].append(r)
        except Exception as e:  # noqa: BLE001
            r = {"case": str(spec), "error": short(e)}
            res["conv" if kind == "conv" else "gn" if kind == "gn" else "quantise"].append(r) if kind != "pt" else None
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        print(f"[{time.time() - t_start:6.1f}s +{time.time() - t0:5.1f}s] {kind}: {json.dumps(r)[:900]}", flush=True)
        write_out(res, out, a.impls)
    res["wall_s"] = round(time.time() - t_start, 1)
    write_out(res, out, a.impls)
    print((out / "fp8-conv-triton.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
