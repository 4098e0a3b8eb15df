"""export_sdxl.py --aoti: the UNet (unet.pt2, unet_fp8.pt2) and the VAE decoder (vae_decoder.pt2)
compiled by torch.export + AOTInductor without their weights (sdxl-batch hands them the TorchScript
modules' tensors), each checked against its eager module; what model.json records of a package
(docs/models-and-export.md#aotinductor-unet)."""
from __future__ import annotations

import contextlib
import copy
import time
from pathlib import Path

import torch

from .aoti_toolchain import use_shared_libstdcxx
from .common import dtype_str, log
from .sdxl_modules import UNetTS, VaeDecoderTS, unet_inputs


@contextlib.contextmanager
def upsample_to_skip_size(unet):
    """diffusers picks the up-sampler path with `any(dim % 2**num_upsamplers)` on the latent
    size; under torch.export with a dynamic size that is a guard no size range satisfies.
    A factor no latent size can be a multiple of makes it always take the
    forward_upsample_size path -- the one unet.ts was traced on (see the module docstring),
    which interpolates to each skip connection's size."""
    n = unet.num_upsamplers
    unet.num_upsamplers = 40  # 2**40: no latent size in the limits is a multiple of it
    try:
        yield
    finally:
        unet.num_upsamplers = n


@contextlib.contextmanager
def grid_sized_scratch():
    """Inside: AOTInductor's C++ wrapper gives a Triton kernel global scratch of its per-program size
    times the launch grid, as Triton's own launcher does (triton/backends/nvidia/driver.py). torch
    2.11's wrapper allocates the per-program size once, so a kernel that builds tensor descriptors on
    the device (scripts/export/fp8_conv.py's tma kernels) writes past its scratch at any grid beyond one
    program: NaN outputs, and an illegal memory access once the grid is large (16 rows at 1024x1024;
    bench/lab/2026-12-fp8-unet/fp8_conv_aoti_probe.py). The generated code computes grid_0..2 just before it
    declares the launch's arguments, so the size can name them."""
    from torch._inductor.codegen.cuda import device_op_overrides as d

    original = d.CUDADeviceOpOverrides.cpp_scratch

    def per_program(self, idx, workspace, prefix=None):
        made = original(self, idx, workspace, prefix)
        if made is None or workspace.size <= 0:
            return made
        lines, var = made
        old = f"_size[] = {{{workspace.size}}};"
        new = f"_size[] = {{static_cast<int64_t>({workspace.size}) * grid_0 * grid_1 * grid_2}};"
        if not any(old in line for line in lines):
            raise RuntimeError(f"grid_sized_scratch: the wrapper's scratch code changed: {lines}")
        return [line.replace(old, new) for line in lines], var

    d.CUDADeviceOpOverrides.cpp_scratch = per_program
    try:
        yield
    finally:
        d.CUDADeviceOpOverrides.cpp_scratch = original


