#!/usr/bin/env python3
"""CPU test: torch's mutation analysis of every Triton kernel the FP8 ops compile into a package
(scripts/export/fp8_geglu.py, fp8_conv.py) finds that the kernel writes its output and nothing else.

torch.export traces a `wrap_triton` kernel by generating its Triton IR with the scalar arguments
specialised to Python ints and reading which pointers it stores through. When that fails (a tensor
method on a scalar argument, say), torch warns and assumes every argument is written: the exported
program then returns each weight as an extra output, and the package fails its check on the GPU
("`leaves` has length 281 but the spec refers to a pytree that holds 1 items", the H200 run of
2026-12-05). The IR is generated for an sm_90 target without a GPU (the analysis compiles nothing).

For each kernel variant (geglu: ptr and tma, with and without a bias, fp16 and e4m3 out; conv: ptr,
tma_w (stride 2), tma, with and without a bias), launched through the ops' own `launch` with a
wrapper that records the call: identify_mutated_tensors is exactly the output pointer (a failed
analysis gives every pointer).

Exit 0: pass; 1: a check failed; 77: Triton is not installed (ctest SKIP_RETURN_CODE).
The ctest entry puts scripts/ on PYTHONPATH (the export package under test).
"""
from __future__ import annotations

import sys

import torch

try:
    import triton
    from triton.backends.compiler import GPUTarget
except ImportError:
    print("SKIP: triton is not installed")
    sys.exit(77)

from torch._higher_order_ops import triton_kernel_wrap  # noqa: E402

from export import fp8_conv, fp8_geglu  # noqa: E402

FP8 = torch.float8_e4m3fn


class Sm90Driver:
    """Triton's active driver for IR generation only: an H200's target, no device."""

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


def recorded_call(launch) -> tuple:
    """Runs `launch(wrap=...)` with a wrapper that records (kernel, keyword arguments) instead of running."""
    calls = []

    def wrap(kernel):
        class Grid:
            def __getitem__(self, grid):
                def run(*args, **kw):
                    names = kernel.arg_names
                    kwargs = dict(zip(names, args))
                    kwargs.update({k: v for k, v in kw.items() if k in names})
                    calls.append((kernel, kwargs))
                return run
        return Grid()

    launch(wrap)
    assert len(calls) == 1, calls
    return calls[0]


def geglu_cases():
    m, k, i = 32, 640, 2560
    x8, w8 = torch.zeros(m, k, dtype=FP8), torch.zeros(2 * i, k, dtype=FP8)
    s = torch.ones(())
    bias = torch.zeros(2 * i, dtype=torch.float16)
    for impl in fp8_geglu.KERNELS:
        for b in (None, bias):
            for out_scale in (None, s):
                out = torch.empty(m, i, dtype=torch.float16 if out_scale is None else FP8)
                name = f"geglu {impl} bias={b is not None} e4m3_out={out_scale is not None}"
                yield name, lambda wrap, impl=impl, b=b, o=out_scale, out=out: fp8_geglu.launch(
                    x8, s, w8, s, b, o, out, fp8_geglu.kernel_config(k, i), wrap=wrap, impl=impl)


def conv_cases():
    n, c = 2, 640
    x8, w8 = torch.zeros(n, 32, 32, c, dtype=FP8), torch.zeros(c, 3, 3, c, dtype=FP8)
    s, ws = torch.ones(()), torch.ones(c)
    bias = torch.zeros(c, dtype=torch.float16)
    for impl, stride in (("ptr", 1), ("tma", 1), ("tma_w", 2), ("ptr", 2)):
        _, cfg = fp8_conv.kernel_choice(c, c, stride, 32)
        if impl == "tma" and "BW" not in cfg:
            cfg = dict(cfg, BW=fp8_conv.tma_width(32))
        cfg = {k: v for k, v in cfg.items() if impl == "tma" or k != "BW"}
        ho = (32 - 1) // stride + 1
        for b in (None, bias):
            out = torch.empty(n, ho, ho, c, dtype=torch.float16)
            name = f"conv {impl} stride {stride} bias={b is not None}"
            yield name, lambda wrap, impl=impl, stride=stride, b=b, cfg=cfg, out=out: fp8_conv.launch(
                x8, s, w8, ws, b, out, stride, impl, cfg, wrap=wrap)


def main() -> int:
    triton.runtime.driver.set_active(Sm90Driver())
    failures = 0
    for name, launch in [*geglu_cases(), *conv_cases()]:
        kernel, kwargs = recorded_call(launch)
        mutated = triton_kernel_wrap.identify_mutated_tensors(kernel, kwargs, {})
        ok = mutated == ["out_ptr"]
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: written {mutated}")
    print("PASS" if not failures else f"FAIL: {failures} kernel(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
