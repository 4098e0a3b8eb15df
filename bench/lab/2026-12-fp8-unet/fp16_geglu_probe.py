#!/usr/bin/env python3
"""Probe (GPU machine): would the exact fp16 UNet gain from each feed-forward's GEGLU fused into its
first GEMM? (issue 44: "the exact fp16 path gains what applies to it (fused GEGLU and norms)")

Today (unet.pt2): cuBLAS's fp16 GEMM (x [M, K] @ W^T [K, 2I] + bias) writes fp16 [M, 2I]; an Inductor
kernel then computes hidden * gelu(gate) (diffusers' GEGLU, exact erf). Here, at SDXL's two feed-forward
shapes (fp8_geglu_triton.CASES) and --rows rows (CFG: 2 per image):
  gemm    F.linear alone (cuBLAS);
  today   torch.compile (static shapes) of F.linear + GEGLU: the GEMM an extern cuBLAS call, the GEGLU
          one Inductor kernel, as the package runs them;
  fused   scripts/export/fp8_geglu.py's `ptr` kernel on fp16 x and W (tl.dot on fp16 with fp32
          accumulation, both scales 1.0), fp16 out, autotuned over fp8_geglu_triton.HOPPER_TILES.
Each the median of --iters calls timed with CUDA events after warm-up; rel. L2 of today's and the fused
output against a float64 reference on the first REF_ROWS rows (the fused output poisoned with NaN first
and checked written); ms a UNet step saved = (today - fused) x the shape's blocks per step.
Results: --out/fp16-geglu-probe.json and .md.

    python3 bench/lab/2026-12-fp8-unet/fp16_geglu_probe.py --out DIR [--rows 16] [--iters 30]
    python3 bench/lab/2026-12-fp8-unet/fp16_geglu_probe.py --smoke-cpu --out DIR   # CPU, TRITON_INTERPRET=1, tiny shapes:
        the plumbing only (eager GEGLU, CPU-timed; the numbers mean nothing)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fp8_geglu_triton as T  # noqa: E402  (sets TRITON_INTERPRET=1 first under --smoke-cpu)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def linear(x, w, b):
    return F.linear(x, w, b)


def today(x, w, b):
    return T.geglu_fp16(F.linear(x, w, b))


def reference64(x, w, b):
    p = x.double() @ w.double().t() + b.double()
    h, g = p.chunk(2, dim=-1)
    return h * F.gelu(g)


def case_result(case, rows: int, iters: int, inductor: bool) -> dict:
    name, k, i, tokens, blocks = case
    m = rows * tokens
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g).to(T.DEVICE, torch.float16)
    w = (torch.randn(2 * i, k, generator=g) / k ** 0.5).to(T.DEVICE, torch.float16)
    b = (0.1 * torch.randn(2 * i, generator=g)).to(T.DEVICE, torch.float16)
    one = torch.ones((), dtype=torch.float32, device=T.DEVICE)
    out = T.poisoned((m, i), torch.float16, T.DEVICE)
    today_fn = T.compiled(today, inductor)

    def fused():
        T.fused_tuned("ptr", x, one, w, one, b, None, out)

    r = {"case": name, "M": m, "K": k, "I": i, "blocks_per_step": blocks}
    r["gemm_ms"] = T.median_of(lambda: linear(x, w, b), iters)
    r["today_ms"] = T.median_of(lambda: today_fn(x, w, b), iters)
    fused()  # the autotuner's first call picks the configuration
    T.sync()
    r["fused_written"] = T.all_written(out)
    r["fused_ms"] = T.median_of(fused, iters)
    r["fused_config"] = T.best_config("ptr")
    n = min(m, T.REF_ROWS)
    ref = reference64(x[:n], w, b)
    r["today_rel_l2"] = round(T.rel_l2(today_fn(x, w, b)[:n], ref), 6)
    r["fused_rel_l2"] = round(T.rel_l2(out[:n], ref), 6)
    r["saved_ms_per_step"] = round((r["today_ms"] - r["fused_ms"]) * blocks, 3)
    return r


def markdown(res: dict) -> str:
    lines = [f"# Fused GEGLU in the fp16 feed-forward ({res['device']}, torch {res['torch']}, Triton {res['triton']}, "
             f"{res['rows']} rows)", "",
             "| shape | blocks a step | cuBLAS GEMM ms | today (GEMM + Inductor GEGLU) ms | fused ms | rel. L2 today / fused "
             "| ms a step saved | fused configuration |", "|---|---|---|---|---|---|---|---|"]
    for r in res["cases"]:
        lines.append(f"| {r['case']} | {r['blocks_per_step']} | {r['gemm_ms']} | {r['today_ms']} | {r['fused_ms']} | "
                     f"{r['today_rel_l2']} / {r['fused_rel_l2']} | {r['saved_ms_per_step']} | {r['fused_config']} |")
    lines += ["", f"Per UNet step at {res['rows']} rows: {res['saved_ms_per_step']} ms saved in all.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--smoke-cpu", action="store_true", help="CPU, TRITON_INTERPRET=1, tiny shapes")
    a = ap.parse_args()
    cases = T.CASES
    if a.smoke_cpu:
        T.SMOKE, T.DEVICE, cases = True, "cpu", T.SMOKE_CASES
        a.rows = 1
    elif not torch.cuda.is_available():
        raise SystemExit("fp16_geglu_probe.py: no CUDA device (--smoke-cpu runs the plumbing on the CPU)")
    import triton

    res = {"device": torch.cuda.get_device_name() if T.DEVICE == "cuda" else "cpu", "torch": torch.__version__,
           "triton": triton.__version__, "rows": a.rows, "cases": []}
    t0 = time.time()
    for case in cases:
        res["cases"].append(case_result(case, a.rows, a.iters, inductor=not a.smoke_cpu))
        print(json.dumps(res["cases"][-1]), flush=True)
    res["saved_ms_per_step"] = round(sum(r["saved_ms_per_step"] for r in res["cases"]), 3)
    res["seconds"] = round(time.time() - t0, 1)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "fp16-geglu-probe.json").write_text(json.dumps(res, indent=1))
    md = markdown(res)
    (a.out / "fp16-geglu-probe.md").write_text(md)
    print(md)
    bad = [r["case"] for r in res["cases"] if not r["fused_written"] or r["fused_rel_l2"] > 2 * r["today_rel_l2"] + 1e-3]
    if bad:
        print(f"check failed (not all written, or rel. L2 above 2x today's + 1e-3): {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
