#!/usr/bin/env python3
"""Probe (GPU machine): one UNet step of an exported model's AOTInductor packages, as sdxl-batch runs
them, timed and profiled by kernel class (issue 44: "a kernel profile of the final step, by class").

    python3 bench/lab/2026-12-fp8-unet/aoti_step_profile.py MODEL_DIR [--packages unet_fp8.pt2,unet.pt2] [--rows 16]
        [--size 1024x1024] [--tokens 77] [--iters 20] [--out DIR]

Each package named (those the folder has) is loaded with torch._inductor.aoti_load_package and given
its TorchScript module's tensors by name as user-managed constants (unet_fp8.pt2 <- unet_fp8.ts,
unet.pt2 <- unet.ts: what src/model/aoti_package.cpp does), then called on --rows rows (CFG: two per
image) of random inputs at --size with --tokens tokens (scripts/export's unet_inputs):
  - step ms: the median of --iters calls after 3 warm-up calls, each between CUDA events
    (fp8_compile_probe.timed);
  - the kernels of two profiled calls (fp8_compile_probe.profile_kernels), summed by class, with this
    project's own Triton kernels in classes of their own (the FP8 3x3 convolution, the fused GEGLU).
On a machine without CUDA it runs the packages on the CPU (a CPU package, e.g. the tiny fixture's) and
times them without a profile: the loading and the call path, not a measurement.
Results: --out/aoti-step-profile.json and .md (and the lines on stdout).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
from fp8_compile_probe import kernel_class, profile_kernels, timed  # noqa: E402

from export.sdxl_modules import unet_inputs  # noqa: E402  (scripts/export/, the export's package)

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def step_kernel_class(name: str) -> str:
    """fp8_compile_probe's classes, with the project's own Triton kernels (scripts/export/fp8_conv.py,
    fp8_geglu.py) apart."""
    low = name.lower()
    if "conv3x3_fp8" in low:
        return "FP8 3x3 convolution (ours, Triton)"
    if "fp8_geglu" in low:
        return "FP8 GEMM + GEGLU (ours, Triton)"
    return kernel_class(name)


def load_package(model: Path, package: str, device: str):
    """The package with its TorchScript module's tensors as constants (by name, user-managed)."""
    import torch._inductor

    ts = torch.jit.load(str(model / package.replace(".pt2", ".ts")), map_location=device)
    named = dict(ts.named_parameters())
    named.update(dict(ts.named_buffers()))
    runner = torch._inductor.aoti_load_package(str(model / package))
    fqns = runner.get_constant_fqns()
    missing = [n for n in fqns if n not in named]
    if missing:
        raise SystemExit(f"{package}: constants that {package.replace('.pt2', '.ts')} lacks: {missing[:5]}")
    runner.load_constants({n: named[n].contiguous() for n in fqns}, check_full_update=True, user_managed=True)
    return runner, ts, len(fqns)


def step_times(fn, iters: int, cuda: bool) -> list[float]:
    for _ in range(3):
        fn()
    if cuda:
        torch.cuda.synchronize()
        return timed(fn, iters)
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def measure(model: Path, cfg: dict, package: str, a, device: str) -> dict:
    cuda = device == "cuda"
    runner, ts, n_constants = load_package(model, package, device)
    w, h = (int(v) for v in a.size.split("x"))
    unet = cfg["unet"]
    gen = torch.Generator().manual_seed(0)
    inp = unet_inputs(a.rows, w, h, a.tokens // 77, unet["context_dim"], unet["pooled_dim"],
                      DTYPES[cfg["dtype"]], device, gen, unet.get("in_channels", 4))

    def call():
        with torch.no_grad():
            return runner(*inp)

    times = step_times(call, a.iters, cuda)
    r = {"constants": n_constants, "rows": a.rows, "size": a.size, "tokens": a.tokens,
         "step_ms_median": round(statistics.median(times), 3), "step_ms_min": round(min(times), 3),
         "step_ms_max": round(max(times), 3)}
    if cuda:
        r["profile"] = profile_kernels(call, classify=step_kernel_class)
    del runner, ts
    return r


def markdown(res: dict) -> str:
    lines = [f"# UNet step of the packages in {res['model']}", "",
             f"{res['device']}, torch {res['torch']}; {res['args']}", ""]
    for pkg, r in res["packages"].items():
        if "error" in r:
            lines += [f"## {pkg}: {r['error']}", ""]
            continue
        lines += [f"## {pkg}: {r['step_ms_median']} ms a {r['rows']}-row step (median; min {r['step_ms_min']}, "
                  f"max {r['step_ms_max']}), {r['constants']} constants", ""]
        prof = r.get("profile")
        if prof:
            lines += [f"Kernels: {prof['kernel_ms_per_step']} ms in {prof['kernel_calls_per_step']} calls a step.", "",
                      "| class | ms a step | kernel calls |", "|---|---|---|"]
            lines += [f"| {c} | {v['ms_per_step']} | {v['kernel_calls']} |" for c, v in prof["by_class"].items()]
            lines += ["", "| top kernels | class | calls | ms a step |", "|---|---|---|---|"]
            lines += [f"| `{k['kernel'][:80]}` | {k['class']} | {k['calls']} | {k['ms_per_step']} |"
                      for k in prof["top_kernels"][:12]]
            lines.append("")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--packages", default="unet_fp8.pt2,unet.pt2")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--size", default="1024x1024")
    ap.add_argument("--tokens", type=int, default=77)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("bench/tmp/aoti-step-profile"))
    a = ap.parse_args()
    if a.tokens % 77:
        ap.error("--tokens: a multiple of 77")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = json.loads((a.model / "model.json").read_text())
    res = {"model": str(a.model), "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
           "torch": torch.__version__, "args": " ".join(sys.argv[1:]), "packages": {}}
    for pkg in a.packages.split(","):
        if not (a.model / pkg).is_file():
            print(f"{pkg}: not in {a.model}, skipped")
            continue
        try:
            res["packages"][pkg] = measure(a.model, cfg, pkg, a, device)
        except Exception as e:  # a probe: keep the other package's figures
            res["packages"][pkg] = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
        print(pkg, json.dumps({k: v for k, v in res["packages"][pkg].items() if k != "profile"}), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "aoti-step-profile.json").write_text(json.dumps(res, indent=1))
    md = markdown(res)
    (a.out / "aoti-step-profile.md").write_text(md)
    print(md)
    return 0 if res["packages"] and all("error" not in r for r in res["packages"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
