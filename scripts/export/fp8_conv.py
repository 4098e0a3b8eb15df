"""FP8 (e4m3) 3x3 convolutions for export_sdxl.py --fp8 --fp8-conv: the Triton implicit-GEMM
kernels (measured in bench/lab/2026-12-fp8-unet/results/2026-12-03-fp8-conv-triton-h200.md), registered as the custom op
`torch.ops.sdxl.fp8_conv3x3` with torch.library.triton_op, so torch.export + AOTInductor compile the
kernels into unet_fp8.pt2; the module that replaces an nn.Conv2d by it (Fp8Conv2d); and
load_quantized_state, which rebuilds the FP8 UNet (linear layers and convolutions) from its tensors.

Contract of one quantised convolution (Fp8Conv2d, replacing an nn.Conv2d 3x3, padding 1, stride 1 or 2,
Cin inputs, Cout outputs):
  weight        float8_e4m3fn [Cout, Cin, 3, 3]  round(W / weight_scale), nn.Conv2d's layout (LoRAs patch it)
  weight_scale  float32 [Cout, 1, 1, 1]           amax(|W[o]|) / 448 per output channel
  input_scale   float32 []                        amax(|x|) / 448 over the calibration run (static, as the
                                                  linear layers' in fp8_quant.py)
  bias          model dtype [Cout]                unchanged
  y = conv(sat(x / input_scale) * input_scale, weight * weight_scale) + bias, products of e4m3 values
  accumulated in fp32, rounded to fp16, returned in the model dtype. sat() clamps to +-448.

The op takes the quantised input NHWC ([N, H, W, Cin] e4m3, contiguous), the weight as [Cout, 3, 3, Cin]
e4m3 (contiguous), the scales (x: [] or [1]; w: [Cout] or [1]), the bias and the stride; it returns fp16
NHWC [N, Ho, Wo, Cout]. On CUDA it runs one of the Triton kernels (kernel_choice); on the CPU
conv_reference: the dequantised tensors convolved in fp32 (the exact math; the CPU tests run it). Traced
by torch.jit (unet_fp8.ts cannot hold a Triton kernel: sdxl-batch's TorchScript has no such op) the
module runs conv_reference in the model dtype on CUDA (fp32 on the CPU): the same weights and scales,
no speed gain; only unet_fp8.pt2 runs the kernels.
"""
from __future__ import annotations

import contextlib
import os

import torch
import torch.nn.functional as F
from torch import nn

from .fp8_quant import E4M3_MAX, FP8, Fp8Linear, quantize_tensor

import triton
import triton.language as tl

FORMAT = ("e4m3fn 3x3 convolutions: static per-tensor input scales (calibrated amax/448), "
          "per-output-channel weight scales (amax/448), fp32 accumulation, fp16 out")
OP = "sdxl::fp8_conv3x3"

# (Cin, Cout, stride) of SDXL's 3x3 convolutions where the FP8 kernels lose to cuDNN fp16 at 16 rows on
# the H200 (320->640 @64: 0.92x; the 320-channel downsampler, 320->320 @128 stride 2: 0.83x;
# bench/lab/2026-12-fp8-unet/results/2026-12-03-fp8-conv-triton-h200.md): they stay nn.Conv2d in the model dtype.
FP16_SHAPES = {(320, 640, 1), (320, 320, 2)}
# conv_in (4 -> 320) and conv_out (320 -> 4) stay in the model dtype, as in TensorRT's FP8 recipe.
KEEP = ("conv_in", "conv_out")


