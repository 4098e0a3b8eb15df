"""export_sdxl.py --check quick|full of a model folder: every traced module against its eager
wrapper at other batch sizes, context lengths and resolutions than the trace's, the limits narrowed
where a case fails (LIMIT NARROWED), and model.json's "check"."""
from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import torch

from .common import Checker, log, summarize_checks
from .sdxl_modules import (TextEncoder2Eager, TextEncoderEager, UNetTS, VaeDecoderTS, VaeEncoderTS, attn2_downscales,
                           control_layout, control_residuals, ip_attentions, ip_kv_inputs, ip_layout, make_ids,
                           regional_inputs, regions_layout, unet_inputs)


def check_traces(a, tiny: bool, tmp: Path, pipe, dtype, d: dict, device, limits: dict, timings: dict) -> dict:
    """--check quick|full: the traces against eager over the limits (narrowing them where a
    case fails, with a note); writes --json-report; returns model.json's "check"."""
    t0 = time.time()
    chk, vchk = run_checks(a.check, tiny, tmp, pipe, dtype, d["vae_dtype"], device,
                           dict(h1=d["h1"], h2=d["h2"], pooled=d["pdim"]))
    results = chk.results + vchk.results
    timings[f"check_{a.check}"] = time.time() - t0
    summary = summarize_checks(results)
    for m, s in summary.items():
        log(f"  check {a.check:5s} {m:40s} cases {s['cases']:3d}  failed {s['failed']:2d}  max|diff| {s['max_abs_diff']:.3g}")
    notes = settle_limits(limits, results)
    for n in notes:
        log(f"  LIMIT NARROWED: {n}")
    if a.json_report:
        Path(a.json_report).write_text(json.dumps(dict(results=results, summary=summary, notes=notes), indent=1))
    return {"level": a.check, "modules": summary, "notes": notes}


