"""export_sdxl.py --vae-only --vae FILE|DIR: a VAE folder that sdxl-batch swaps in per task ("vae" in
a batch file, --vae on the CLI): vae_decoder.ts, vae_encoder.ts and model.json (kind "vae")."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .architecture import configs_of
from .checkpoint import load_vae, vae_weights_file
from .common import Checker, Job, check_names, dtype_str, file_digests, log, publish, sha256_file, summarize_checks, \
    trace_module
from .sdxl_modules import VaeDecoderTS, VaeEncoderTS


def export(a, job: Job) -> int:
    """The VAE of --vae traced, checked against eager at two sizes, and published with its model.json."""
    dtype_name, dtype, device, out, tmp = job.dtype_name, job.dtype, job.device, job.out, job.tmp
    torch.set_grad_enabled(False)
    src = Path(a.vae).resolve()
    vae = load_vae(src, configs_of(Path(a.config).resolve() if a.config else None)["vae"], device, dtype, log)
    vae_dtype = torch.float32 if (dtype == torch.float16 and vae.config.force_upcast) else dtype
    vae.to(vae_dtype)
    down = 2 ** (len(vae.config.block_out_channels) - 1)
    chans = int(vae.config.latent_channels)
    gen = torch.Generator().manual_seed(99)
    z = torch.randn(1, chans, 11, 13, generator=gen).to(device, vae_dtype)
    img = (torch.rand(1, 3, 11 * down, 13 * down, generator=gen) * 2 - 1).to(device, vae_dtype)
    trace_module(VaeDecoderTS(vae, vae_dtype), (z,), tmp / "vae_decoder.ts")
    trace_module(VaeEncoderTS(vae, vae_dtype), (img,), tmp / "vae_encoder.ts")
    check_names(tmp / "vae_decoder.ts", VaeDecoderTS(vae, vae_dtype), device, "vae_decoder")
    check_names(tmp / "vae_encoder.ts", VaeEncoderTS(vae, vae_dtype), device, "vae_encoder")
    chk = Checker(vae_dtype, device)
    dec, enc = (torch.jit.load(str(tmp / f), map_location=device) for f in ("vae_decoder.ts", "vae_encoder.ts"))
    for (b, h, w) in ((1, 32, 32), (2, 33, 25)):
        chk.run_safe("vae_decoder.ts", dict(batch=b, width=8 * w, height=8 * h), dec, VaeDecoderTS(vae, vae_dtype),
                     (torch.randn(b, chans, h, w, generator=gen).to(device, vae_dtype),))
        chk.run_safe("vae_encoder.ts", dict(batch=b, width=8 * w, height=8 * h), enc, VaeEncoderTS(vae, vae_dtype),
                     ((torch.rand(b, 3, h * down, w * down, generator=gen) * 2 - 1).to(device, vae_dtype),))
    bad = [r for r in chk.results if not r["ok"]]
    if bad:
        raise SystemExit(f"the traced VAE does not match the eager one: {bad[0]}")
    weights = vae_weights_file(src)
    meta = {
        "format_version": 1, "kind": "vae", "name": src.stem if src.is_file() else src.name, "source": f"vae:{src}",
        "dtype": dtype_name, "vae_dtype": dtype_str(vae_dtype), "export_device": device,
        "torch_version": torch.__version__, "vae_scaling_factor": float(vae.config.scaling_factor),
        "vae_downsample": down, "latent_channels": chans,
        "vae_decoder": {"file": "vae_decoder.ts"}, "vae_encoder": {"file": "vae_encoder.ts"},
        **({"vae_file": {"name": weights.name, "sha256": sha256_file(weights)}} if weights else {}),
        "check": {"level": "quick", "modules": summarize_checks(chk.results), "notes": []},
        "files": file_digests(tmp),
    }
    (tmp / "model.json").write_text(json.dumps(meta, indent=1) + "\n")
    publish(tmp, out)
    log(f"  wrote VAE {out} (decode dtype {meta['vae_dtype']}, scaling factor {meta['vae_scaling_factor']})")
    return 0