def _interpreter_numpy2_fix() -> None:
    """Triton 3.6's interpreter turns a scalar into an int with int(ndarray of shape (1,)), which
    NumPy >= 2.4 refuses (a `range` over a kernel argument fails); under TRITON_INTERPRET=1 only,
    make that conversion take the array's single element."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    from triton.runtime import interpreter

    if getattr(interpreter, "_sdxl_index_fix", False):
        return
    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched
    interpreter._sdxl_index_fix = True




_interpreter_numpy2_fix()


# ---------------------------------------------------------------------------------------- kernels
# (moved from bench/lab/2026-12-fp8-unet/fp8_conv_triton.py, which imports them from here)


@triton.jit
def _tile_ids(pid, M, C_OUT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped launch order: GROUP_M row tiles share the same weight tiles while they are in L2."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(C_OUT, BLOCK_N)
    group = GROUP_M * num_pid_n
    first_m = (pid // group) * GROUP_M
    size_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    return pid_m, pid_n


@triton.jit
def _epilogue(acc, out_ptr, bias_ptr, wscale_ptr, xscale_ptr, res_ptr, offs_m, offs_n, M, C_OUT,
              HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, PER_CHANNEL: tl.constexpr):
    """acc * (x_scale * w_scale[n]) + bias[n] (+ residual[m, n]) -> fp16 [M, Cout] (NHWC)."""
    m_ok = offs_m < M
    n_ok = offs_n < C_OUT
    xs = tl.load(xscale_ptr)
    if PER_CHANNEL:
        ws = tl.load(wscale_ptr + offs_n, mask=n_ok, other=0.0)
    else:
        ws = tl.zeros([acc.shape[1]], dtype=tl.float32) + tl.load(wscale_ptr)
    out = acc * (ws * xs)[None, :]
    if HAS_BIAS:
        out += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    ptrs = offs_m.to(tl.int64)[:, None] * C_OUT + offs_n[None, :]
    mask = m_ok[:, None] & n_ok[None, :]
    if HAS_RES:
        out += tl.load(res_ptr + ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + ptrs, out.to(tl.float16), mask=mask)


@triton.jit
def _a_tile(x_ptr, k, n_img, hi0, wi0, m_ok, offs_k, H, W, C_IN, BLOCK_K: tl.constexpr):
    """The [BLOCK_M, BLOCK_K] slice of the im2col matrix at K offset k (zeros in the padding)."""
    tap = k // C_IN
    c0 = k - tap * C_IN
    hi = hi0 + tap // 3
    wi = wi0 + tap % 3
    ok = m_ok & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
    row = (n_img * H + hi) * W + wi
    ptrs = x_ptr + row.to(tl.int64)[:, None] * C_IN + (c0 + offs_k)[None, :]
    return tl.load(ptrs, mask=ok[:, None], other=0.0)


@triton.jit
def _conv3x3_fp8_ptr(x_ptr, w_ptr, out_ptr, bias_ptr, wscale_ptr, xscale_ptr, res_ptr,
                     NB, H, W, HO, WO, C_IN, C_OUT,
                     STRIDE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                     PER_CHANNEL: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    M = NB * HO * WO
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, C_OUT, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_img = offs_m // (HO * WO)
    rem = offs_m % (HO * WO)
    hi0 = (rem // WO) * STRIDE - 1
    wi0 = (rem % WO) * STRIDE - 1
    n_ok = offs_n < C_OUT
    w_rows = w_ptr + offs_n.to(tl.int64)[None, :] * (9 * C_IN)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, 9 * C_IN, BLOCK_K):
        a = _a_tile(x_ptr, k, n_img, hi0, wi0, m_ok, offs_k, H, W, C_IN, BLOCK_K)
        b = tl.load(w_rows + (k + offs_k)[:, None], mask=n_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
    _epilogue(acc, out_ptr, bias_ptr, wscale_ptr, xscale_ptr, res_ptr, offs_m, offs_n, M, C_OUT,
              HAS_BIAS, HAS_RES, PER_CHANNEL)


@triton.jit
def _conv3x3_fp8_tma_w(x_ptr, w_ptr, out_ptr, bias_ptr, wscale_ptr, xscale_ptr, res_ptr,
                       NB, H, W, HO, WO, C_IN, C_OUT,
                       STRIDE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                       PER_CHANNEL: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    M = NB * HO * WO
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, C_OUT, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_img = offs_m // (HO * WO)
    rem = offs_m % (HO * WO)
    hi0 = (rem // WO) * STRIDE - 1
    wi0 = (rem % WO) * STRIDE - 1
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[C_OUT, 9 * C_IN], strides=[9 * C_IN, 1],
                                       block_shape=[BLOCK_N, BLOCK_K])
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, 9 * C_IN, BLOCK_K):
        a = _a_tile(x_ptr, k, n_img, hi0, wi0, m_ok, offs_k, H, W, C_IN, BLOCK_K)
        b = w_desc.load([pid_n * BLOCK_N, k])
        acc = tl.dot(a, b.T, acc)
    _epilogue(acc, out_ptr, bias_ptr, wscale_ptr, xscale_ptr, res_ptr, offs_m, offs_n, M, C_OUT,
              HAS_BIAS, HAS_RES, PER_CHANNEL)


@triton.jit
def _conv3x3_fp8_tma(x_ptr, w_ptr, out_ptr, bias_ptr, wscale_ptr, xscale_ptr, res_ptr,
                     NB, H, W, HO, WO, C_IN, C_OUT,
                     STRIDE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                     PER_CHANNEL: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                     BW: tl.constexpr, WS: tl.constexpr):
    """Stride 1; each M tile is a BH x BW patch (BH = BLOCK_M // BW) of one image, BW | W."""
    BH: tl.constexpr = BLOCK_M // BW
    tiles_w = W // BW
    tiles_h = tl.cdiv(H, BH)
    M_TILES = NB * tiles_h * tiles_w
    pid_m, pid_n = _tile_ids(tl.program_id(0), M_TILES * BLOCK_M, C_OUT, BLOCK_M, BLOCK_N, GROUP_M)
    n_img = pid_m // (tiles_h * tiles_w)
    t = pid_m % (tiles_h * tiles_w)
    h0 = (t // tiles_w) * BH
    w0 = (t % tiles_w) * BW
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[NB, H, W, C_IN], strides=[H * W * C_IN, W * C_IN, C_IN, 1],
                                       block_shape=[1, BH, BW, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[C_OUT, 9 * C_IN], strides=[9 * C_IN, 1],
                                       block_shape=[BLOCK_N, BLOCK_K])
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in tl.range(0, 9 * C_IN, BLOCK_K, warp_specialize=WS):
        tap = k // C_IN
        c0 = k - tap * C_IN
        a = x_desc.load([n_img, h0 + tap // 3 - 1, w0 + tap % 3 - 1, c0]).reshape(BLOCK_M, BLOCK_K)
        b = w_desc.load([pid_n * BLOCK_N, k])
        acc = tl.dot(a, b.T, acc)
    r = tl.arange(0, BLOCK_M)
    h = h0 + r // BW
    offs_m = (n_img * H + h) * W + w0 + r % BW
    offs_m = tl.where(h < H, offs_m, NB * H * W)  # rows past the image's last row: masked as m >= M
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    _epilogue(acc, out_ptr, bias_ptr, wscale_ptr, xscale_ptr, res_ptr, offs_m, offs_n, NB * H * W, C_OUT,
              HAS_BIAS, HAS_RES, PER_CHANNEL)



KERNELS = {"ptr": _conv3x3_fp8_ptr, "tma_w": _conv3x3_fp8_tma_w, "tma": _conv3x3_fp8_tma}


def tma_width(w) -> int | None:
    """The tma kernel's patch width for image width w: the largest of 64, 32, 16 that divides it
    (None when none does, or w is symbolic: an export for a range of sizes)."""
    if not isinstance(w, int):
        return None
    return next((bw for bw in (64, 32, 16) if w % bw == 0), None)


def kernel_choice(c_in: int, c_out: int, stride: int, w) -> tuple[str, dict]:
    """The kernel and its configuration for one convolution. Rule, from the per-shape autotuned best
    at 16 rows on the H200 (bench/lab/2026-12-fp8-unet/results/2026-12-03-fp8-conv-triton-h200.md and its JSON's configs):
    stride 1 -> `tma` (1.03-1.55x cuDNN fp16; it needs a fixed image width with a power-of-two
    patch width dividing it, else `ptr`, 0.95-1.33x), stride 2 -> `tma_w` (1.14x at 640 channels);
    tiles 256x128x128 / 8 warps / 3 stages where 128 divides Cin, else K steps of 64 (320, 960
    channels: 128x64 or 128x128 tiles, 4 warps, 5 stages, for 320 output channels)."""
    bk = next(k for k in (128, 64, 32, 16) if c_in % k == 0)
    only_ptr = os.environ.get("SDXL_FP8_CONV_KERNEL") == "ptr"  # no tensor descriptors: for a GPU that refuses them
    if stride == 2 and not only_ptr:
        return "tma_w", dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=bk, num_warps=4, num_stages=3 if bk == 128 else 5)
    if bk == 128:
        cfg = dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=128, num_warps=8, num_stages=3)
    elif c_out <= 320:
        cfg = dict(BLOCK_M=128, BLOCK_N=64 if c_in <= 320 else 128, BLOCK_K=bk, num_warps=4, num_stages=5)
    else:
        cfg = dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=bk, num_warps=8, num_stages=4)
    bw = None if only_ptr else tma_width(w)
    if bw is not None and cfg["BLOCK_M"] % bw == 0:
        return "tma", dict(cfg, BW=bw)
    if bk < 128:
        cfg = dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=bk, num_warps=8, num_stages=4)
    return "ptr", cfg