def run_checks(level: str, tiny: bool, out: Path, pipe, dtype, vae_dtype, device, dims) -> tuple[Checker, Checker]:
    t0 = time.time()
    gen = torch.Generator().manual_seed(1234)
    chk = Checker(dtype, device)
    vchk = Checker(vae_dtype, device)
    h1, h2, pdim = dims["h1"], dims["h2"], dims["pooled"]
    load = lambda f: torch.jit.load(str(out / f), map_location=device)  # noqa: E731

    # text encoders: trace vs eager, and each row at batch 4 == the same ids at batch 1
    te_batches = [1, 2, 3, 4] if level == "quick" else list(range(1, 17))
    for fname, eager, pad in (
        ("text_encoder.ts", TextEncoderEager(pipe.text_encoder), 49407),
        ("text_encoder_2.ts", TextEncoder2Eager(pipe.text_encoder_2), 0),
    ):
        ts = load(fname)
        for b in te_batches:
            chk.run_safe(fname, dict(batch=b), ts, eager, (make_ids(b, pad, gen, device),))
        ids4 = make_ids(4, pad, gen, device)
        with torch.no_grad():
            full = ts(ids4)
            worst = 0.0
            for i in range(4):
                one = ts(ids4[i : i + 1])
                for a, b in zip(one, full):
                    worst = max(worst, float((a.float() - b[i : i + 1].float()).abs().max()))
        chk.results.append(dict(module=fname, batch_consistency="1 vs 4", max_abs_diff=worst,
                                ok=worst <= chk.rtol * 10))

    # UNet and VAE shapes
    odd = [(264, 200), (520, 776), (1000, 1032), (1032, 520)]  # multiples of 8 px, not of 32
    if level == "quick":
        if tiny:
            unet_cases = [(1, 256, 256, 1), (2, 264, 200, 2), (3, 256, 384, 1), (1, 1032, 264, 1)]
            vae_cases = [(1, 256, 256), (2, 264, 200), (1, 264, 520)]
        else:
            unet_cases = [(1, 1024, 1024, 1), (2, 832, 1216, 2), (3, 520, 776, 1), (2, 1000, 1032, 2)]
            vae_cases = [(1, 1024, 1024), (2, 520, 776)]
    else:
        # tiny runs on CPU (CI): sweep one dimension with the other small; the batch sweep at
        # the smallest size. The real sizes are checked on the device the model runs on.
        fixed = 256 if tiny else 1024
        sweep = list(range(512, 1536 + 1, 64))
        unet_cases = [(b, fixed, fixed, 1) for b in list(range(1, 9)) + [16]]
        unet_cases += [(2, fixed, fixed, k) for k in (1, 2, 3, 4)]
        unet_cases += [(1, w, fixed, 1) for w in sweep] + [(1, fixed, h, 1) for h in sweep]
        unet_cases += [(2, w, h, 2) for (w, h) in odd] + [(1, 1536, 1536, 1), (1, 256, 256, 1)]
        vae_cases = [(b, fixed, fixed) for b in range(1, 9)]
        vae_cases += [(1, w, fixed) for w in sweep] + [(1, fixed, h) for h in sweep]
        vae_cases += [(1, w, h) for (w, h) in odd] + [(1, 256, 256)] + ([] if tiny else [(1, 1536, 1536)])

    log(f"  checked text encoders ({time.time() - t0:.1f}s)")
    control_cases = unet_cases if level == "quick" else unet_cases[::4]
    check_unet(chk, load("unet.ts"), pipe.unet, unet_cases, control_cases, h1 + h2, pdim, gen)
    # quick: one case of batch 2, 2 chunks and a size that is not a multiple of 32 (the widest test of a shape).
    regional_cases = [max(control_cases, key=lambda c: (c[0] > 1, c[3] > 1, c[1] % 32 > 0))] if level == "quick" \
        else control_cases
    # A generator of their own: the VAE cases below draw what they drew before the regional methods.
    check_unet_regional(chk, load("unet.ts"), pipe.unet, regional_cases, h1 + h2, pdim,
                        torch.Generator().manual_seed(59))
    log(f"  checked unet: {len(unet_cases)} shapes, forward_control / forward_ip / forward_control_ip "
        f"{len(control_cases)}, forward_regional* {len(regional_cases)} ({time.time() - t0:.1f}s)")

    vae = pipe.vae
    dec_ts, dec_e = load("vae_decoder.ts"), VaeDecoderTS(vae, vae_dtype)
    enc_ts, enc_e = load("vae_encoder.ts"), VaeEncoderTS(vae, vae_dtype)
    for (b, w, h) in vae_cases:
        z = torch.randn(b, 4, h // 8, w // 8, generator=gen).to(device, vae_dtype)
        vchk.run_safe("vae_decoder.ts", dict(batch=b, width=w, height=h), dec_ts, dec_e, (z,))
        img = (torch.rand(b, 3, h, w, generator=gen) * 2 - 1).to(device, vae_dtype)
        vchk.run_safe("vae_encoder.ts", dict(batch=b, width=w, height=h), enc_ts, enc_e, (img,))
    log(f"  checked vae decoder + encoder: {len(vae_cases)} shapes each ({time.time() - t0:.1f}s)")
    return chk, vchk


def check_unet(chk: Checker, ts, unet, unet_cases: list, control_cases: list, ctx_dim: int, pdim: int, gen) -> None:
    """unet.ts vs the same wrapper run eagerly: forward at every case; forward_control, forward_ip and
    forward_control_ip at the control cases (random residuals; random ip_kv of 4 and 16 tokens, in turn);
    and forward_ip with v = 0 (it adds exact zeros) == forward, bit for bit."""
    dtype, device = chk.dtype, chk.device
    eager = UNetTS(unet, dtype)
    layout, ip = control_layout(unet.config), ip_layout(unet)
    n_ip = 0
    for (b, w, h, k) in unet_cases:
        inp = unet_inputs(b, w, h, k, ctx_dim, pdim, dtype, device, gen, unet.config.in_channels)
        key = dict(batch=b, width=w, height=h, chunks=k)
        got = chk.run_safe("unet.ts", key, ts, eager, inp)
        if (b, w, h, k) not in control_cases:
            continue
        res = control_residuals(layout, b, h // 8, w // 8, dtype, device, gen)
        chk.run_safe("unet.ts forward_control", key, ts.forward_control, eager.forward_control, inp + (res,))
        kv = ip_kv_inputs(ip, b, 4 if n_ip % 2 == 0 else 16, dtype, device, gen)
        key_ip = dict(key, tokens=kv[0].shape[1])
        chk.run_safe("unet.ts forward_ip", key_ip, ts.forward_ip, eager.forward_ip, inp + (kv,))
        chk.run_safe("unet.ts forward_control_ip", key_ip, ts.forward_control_ip, eager.forward_control_ip,
                     inp + (res, kv))
        if n_ip == 0 and got is not None:
            zero = ip_kv_inputs(ip, b, 4, dtype, device, gen, v_zero=True)
            with torch.no_grad():
                d = float((ts.forward_ip(*inp, zero).float() - got[0].float()).abs().max())
            chk.results.append(dict(module="unet.ts forward_ip (v = 0) vs forward", **key, max_abs_diff=d, ok=d == 0.0))
        n_ip += 1


class FormulaAttnProcessor:
    """The regional formula written out for the checks, one prompt and one image group at a time:
    to_out(sum_r w_r * sdpa(q, K_r, V_r) + sum_m mask_m * sdpa(q, k_m, v_m)) (no vectorising over R or M,
    unlike sdxl_modules.RegionalAttnProcessor, which the traced methods use)."""

    def __init__(self, contexts, weights, ip):
        self.contexts, self.weights, self.ip = contexts, weights, ip

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, *a, **kw):
        sdpa = torch.nn.functional.scaled_dot_product_attention
        b = hidden_states.shape[0]
        q = attn.to_q(hidden_states)
        d = q.shape[-1] // attn.heads
        heads = lambda x: x.reshape(b, -1, attn.heads, d).transpose(1, 2)  # noqa: E731
        q = heads(q)
        out = 0
        for r in range(self.contexts.shape[1]):
            o = sdpa(q, heads(attn.to_k(self.contexts[:, r])), heads(attn.to_v(self.contexts[:, r])))
            out = out + self.weights[:, r, :, None] * o.transpose(1, 2).reshape(b, -1, attn.heads * d)
        if self.ip is not None:
            k, v, masks = self.ip
            for m in range(k.shape[1]):
                o = sdpa(q, heads(k[:, m]), heads(v[:, m]))
                out = out + masks[:, m, :, None] * o.transpose(1, 2).reshape(b, -1, attn.heads * d)
        out = attn.to_out[1](attn.to_out[0](out))
        return (out + hidden_states if attn.residual_connection else out) / attn.rescale_output_factor


@contextlib.contextmanager
def formula_processors(unet, contexts, weights: tuple, ip_kv: tuple | None, ip_masks: tuple | None):
    """FormulaAttnProcessor on every cross-attention layer, each given the weights and masks of
    its block's downscale (attn2_downscales), for one call; the processors are put back after."""
    layers = ip_attentions(unet)
    scales = sorted(set(attn2_downscales(unet)))
    saved = [m.processor for _, m in layers]
    try:
        for i, ((_, m), ds) in enumerate(zip(layers, attn2_downscales(unet))):
            j = scales.index(ds)
            ip = None if ip_kv is None else (ip_kv[2 * i], ip_kv[2 * i + 1], ip_masks[j])
            m.set_processor(FormulaAttnProcessor(contexts, weights[j], ip))
        yield
    finally:
        for (_, m), proc in zip(layers, saved):
            m.set_processor(proc)


def check_unet_regional(chk: Checker, ts, unet, cases: list, ctx_dim: int, pdim: int, gen) -> None:
    """unet.ts forward_regional* at each case: with R = 1 and weights all ones == forward (eager); with
    R prompts and M image groups (3 and 2; forward_regional_ip 2 and 1, other counts than the trace's) ==
    the formula evaluated eagerly (FormulaAttnProcessor), with random normalised weights, masks and residuals."""
    dtype, device = chk.dtype, chk.device
    eager = UNetTS(unet, dtype)
    layout, ip, regions = control_layout(unet.config), ip_layout(unet), regions_layout(unet, 1)
    for (b, w, h, k) in cases:
        inp = unet_inputs(b, w, h, k, ctx_dim, pdim, dtype, device, gen, unet.config.in_channels)
        key = dict(batch=b, width=w, height=h, chunks=k)
        ctx, weights, _, _ = regional_inputs(regions, ip, b, 1, 1, h // 8, w // 8, k, ctx_dim, dtype, device, gen)
        ones = tuple(torch.ones_like(t) for t in weights)
        chk.run_safe("unet.ts forward_regional (R = 1) vs forward", key,
                     lambda *x: ts.forward_regional(*x[:2], x[2][:, None], *x[3:], ones), eager, inp)
        res = control_residuals(layout, b, h // 8, w // 8, dtype, device, gen)
        for name, r, m in (("forward_regional", 3, 0), ("forward_regional_control", 3, 0),
                           ("forward_regional_ip", 2, 1), ("forward_regional_control_ip", 3, 2)):
            ctx, weights, kv, masks = regional_inputs(regions, ip, b, r, max(m, 1), h // 8, w // 8, k, ctx_dim, dtype,
                                                      device, gen)
            control = "control" in name
            res_args, ip_args = (res,) if control else (), (kv, masks) if m else ()
            method = eager.forward_control if control else eager.forward

            def formula():  # run at once by run_safe, within this iteration
                with formula_processors(unet, ctx, weights, kv if m else None, masks if m else None):
                    return method(*inp[:2], ctx[:, 0], *inp[3:], *res_args)  # noqa: B023

            def traced():
                return getattr(ts, name)(*inp[:2], ctx, *inp[3:], weights, *res_args, *ip_args)  # noqa: B023

            chk.run_safe(f"unet.ts {name} vs formula", dict(key, regions=r, groups=m), traced, formula, ())


def settle_limits(limits: dict, results: list[dict]) -> list[str]:
    """Narrow limits where a shape failed; return notes."""
    notes = []
    bad = [r for r in results if not r["ok"]]
    if not bad:
        return notes
    for r in bad:
        if r["module"].startswith("text_encoder"):
            raise SystemExit(f"text encoder check failed: {r}")
    sized = [r for r in bad if "width" in r]
    if any(r["width"] % 32 or r["height"] % 32 for r in sized) and not any(
        r["width"] % 32 == 0 and r["height"] % 32 == 0 for r in sized
    ):
        limits["size_multiple"] = 32 if not any(r["width"] % 64 == 0 and r["height"] % 64 == 0 for r in sized) else 64
        notes.append(f"sizes not multiple of 32 px failed -> size_multiple {limits['size_multiple']}")
        sized = [r for r in sized if r["width"] % 32 == 0 and r["height"] % 32 == 0]
    for r in sized:
        if r.get("batch", 1) > 1 and r["width"] == r["height"]:
            limits["batch_max"] = min(limits["batch_max"],
                                      max(1, (r["batch"] - 1) // (2 if r["module"].startswith("unet.ts") else 1)))
            notes.append(f"{r['module']} failed at batch {r['batch']} -> batch_max {limits['batch_max']}")
        else:
            for dim in ("width", "height"):
                if r[dim] > 1024:
                    limits[f"{dim}_max"] = min(limits[f"{dim}_max"], r[dim] - limits["size_multiple"])
                elif r[dim] < 1024:
                    limits[f"{dim}_min"] = max(limits[f"{dim}_min"], r[dim] + limits["size_multiple"])
            notes.append(f"{r['module']} failed at {r['width']}x{r['height']}: {r.get('error', 'diff too large')}")
    return notes

