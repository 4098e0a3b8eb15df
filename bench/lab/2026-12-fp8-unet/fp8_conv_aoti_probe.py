#!/usr/bin/env python3
"""Probe (GPU machine), issue 44: where does the FP8 convolution package fault at 16 rows?

The full UNet's package with `--fp8-conv` ran at 1-2 rows and faulted at 16 (illegal memory access,
bench/lab/2026-12-fp8-unet/results/2026-12-04-fp8-conv-e2e-h200.md). This probe takes each distinct (Cin, Cout, stride,
H, W) of the convolutions --fp8-conv quantises at 1024x1024 (found by forward hooks on the full UNet on
the meta device), one Fp8Conv2d per shape with random weights, and runs them

  eager  the op eagerly (the kernels the export's calibration ran), at --rows rows each;
  aoti   one module holding every shape, exported with a dynamic row count (1..16, example 2 rows as
         export_sdxl.py's UNet export), compiled by aoti_compile_and_package inside
         scripts/export/aoti.py's grid_sized_scratch (as the export compiles) and run at 1, 2 and 16 rows;
  aoti-nofix  the same, compiled without grid_sized_scratch (torch 2.11's own scratch size).

Each output is compared with conv_reference in fp32 (relative L2) and checked finite. Each mode runs
in its own process (a fault poisons the CUDA context), with CUDA_LAUNCH_BLOCKING=1 so that a fault
names its kernel. SDXL_FP8_CONV_KERNEL=ptr (environment) forces the pointer kernel, as the export does.

    python3 bench/lab/2026-12-fp8-unet/fp8_conv_aoti_probe.py --out DIR [--modes eager,aoti] [--rows 16]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch._inductor

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "scripts"))
from export import fp8_conv as C  # noqa: E402
from export.aoti import grid_sized_scratch  # noqa: E402
from export.aoti_toolchain import use_shared_libstdcxx  # noqa: E402
from export.architecture import architecture  # noqa: E402


def conv_shapes() -> list[tuple[int, int, int, int, int]]:
    """(Cin, Cout, stride, H, W) of every convolution --fp8-conv quantises, at 1024x1024, distinct."""
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        unet = UNet2DConditionModel(**architecture("full")["unet"])
    names = set(C.fp8_conv_names(unet))
    seen: dict[tuple, None] = {}

    def hook(mod, args):
        x = args[0]
        seen[(mod.in_channels, mod.out_channels, mod.stride[0], x.shape[2], x.shape[3])] = None

    for n, m in unet.named_modules():
        if n in names:
            m.register_forward_pre_hook(hook)
    with torch.device("meta"), torch.no_grad():
        unet(torch.empty(1, 4, 128, 128), torch.empty(1), torch.empty(1, 77, 2048),
             added_cond_kwargs={"text_embeds": torch.empty(1, 1280), "time_ids": torch.empty(1, 6)})
    return list(seen)


class Many(torch.nn.Module):
    def __init__(self, shapes, gen):
        super().__init__()
        convs = []
        for ci, co, st, _, _ in shapes:
            conv = torch.nn.Conv2d(ci, co, 3, st, 1).cuda().half()
            with torch.no_grad():
                conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen) / (9 * ci) ** 0.5)
            convs.append(C.Fp8Conv2d.from_conv(conv, 4.0))
        self.convs = torch.nn.ModuleList(convs)

    def forward(self, *xs):
        return tuple(c(x) for c, x in zip(self.convs, xs))


def inputs(shapes, rows, gen):
    return tuple((torch.randn(rows, ci, h, w, generator=gen) * 1.5).clamp(-4, 4).cuda().half()
                 for ci, _, _, h, w in shapes)


def compare(model, shapes, xs, outs) -> list[dict]:
    rows = []
    for conv, shape, x, y in zip(model.convs, shapes, xs, outs):
        x8 = C.quantize_tensor(x.permute(0, 2, 3, 1), conv.input_scale).contiguous()
        ref = C.conv_reference(x8, conv.input_scale, conv.weight.permute(0, 2, 3, 1).contiguous(),
                               conv.weight_scale.reshape(-1), conv.bias, conv.stride).permute(0, 3, 1, 2)
        e = float((y.float() - ref.float()).norm() / ref.float().norm())
        rows.append({"shape": shape, "kernel": C.kernel_choice(shape[0], shape[1], shape[2], shape[4])[0],
                     "finite": bool(torch.isfinite(y).all()), "rel_l2": e})
    return rows


def run_mode(mode: str, rows_list: list[int], out: Path) -> dict:
    gen = torch.Generator().manual_seed(0)
    shapes = conv_shapes()
    model = Many(shapes, gen).eval()
    res: dict = {"mode": mode, "kernel_env": os.environ.get("SDXL_FP8_CONV_KERNEL", ""), "runs": []}
    fn = model
    if mode.startswith("aoti"):
        rows = torch.export.Dim("rows", min=1, max=16)
        ex = inputs(shapes, 2, gen)
        t0 = time.time()
        use_shared_libstdcxx()  # as the export links its packages (else a second libstdc++ crashes the load)
        fix = grid_sized_scratch() if mode == "aoti" else contextlib.nullcontext()
        with torch.no_grad(), fix:
            ep = torch.export.export(model, ex, dynamic_shapes=(tuple({0: rows} for _ in ex),), strict=False)
            pkg = torch._inductor.aoti_compile_and_package(  # 0-dim scales stay tensors, as the export keeps them
                ep, package_path=f"/tmp/fp8-conv-probe-{mode}.pt2", inductor_configs={"always_keep_tensor_constants": True})
        res["compile_s"] = round(time.time() - t0, 1)
        fn = torch._inductor.aoti_load_package(pkg)
        print(f"compiled in {res['compile_s']} s, loaded", flush=True)
    for r in rows_list:
        xs = inputs(shapes, r, gen)
        with torch.no_grad():
            ys = fn(*xs)
            torch.cuda.synchronize()
            res["runs"].append({"rows": r, "convs": compare(model, shapes, xs, ys)})
        print(json.dumps(res["runs"][-1]), flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--modes", default="eager,aoti-nofix,aoti")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.child:
        rows = [a.rows] if a.child == "eager" else [1, 2, a.rows]
        res = run_mode(a.child, rows, a.out)
        tag = a.child + ("-" + res["kernel_env"] if res["kernel_env"] else "")
        (a.out / f"fp8-conv-{tag}.json").write_text(json.dumps(res, indent=1) + "\n")
        return 0
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    rc = 0
    for mode in a.modes.split(","):
        t0 = time.time()
        p = subprocess.run([sys.executable, __file__, "--out", str(a.out), "--rows", str(a.rows), "--child", mode],
                           env=env, capture_output=True, text=True)
        print(f"== {mode} (kernel env {env.get('SDXL_FP8_CONV_KERNEL', 'default')}): exit {p.returncode}, "
              f"{time.time() - t0:.0f} s")
        print(p.stdout[-6000:])
        if p.returncode:
            print(p.stderr[-4000:])
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