_ALLOCATOR_SET = False


def ensure_descriptor_scratch(impl: str) -> None:
    """A kernel variant other than `ptr` (tma, tma_w; fp8_geglu's tma) builds tensor descriptors on the
    device and, run eagerly, needs Triton's scratch allocator (AOTInductor's wrapper allocates that
    scratch itself: aoti.grid_sized_scratch); set once, the first time."""
    global _ALLOCATOR_SET
    if impl != "ptr" and not torch.compiler.is_compiling() and not _ALLOCATOR_SET:
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        _ALLOCATOR_SET = True


def _cdiv(a, b):
    return (a + b - 1) // b


def launch(x8, x_scale, w8, w_scale, bias, out, stride: int, impl: str, cfg: dict, wrap=None) -> None:
    """Runs kernel `impl` with configuration `cfg` ({BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages[,
    GROUP_M][, BW]}) into `out` (fp16 [N, Ho, Wo, Cout]); wrap: torch.library.wrap_triton inside the op."""
    n, h, w, c_in = x8.shape
    c_out = w8.shape[0]
    ho, wo = out.shape[1], out.shape[2]
    cfg = dict(cfg)
    nw, ns = cfg.pop("num_warps"), cfg.pop("num_stages")
    cfg.setdefault("GROUP_M", 8)
    if impl == "tma":
        cfg.setdefault("WS", False)
        grid = (n * _cdiv(h, cfg["BLOCK_M"] // cfg["BW"]) * (w // cfg["BW"]) * _cdiv(c_out, cfg["BLOCK_N"]),)
    else:
        grid = (_cdiv(n * ho * wo, cfg["BLOCK_M"]) * _cdiv(c_out, cfg["BLOCK_N"]),)
    per_channel = w_scale.numel() == c_out and c_out > 1
    has_bias = bias is not None
    kernel = KERNELS[impl]
    if wrap is not None:
        kernel = wrap(kernel)
    # Unused pointer arguments (no bias, no residual) get w_scale: never read.
    kernel[grid](x8, w8, out, bias if has_bias else w_scale, w_scale, x_scale, w_scale, n, h, w, ho, wo, c_in, c_out,
                 STRIDE=stride, HAS_BIAS=has_bias, HAS_RES=False, PER_CHANNEL=per_channel, **cfg,
                 num_warps=nw, num_stages=ns)


def conv_reference(x8: torch.Tensor, x_scale: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor,
                   bias: torch.Tensor | None, stride: int, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The op's math in torch: x8 [N, H, W, Cin] and w8 [Cout, 3, 3, Cin] dequantised in fp32, convolved
    in compute_dtype (fp32: the exact reference), fp16 NHWC out."""
    x = (x8.float() * x_scale.float().reshape(())).to(compute_dtype).permute(0, 3, 1, 2)
    w = (w8.float() * w_scale.float().reshape(-1, 1, 1, 1)).to(compute_dtype).permute(0, 3, 1, 2)
    b = None if bias is None else bias.to(compute_dtype)
    y = F.conv2d(x, w, b, stride=stride, padding=1)
    return y.permute(0, 2, 3, 1).to(torch.float16).contiguous()


def _check_args(x8, w8, stride) -> None:
    torch._check(x8.dim() == 4 and w8.dim() == 4, lambda: "fp8_conv3x3: x8 [N, H, W, Cin], w8 [Cout, 3, 3, Cin]")
    torch._check(w8.shape[1] == 3 and w8.shape[2] == 3 and w8.shape[3] == x8.shape[3],
                 lambda: f"fp8_conv3x3: weight {tuple(w8.shape)} does not fit input {tuple(x8.shape)}")
    torch._check(stride in (1, 2), lambda: "fp8_conv3x3: stride 1 or 2")


def _define_op():
    from torch.library import triton_op, wrap_triton

    @triton_op(OP, mutates_args=())
    def fp8_conv3x3(x8: torch.Tensor, x_scale: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor,
                    bias: torch.Tensor | None, stride: int) -> torch.Tensor:
        # The CUDA implementation; traced by torch.export (and run on fake tensors for shapes), so
        # torch ops and wrap_triton kernels only.
        _check_args(x8, w8, stride)
        n, h, w, c_in = x8.shape
        c_out = w8.shape[0]
        out = x8.new_empty((n, (h - 1) // stride + 1, (w - 1) // stride + 1, c_out), dtype=torch.float16)
        impl, cfg = kernel_choice(c_in, c_out, stride, w)
        ensure_descriptor_scratch(impl)
        launch(x8, x_scale, w8, w_scale, bias, out, stride, impl, cfg, wrap=wrap_triton)
        return out

    @fp8_conv3x3.register_kernel("cpu")
    def _(x8, x_scale, w8, w_scale, bias, stride):
        _check_args(x8, w8, stride)
        return conv_reference(x8, x_scale, w8, w_scale, bias, stride)

    return fp8_conv3x3


fp8_conv3x3 = _define_op()


# ------------------------------------------------------------------------------------------------ module

_EMULATE = [False]


@contextlib.contextmanager
def emulated():
    """Inside: every Fp8Conv2d runs conv_reference, and every fused feed-forward (fp8_geglu) its
    geglu_reference, as the traced unet_fp8.ts does (the reference of unet_fp8.ts's check), not the op."""
    _EMULATE[0] = True
    try:
        yield
    finally:
        _EMULATE[0] = False


def torch_path() -> bool:
    """True where the swapped modules (Fp8Conv2d, fp8_geglu's fused feed-forward) run their torch math
    instead of the Triton op: while torch.jit traces unet_fp8.ts (TorchScript holds no Triton kernel)
    and inside emulated()."""
    return torch.jit.is_tracing() or _EMULATE[0]


class Fp8Conv2d(nn.Module):
    """nn.Conv2d's 3x3 forward with an e4m3 weight and static scales (module docstring)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, bias: torch.Tensor | None,
                 out_dtype: torch.dtype, device) -> None:
        super().__init__()
        self.in_channels, self.out_channels, self.stride = in_channels, out_channels, stride
        self.out_dtype = out_dtype
        self.weight = nn.Parameter(torch.zeros(out_channels, in_channels, 3, 3, dtype=FP8, device=device),
                                   requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.register_buffer("weight_scale", torch.ones(out_channels, 1, 1, 1, dtype=torch.float32, device=device))
        self.register_buffer("input_scale", torch.ones((), dtype=torch.float32, device=device))

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, input_amax: float) -> "Fp8Conv2d":
        w = conv.weight.detach()
        q = cls(conv.in_channels, conv.out_channels, conv.stride[0], conv.bias, w.dtype, w.device)
        q.weight_scale.copy_(w.float().abs().amax(dim=(1, 2, 3), keepdim=True).clamp_min(1e-12) / E4M3_MAX)
        q.input_scale.fill_(max(input_amax, 1e-12) / E4M3_MAX)
        q.weight.copy_(quantize_tensor(w.float(), q.weight_scale))
        return q

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x8 = quantize_tensor(x.permute(0, 2, 3, 1), self.input_scale).contiguous()  # NHWC e4m3
        w8 = self.weight.permute(0, 2, 3, 1).contiguous()  # [Cout, 3, 3, Cin]: K = (tap, cin)
        ws = self.weight_scale.reshape(-1)
        if torch_path():
            dt = torch.float32 if x.device.type == "cpu" else self.out_dtype
            y = conv_reference(x8, self.input_scale, w8, ws, self.bias, self.stride, dt)
        else:
            y = torch.ops.sdxl.fp8_conv3x3(x8, self.input_scale, w8, ws, self.bias, self.stride)
        return y.permute(0, 3, 1, 2).to(self.out_dtype)

    def dequantized(self) -> torch.Tensor:
        return self.weight.float() * self.weight_scale


def fp8_conv_names(unet: nn.Module) -> list[str]:
    """The nn.Conv2d layers --fp8-conv quantises, in module order: 3x3, padding 1, stride 1 or 2, no
    groups or dilation, Cin a multiple of 16 (a K step lies in one tap), not conv_in / conv_out, not a
    shape of FP16_SHAPES."""
    names = []
    for name, m in unet.named_modules():
        if not isinstance(m, nn.Conv2d) or name in KEEP:
            continue
        if (m.kernel_size != (3, 3) or m.padding != (1, 1) or m.dilation != (1, 1) or m.groups != 1
                or m.stride not in ((1, 1), (2, 2)) or m.padding_mode != "zeros" or m.in_channels % 16):
            continue
        if (m.in_channels, m.out_channels, m.stride[0]) in FP16_SHAPES:
            continue
        names.append(name)
    return names


def quantize_convs(unet: nn.Module, amax: dict[str, float]) -> int:
    """Replaces each calibrated nn.Conv2d by its Fp8Conv2d, in place; returns how many."""
    for name, a in amax.items():
        parent_name, _, child = name.rpartition(".")
        parent = unet.get_submodule(parent_name) if parent_name else unet
        setattr(parent, child, Fp8Conv2d.from_conv(getattr(parent, child), a))
    return len(amax)


def load_quantized_state(unet: nn.Module, tensors: dict[str, torch.Tensor]) -> int:
    """Turns a diffusers UNet into the fp8 UNet whose tensors (unet_fp8.ts's named
    parameters and buffers, without a prefix) are given: the layers with a weight_scale
    become Fp8Linear (an nn.Linear) or Fp8Conv2d (an nn.Conv2d, --fp8-conv) with exactly
    those values. Returns how many. For references and benchmarks that must run the very
    weights an export wrote. Here, not in fp8_quant, because it needs both layer kinds
    and this module sits above fp8_quant."""
    layers = sorted(n[: -len(".weight_scale")] for n in tensors if n.endswith(".weight_scale"))
    for name in layers:
        parent_name, _, child = name.rpartition(".")
        parent = unet.get_submodule(parent_name) if parent_name else unet
        lin = getattr(parent, child)
        if isinstance(lin, nn.Conv2d):  # --fp8-conv's convolutions
            q = Fp8Conv2d(lin.in_channels, lin.out_channels, lin.stride[0], lin.bias, lin.weight.dtype,
                          lin.weight.device)
        else:
            q = Fp8Linear(lin.out_features, lin.in_features, lin.bias, lin.weight.dtype, lin.weight.device)
        for t in ("weight", "weight_scale", "input_scale"):
            getattr(q, t).copy_(tensors[f"{name}.{t}"])
        if q.bias is not None:
            q.bias.copy_(tensors[f"{name}.bias"])
        setattr(parent, child, q)
    return len(layers)
