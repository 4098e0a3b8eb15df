#!/usr/bin/env python3
"""CPU test of the FP8 3x3 convolution of the product (scripts/export/fp8_conv.py, export_sdxl.py
--fp8 --fp8-conv), no GPU:

1. the op torch.ops.sdxl.fp8_conv3x3 on the CPU (its CPU kernel) against an fp32 convolution of the
   dequantised inputs written here from the contract (x8 * x_scale, w8 * w_scale[o]): equal but for
   the fp16 output's rounding (at most one fp16 step);
2. the Triton kernels (ptr, tma_w, tma; stride 1 and 2, bias, per-channel and per-tensor weight
   scales) under TRITON_INTERPRET=1 at tiny shapes, launched as the op's CUDA implementation launches
   them (fp8_conv.launch, small tiles), against the op's CPU kernel: rel. L2 < 2e-3 (fp16 output
   rounding and fp32 summation order), every output written (poisoned with NaN first);
3. the rule: which convolutions of the full SDXL UNet (meta device) --fp8-conv quantises (36: the 38
   3x3 ones but 320->640 and the 320-channel downsampler; not conv_in / conv_out) and which kernel
   each gets at 1024x1024 (tma for stride 1, tma_w for stride 2; ptr when the width is symbolic);
4. the module swap on the tiny UNet (random weights, fp32, CPU): calibrated as fp8_quant calibrates
   (input amax over UNet calls), the FP8 UNet with its 3x3 convolutions swapped (Fp8Conv2d) against
   the FP8 UNet without (linear layers only) and against fp32: relative L2 printed and bounded; the op
   path equals the torch-only path that unet_fp8.ts runs (fp8_conv.emulated(), and a torch.jit.trace);
   fp8_conv.load_quantized_state rebuilds the same UNet from its tensors (bench/fp8_fidelity.py);
   weight shapes are nn.Conv2d's (LoRAs patch them), weight_scale [Cout, 1, 1, 1].

Exit 0: pass; 1: a check failed.
"""
from __future__ import annotations

import copy
import os
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from export import fp8_conv as C  # noqa: E402
from export import fp8_quant  # noqa: E402
from export.architecture import architecture  # noqa: E402

FAILS: list[str] = []


def check(ok: bool, what: str) -> None:
    if not ok:
        FAILS.append(what)


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def quantised(n, h, w, ci, co, g, per_channel=True):
    x = torch.randn(n, h, w, ci, generator=g) * 1.5
    wt = torch.randn(co, 3, 3, ci, generator=g) / (9 * ci) ** 0.5 * (0.2 + 1.8 * torch.rand(co, 1, 1, 1, generator=g))
    xs = (x.abs().amax() / 448).reshape(())
    ws = wt.abs().amax(dim=(1, 2, 3)) / 448 if per_channel else (wt.abs().amax() / 448).reshape(1)
    x8 = (x / xs).clamp(-448, 448).to(torch.float8_e4m3fn)
    w8 = (wt / ws.view(-1, 1, 1, 1)).clamp(-448, 448).to(torch.float8_e4m3fn)
    b = (torch.randn(co, generator=g) * 0.1).half()
    return x8, xs, w8, ws, b


def op_cpu_check(g) -> None:
    for stride, bias in ((1, True), (2, True), (1, False)):
        x8, xs, w8, ws, b = quantised(2, 9, 7, 32, 48, g)  # odd sizes: padding and stride 2 at the edges
        b = b if bias else None
        y = torch.ops.sdxl.fp8_conv3x3(x8, xs, w8, ws, b, stride)
        xd = x8.double() * xs.double()
        wd = w8.double() * ws.double().view(-1, 1, 1, 1)
        ref = F.conv2d(xd.permute(0, 3, 1, 2), wd.permute(0, 3, 1, 2), None if b is None else b.double(),
                       stride=stride, padding=1).permute(0, 2, 3, 1)
        # one fp16 step at each value, plus fp32 summation error (values near 0 have tiny fp16 steps)
        step = (ref.abs().half().float() * 2.0 ** -10).clamp_min(2.0 ** -24).double() + 1e-6 * float(ref.abs().max())
        worst = float(((y.double() - ref).abs() / step).max())
        e = rel(y, ref)
        print(f"op CPU stride {stride} bias {bias}: shape {tuple(y.shape)} {y.dtype}, rel L2 vs float64 of the "
              f"dequantised inputs {e:.2e}, worst |diff| {worst:.2f} fp16 steps")
        check(y.dtype == torch.float16 and y.shape == ref.shape, f"op CPU stride {stride}: dtype / shape")
        check(worst <= 1.0 and e < 1e-3, f"op CPU stride {stride}: {worst} fp16 steps, rel {e}")