def parse_aoti_size(text: str | None, limits: dict, vae_down: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Latent (height, width) ranges: the model's limits, or one fixed WxH in pixels."""
    if not text or text == "dynamic":
        return ((limits["height_min"] // vae_down, limits["height_max"] // vae_down),
                (limits["width_min"] // vae_down, limits["width_max"] // vae_down))
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--aoti-size: '{text}' is not 'dynamic' or WIDTHxHEIGHT in pixels (e.g. 1024x1024)")
    for name, v, lo, hi in (("width", w, limits["width_min"], limits["width_max"]),
                            ("height", h, limits["height_min"], limits["height_max"])):
        if v % limits["size_multiple"] or not lo <= v <= hi:
            raise SystemExit(f"--aoti-size: {name} {v} must be a multiple of {limits['size_multiple']} "
                             f"in [{lo}, {hi}] (the model's limits)")
    return ((h // vae_down, h // vae_down), (w // vae_down, w // vae_down))


def parse_inductor_configs(items: list[str]) -> dict:
    """--aoti-config KEY=VALUE (VALUE as a Python literal, else a string)."""
    import ast

    cfg = {}
    for it in items:
        if "=" not in it:
            raise SystemExit(f"--aoti-config: '{it}' is not KEY=VALUE")
        k, v = it.split("=", 1)
        try:
            cfg[k.strip()] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            cfg[k.strip()] = v
    return cfg


def unet_channels(unet) -> int:
    """The UNet's in_channels (9 for an inpainting UNet)."""
    return int(unet.config.in_channels)


def export_unet_aoti(unet, dtype, device: str, out_dir: Path, limits: dict, vae_down: int, ctx_dim: int,
                     pdim: int, size: str | None, extra_configs: dict, gen: torch.Generator,
                     file: str = "unet.pt2", fp16_reference: torch.nn.Module | None = None) -> dict:
    """torch.export the UNet wrapper with a dynamic batch (1 .. 2*batch_max rows: CFG doubles
    them), context length (77 .. 77*context_chunks_max tokens) and latent size (the limits, or
    one fixed size), compile it with AOTInductor into out_dir/unet.pt2 without its weights,
    and return what model.json records under unet.aoti (`file`: unet.pt2, or unet_fp8.pt2
    for the FP8 UNet). The package must match the eager wrapper at the range's corners within
    the dtype's max-abs tolerance; the FP8 UNet (fp16_reference: the UNet before quantisation)
    instead must be as near to the fp16 UNet as the eager FP8 UNet is (relative L2 within 1.5x
    of the eager one's): its input quantisation turns a fused kernel's different rounding into
    whole FP8 levels (measured on the H200: compiled vs eager FP8 rel. L2 0.025, eager FP8 vs
    fp16 0.039), so the two FP8 UNets are two roundings of one model, not one the other's copy."""
    import torch._inductor

    (h_lo, h_hi), (w_lo, w_hi) = parse_aoti_size(size, limits, vae_down)
    rows_max = 2 * limits["batch_max"]
    tok_max = 77 * limits["context_chunks_max"]
    # Example: batch 2, two chunks, a latent size inside the range that is not a multiple of 4
    # (sizes equal to a bound of a range, or to 1, would be specialised by export).
    def example(lo, hi):
        if lo == hi:
            return lo
        v = min(lo + 1, hi)
        return v + 1 if v % 4 == 0 and v + 1 <= hi else v
    lh, lw = example(h_lo, h_hi), example(w_lo, w_hi)
    k = 2 if tok_max >= 154 else 1
    inp = unet_inputs(2, lw * vae_down, lh * vae_down, k, ctx_dim, pdim, dtype, device, gen,
                      unet_channels(unet))
    Dim = torch.export.Dim
    rows = Dim("rows", min=1, max=rows_max)
    tokens = Dim("tokens", min=77, max=tok_max) if tok_max > 77 else None
    hd = Dim("latent_h", min=h_lo, max=h_hi) if h_hi > h_lo else None
    wd = Dim("latent_w", min=w_lo, max=w_hi) if w_hi > w_lo else None
    dynamic = tuple({i: d for i, d in dims.items() if d is not None}
                    for dims in ({0: rows, 2: hd, 3: wd}, {0: rows}, {0: rows, 1: tokens}, {0: rows}, {0: rows}))
    wrapper = UNetTS(unet, dtype).eval()
    t0 = time.time()
    with upsample_to_skip_size(unet), torch.no_grad():
        ep = torch.export.export(wrapper, inp, dynamic_shapes=dynamic, strict=False)
    t_export = time.time() - t0
    log(f"  torch.export unet: {t_export:.1f}s (rows 1..{rows_max}, tokens 77..{tok_max}, "
        f"latent {h_lo}..{h_hi} x {w_lo}..{w_hi})")
    configs = dict(extra_configs)
    pkg, t_compile, configs, cxx_wrapper = compile_package(ep, out_dir / file, configs)

    corners = {(1, h_lo, w_lo, 1), (2, lh, lw, k), (rows_max, h_lo, w_lo, 1), (1, h_hi, w_hi, tok_max // 77)}
    inputs = {(b, hh, ww, kk): unet_inputs(b, ww * vae_down, hh * vae_down, kk, ctx_dim, pdim, dtype,
                                                   device, gen, unet_channels(unet))
              for (b, hh, ww, kk) in corners}
    n_constants, checks = check_aoti_package(pkg, file, wrapper, inputs, dtype, fp16_reference)
    if not all(c["ok"] for c in checks):
        raise SystemExit(f"{file} does not match the eager UNet (see the check lines above)")
    ranges = {"rows": [1, rows_max], "tokens": [77, tok_max], "latent_height": [h_lo, h_hi],
              "latent_width": [w_lo, w_hi]}
    return package_meta(file, device, dtype, ranges, n_constants, configs,
                        {"export": round(t_export, 1), "compile": round(t_compile, 1)}, checks, cxx_wrapper)


def compile_package(ep, path: Path, configs: dict) -> tuple[str, float, dict, bool]:
    """aoti_compile_and_package of exported program `ep` into `path`, without its weights
    (sdxl-batch hands it the TorchScript module's tensors) and with `configs`; returns the
    package's path, the compile seconds, the Inductor configs used and whether the C++ code
    was linked through the shared-libstdc++ wrapper."""
    import torch._inductor

    # always_keep_tensor_constants: every parameter and buffer stays a constant that sdxl-batch hands
    # the package (user-managed weights). Without it Inductor inlines some small tensors into the code:
    # 0-dim ones (the FP8 scales), after which an extern kernel (_scaled_mm) needs each as a new tensor
    # constant that no weights file provides (the H200 load check refused unet_fp8.pt2), and others
    # (15 of the tiny VAE decoder's 106: its last biases and norms; 1 of the tiny UNet's 328), which
    # then keep the exporting model's values: a LoRA could not patch them, and a VAE folder would
    # decode with the model's (sdxl-batch checks for such packages: image/vae_decode.cpp).
    configs = {"aot_inductor.package_constants_in_so": False, "always_keep_tensor_constants": True, **configs}
    # A compiler with only a static libstdc++ would put a second copy into the .so,
    # which then crashes at load (export/aoti_toolchain.py says why).
    cxx_wrapper = use_shared_libstdcxx(log=lambda m: log("  " + m))
    t0 = time.time()
    with grid_sized_scratch():
        pkg = torch._inductor.aoti_compile_and_package(ep, package_path=str(path), inductor_configs=configs)
    t_compile = time.time() - t0
    log(f"  aoti_compile_and_package {path.name}: {t_compile:.1f}s, {Path(pkg).stat().st_size / 2**20:.1f} MiB "
        f"(weights not included)")
    return pkg, t_compile, configs, bool(cxx_wrapper)


def package_meta(file: str, device: str, dtype, ranges: dict, n_constants: int, configs: dict, seconds: dict,
                 checks: list, cxx_wrapper: bool) -> dict:
    """What model.json records of an AOTI package (docs/models-and-export.md)."""
    return {
        "file": file,
        "device": device,
        **({"gpu": torch.cuda.get_device_name(torch.device(device)),
            "capability": "{}.{}".format(*torch.cuda.get_device_capability(torch.device(device)))}
           if device.startswith("cuda") else {}),
        "dtype": dtype_str(dtype),
        **ranges,
        "constants": n_constants,
        "inductor_configs": {k: repr(v) if not isinstance(v, (bool, int, float, str)) else v
                             for k, v in configs.items()},
        "seconds": seconds,
        "checks": checks,
        "libstdcxx": "shared (linked through a wrapper)" if cxx_wrapper else "the compiler's default",
    }


def export_vae_decoder_aoti(vae, dtype, device: str, out_dir: Path, size: str | None, limits: dict, vae_down: int,
                            default_size: tuple[int, int], extra_configs: dict, gen: torch.Generator) -> dict | None:
    """torch.export the VAE decoder wrapper in `dtype` (the model's compute dtype, which
    sdxl-batch decodes in on a GPU) for one image of one size: --aoti-size when it is fixed,
    else the model's default (width, height): a package for one size decodes faster than one
    for any size (docs/models-and-export.md#aotinductor-vae-decoder), and a night's images
    mostly share one. Compiles it into out_dir/vae_decoder.pt2 without weights (its constants are
    vae_decoder.ts's tensors, cast to `dtype` by sdxl-batch) and checks it against the eager
    decoder within the dtype's tolerance. Returns model.json's vae_decoder.aoti, or None
    (the package deleted, the export goes on without it) when the check fails."""
    if size and size != "dynamic":
        (lh, _), (lw, _) = parse_aoti_size(size, limits, vae_down)
    else:
        lh, lw = default_size[1] // vae_down, default_size[0] // vae_down
    dec = VaeDecoderTS(copy.deepcopy(vae).to(dtype), dtype).eval()
    z = torch.randn(1, vae.config.latent_channels, lh, lw, generator=gen).to(device, dtype)
    t0 = time.time()
    with torch.no_grad():
        ep = torch.export.export(dec, (z,), strict=False)
    t_export = time.time() - t0
    log(f"  torch.export vae_decoder: {t_export:.1f}s (latent {lh}x{lw}, images {lw * vae_down}x{lh * vae_down})")
    pkg, t_compile, configs, cxx_wrapper = compile_package(ep, out_dir / "vae_decoder.pt2", dict(extra_configs))
    n_constants, checks = check_aoti_package(pkg, "vae_decoder.pt2", dec, {(1, lh, lw, 0): (z,)}, dtype, None)
    if not all(c["ok"] for c in checks):
        log("  vae_decoder.pt2 does not match the eager decoder (see the check line above): not kept; "
            "sdxl-batch decodes with vae_decoder.ts")
        (out_dir / "vae_decoder.pt2").unlink()
        return None
    ranges = {"rows": [1, 1], "latent_height": [lh, lh], "latent_width": [lw, lw]}
    return package_meta("vae_decoder.pt2", device, dtype, ranges, n_constants, configs,
                        {"export": round(t_export, 1), "compile": round(t_compile, 1)}, checks, cxx_wrapper)


def package_check_row(got: torch.Tensor, want: torch.Tensor, ref16: torch.Tensor | None, dtype) -> dict:
    """One corner of an AOTI package's check: its output `got` against the eager wrapper's
    `want`. Without ref16: max |diff| within the dtype's tolerance (1e-4 fp32, 2e-2 otherwise,
    of max(1, |want|)). With ref16 (the FP8 package; the fp16 UNet's output): as near to it as
    the eager FP8 UNet is, relative L2 within 1.5x + 0.002 (export_unet_aoti says why)."""
    got, want = got.float(), want.float()
    diff = got - want
    row = dict(max_abs_diff=float(diff.abs().max()), rel_l2=float(diff.norm() / want.norm().clamp_min(1e-12)),
               ref_abs_max=float(want.abs().max()))
    if ref16 is None:
        rtol = 1e-4 if dtype == torch.float32 else 2e-2
        close = row["max_abs_diff"] <= rtol * max(1.0, row["ref_abs_max"])
    else:
        n16 = ref16.float().norm().clamp_min(1e-12)
        row["rel_l2_vs_fp16"] = float((got - ref16.float()).norm() / n16)
        row["eager_rel_l2_vs_fp16"] = float((want - ref16.float()).norm() / n16)
        close = row["rel_l2_vs_fp16"] <= 1.5 * row["eager_rel_l2_vs_fp16"] + 2e-3
    row["ok"] = bool(torch.isfinite(got).all()) and close
    return row


def check_aoti_package(pkg: str, file: str, wrapper, inputs: dict, dtype,
                       fp16_reference: torch.nn.Module | None) -> tuple[int, list[dict]]:
    """Loads the package as sdxl-batch does (constants = the wrapper's own parameters and
    buffers, user-managed) and checks it on each of `inputs` ({(rows, latent_h, latent_w,
    chunks): UNet inputs}) with package_check_row; returns (constants, rows)."""
    log(f"  loading {file} (aoti_load_package) for its check")
    runner = torch._inductor.aoti_load_package(pkg)
    params = dict(wrapper.named_parameters())
    params.update(dict(wrapper.named_buffers()))
    fqns = set(runner.get_constant_fqns())
    if not fqns <= set(params):
        raise SystemExit(f"{file}: constants that are no parameter of the UNet: {sorted(fqns - set(params))[:5]}")
    runner.load_constants({n: params[n] for n in fqns}, check_full_update=True, user_managed=True)
    checks = []
    for (b, hh, ww, kk), x in inputs.items():
        with torch.no_grad():
            got = runner(*x)
            got = got[0] if isinstance(got, (list, tuple)) else got
            want = wrapper(*x)
            ref16 = fp16_reference(*x) if fp16_reference is not None else None
        row = dict(rows=b, latent_h=hh, latent_w=ww, **({"tokens": 77 * kk} if kk else {}),
                   **package_check_row(got, want, ref16, dtype))
        checks.append(row)
        vs16 = (f"; vs the fp16 UNet {row['rel_l2_vs_fp16']:.3g} (eager FP8 {row['eager_rel_l2_vs_fp16']:.3g})"
                if ref16 is not None else "")
        log(f"  check {file} rows {b:2d} latent {hh}x{ww}{f' tokens {77 * kk}' if kk else ''}: "
            f"max|diff| {row['max_abs_diff']:.3g} "
            f"(|ref| {row['ref_abs_max']:.3g}), rel. L2 {row['rel_l2']:.3g}{vs16} {'ok' if row['ok'] else 'FAILED'}")
    del runner
    return len(fqns), checks

