#!/usr/bin/env python3
"""Dense matmul peak of this device (TFLOP/s), the denominator of "fraction of
the hardware limit" in bench/bench_table.py: an N x N x N matmul in each dtype,
best of --reps timed calls after warm-up (CUDA-synchronised wall time).
FLOP per call = 2 N^3. Writes one JSON object (and prints it).

    bench_matmul_peak.py --out peak.json [--n 8192 --dtypes fp16,bf16 --device cuda --reps 20]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_tflops(n: int, dtype: torch.dtype, device: str, reps: int) -> dict:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(3):  # warm-up: cuBLAS handle, heuristics, clocks
        torch.mm(a, b, out=c)
    sync(device)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(a, b, out=c)
        sync(device)
        times.append(time.perf_counter() - t)
    flop = 2.0 * n**3
    return {"n": n, "best_s": min(times), "tflops": flop / min(times) / 1e12,
            "median_tflops": flop / sorted(times)[len(times) // 2] / 1e12}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--dtypes", default="fp16,bf16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    if a.n <= 0 or a.reps <= 0:
        ap.error("--n and --reps must be positive")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device visible to torch")
    res = {"device": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu", "torch": torch.__version__}
    for name in a.dtypes.split(","):
        if name not in DTYPES:
            ap.error(f"--dtypes: unknown dtype '{name}' (fp32, fp16, bf16)")
        res[name] = peak_tflops(a.n, DTYPES[name], a.device, a.reps)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