KERNEL_CASES = (  # impl, stride, per-channel, config (tiles small enough for the interpreter)
    ("ptr", 1, True, {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16}),
    ("ptr", 2, True, {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16}),
    ("tma_w", 2, True, {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16}),
    ("tma_w", 1, False, {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16}),
    ("tma", 1, True, {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "BW": 8}),
)


def kernel_check(g) -> None:
    for impl, stride, per_channel, cfg in KERNEL_CASES:
        x8, xs, w8, ws, b = quantised(1, 8, 8, 32, 48, g, per_channel)  # Cout 48: a partial N tile
        ho = (8 - 1) // stride + 1
        out = torch.full((1, ho, ho, 48), float("nan"), dtype=torch.float16)
        C.launch(x8, xs, w8, ws, b, out, stride, impl, dict(cfg, num_warps=4, num_stages=2))
        want = torch.ops.sdxl.fp8_conv3x3(x8, xs, w8, ws, b, stride)
        e = rel(out, want)
        tag = f"kernel {impl} stride {stride} {'per-channel' if per_channel else 'per-tensor'}"
        print(f"{tag}: rel L2 vs the op's CPU kernel {e:.2e}")
        check(bool(torch.isfinite(out).all()), f"{tag}: output not all written")
        check(e < 2e-3, f"{tag}: rel L2 {e}")


def rule_check() -> None:
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        unet = UNet2DConditionModel(**architecture("full")["unet"])
    names = C.fp8_conv_names(unet)
    mods = dict(unet.named_modules())
    shapes = {(mods[n].in_channels, mods[n].out_channels, mods[n].stride[0]) for n in names}
    print(f"rule: the full UNet: {len(names)} convolutions quantised, {len(shapes)} (Cin, Cout, stride) shapes")
    check(len(names) == 36, f"rule: {len(names)} quantised convolutions, want 36")
    check(not shapes & C.FP16_SHAPES and "conv_in" not in names and "conv_out" not in names, "rule: kept ones")
    # At 1024x1024 (latent 128 -> 64 -> 32), the kernel per shape:
    for ci, co, st, w, want in ((320, 320, 1, 128, "tma"), (1280, 1280, 1, 32, "tma"), (2560, 1280, 1, 32, "tma"),
                                (640, 640, 2, 64, "tma_w"), (960, 320, 1, 128, "tma"), (640, 640, 1, None, "ptr")):
        impl, cfg = C.kernel_choice(ci, co, st, w)
        check(impl == want and ci % cfg["BLOCK_K"] == 0 and (impl != "tma" or w % cfg["BW"] == 0),
              f"rule: {ci}->{co} stride {st} width {w}: {impl} {cfg}")


def tiny_inputs(g, rows=1, t=500.0):
    return (torch.randn(rows, 4, 16, 16, generator=g), torch.full((rows,), t), torch.randn(rows, 77, 64, generator=g),
            {"text_embeds": torch.randn(rows, 32, generator=g), "time_ids": torch.randn(rows, 6, generator=g)})


class Call(torch.nn.Module):
    def __init__(self, unet):
        super().__init__()
        self.unet = unet

    def forward(self, x, t, ctx, te, ti):
        return self.unet(x, t, ctx, added_cond_kwargs={"text_embeds": te, "time_ids": ti}).sample


@torch.no_grad()
def swap_check(g) -> None:
    from diffusers import UNet2DConditionModel

    torch.manual_seed(7)
    unet = UNet2DConditionModel(**architecture("tiny")["unet"]).eval()
    lin, conv = fp8_quant.fp8_layer_names(unet), C.fp8_conv_names(unet)
    with fp8_quant.input_amax(unet, lin + conv) as amax:  # as fp8_quant.calibrate: over the UNet calls
        for t in (900.0, 300.0):
            x, tt, ctx, add = tiny_inputs(g, t=t)
            unet(x, tt, ctx, added_cond_kwargs=add)
    conv_amax = {k: amax.pop(k) for k in conv}
    unet8 = copy.deepcopy(unet)
    fp8_quant.quantize_unet(unet8, amax)
    unet8c = copy.deepcopy(unet8)
    n = C.quantize_convs(unet8c, conv_amax)
    x, tt, ctx, add = tiny_inputs(g, t=500.0)
    args = (x, tt, ctx, add["text_embeds"], add["time_ids"])
    o32, o8, o8c = (Call(u)(*args) for u in (unet, unet8, unet8c))
    e_swap, e8, e8c = rel(o8c, o8), rel(o8, o32), rel(o8c, o32)
    print(f"swap: tiny UNet, {len(lin)} FP8 linear layers, {n} FP8 3x3 convolutions: output rel. L2 "
          f"swapped vs unswapped FP8 {e_swap:.4f}; unswapped FP8 vs fp32 {e8:.4f}; swapped vs fp32 {e8c:.4f}")
    check(n == 38 and len(conv) == 38, f"swap: {n} convolutions swapped, want the tiny UNet's 38")
    check(e_swap < 0.15 and e8c < 0.15, f"swap: rel. L2 {e_swap} / {e8c}")
    check(e8c > e8 * 0.5, "swap: the convolutions changed nothing?")
    m = unet8c.get_submodule(conv[0])
    check(isinstance(m, C.Fp8Conv2d) and m.weight.dtype == torch.float8_e4m3fn
          and m.weight.shape == unet.get_submodule(conv[0]).weight.shape
          and m.weight_scale.shape == (m.out_channels, 1, 1, 1), "swap: Fp8Conv2d's tensors")
    with C.emulated():
        oem = Call(unet8c)(*args)
    traced = torch.jit.trace(Call(unet8c), args, check_trace=False)
    ots = traced(*args)
    d_em, d_ts = float((oem - o8c).abs().max()), float((ots - o8c).abs().max())
    op_calls = sum("fp8_conv3x3" in str(nd) for nd in traced.inlined_graph.nodes())
    print(f"swap: op path vs the torch-only path of unet_fp8.ts: max |diff| {d_em:.3g} eager, {d_ts:.3g} traced "
          f"(op calls in the trace: {op_calls})")
    check(d_em == 0.0 and d_ts == 0.0 and op_calls == 0, f"swap: emulated {d_em}, traced {d_ts}, {op_calls} op calls")
    tensors = {k: v for k, v in list(unet8c.named_parameters()) + list(unet8c.named_buffers())}
    rebuilt = copy.deepcopy(unet)
    k = C.load_quantized_state(rebuilt, tensors)
    orb = Call(rebuilt)(*args)
    check(k == len(lin) + 38 and torch.equal(orb, o8c), f"swap: load_quantized_state {k} layers, same output?")
    print(f"swap: load_quantized_state rebuilt {k} layers, same output: {torch.equal(orb, o8c)}")


def main() -> int:
    t0 = time.time()
    g = torch.Generator().manual_seed(0)
    torch.set_num_threads(1)  # the CPU is shared: spinning threads cost more than they gain here
    for part in (op_cpu_check, kernel_check, rule_check, swap_check):
        t1 = time.time()
        part(g) if part is not rule_check else part()
        print(f"  ({part.__name__}: {time.time() - t1:.1f} s)")
    print(f"{time.time() - t0:.1f} s")
    for f in FAILS:
        print("FAIL:", f)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
