#!/usr/bin/env python3
"""Probe (GPU machine): what would computing the cross-attention keys and values once per image-batch,
instead of at every sampler step, save? (issue 44, item 3)

Each of SDXL's 70 transformer blocks has a cross-attention (attn2) whose to_k and to_v project the text
context ([rows, tokens, 2048], the same at all 28 steps) at every UNet call: 140 fp16 GEMMs a step (fp16
in the FP8 UNet too: fp8_quant.fp8_layer_names leaves attn2's to_k / to_v exact). The change would give
the UNet the keys and values instead of the context. Here, with the full-size SDXL UNet and random
weights (fp16, cuda; the tiny architecture on the CPU for --smoke-cpu), --rows rows (CFG: 2 per image)
at 1024²:
  fp16      the UNet as diffusers builds it (context in, attn2 projects it);
  fp16-kv   the same weights, each attn2's to_k / to_v replaced by KVSlice: the UNet is called with the
            packed keys and values of all 70 attn2 ([rows, tokens, 166,400], kv_precompute: one GEMM of
            the context by the 140 weights concatenated) in place of the context, and each to_k / to_v
            hands its attention its own columns of it (a strided view: no copy); the attention
            processor (diffusers' AttnProcessor2_0) is untouched, so the math is the same;
  fp8       the fp16 UNet with the layers export_sdxl.py --fp8 quantises (fp8_quant, input scales from
            one forward pass on the same inputs: the speed does not depend on their values);
  fp8-kv    fp8 with KVSlice, as fp16-kv.
Each compiled with torch.compile (mode default, static shapes; --dynamic-tokens: the token dimension
dynamic, compiled once for every --tokens count, as the AOTInductor packages are), a precision's pair
at a time, FP8 first: both compiled (the first call, timed) and timed, then --rounds rounds in which
the two run --iters calls in turn (the order swapped each round: a drift of the GPU's clock falls on
both alike); the pair's saving is from those rounds (the per-round differences too, for the spread),
then each one's kernel time by class (fp8_compile_probe.profile_kernels, two profiled calls: where
the saving is, and that the attention on the strided K/V views ran no slower). Timing: CUDA events
around each call, the calls queued back to back (the GPU's time, as under sdxl-batch's CUDA graphs,
not the host's launches). Per token count also: the precompute (the packed GEMM, eager; once per
image-batch) and the 140 projections one by one (eager, and replayed as one CUDA graph: the
cross-check of what a step spends on them). Outputs: each -kv variant against its plain one, eager
(before compiling) and compiled, relative L2 (must be tiny: the same math, only the GEMMs' rounding
differs; checked < REL_L2_MAX); fp8 against fp16 for scale.

Saved per image = (plain step - kv step) x --steps / (rows / 2) - precompute / (rows / 2). The decision
it feeds (docs/gpu-benchmarks.md): build the cached keys and values into the export and the C++
sampler if the saving is worth it (about 1 % of the FP8 step or more).

--deadline-s: no compile starts that its estimate (the longest compile so far; a -kv variant's: its plain
one's, whose Triton kernels it reuses from Inductor's cache) would run past it, nor rounds, profiles or
the next token count likewise; what was measured is kept. Results: --out/cross-kv-probe.json and
cross-kv-probe.md, rewritten after each stage (a run cut short keeps them).

    python3 bench/lab/2026-12-fp8-unet/cross_kv_probe.py --out DIR [--rows 16] [--tokens 77,154] [--variants fp8,fp8-kv,fp16,fp16-kv]
        [--iters 10] [--rounds 4] [--dynamic-tokens] [--deadline-s 520]
    python3 bench/lab/2026-12-fp8-unet/cross_kv_probe.py --smoke-cpu --out DIR   # CPU: the whole probe on the tiny UNet
        (fp32, torch.compile's aot_eager backend, --smoke-inductor: Inductor; timings mean nothing)
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
from fp8_compile_probe import profile_kernels, rel_l2  # noqa: E402

from export import fp8_quant  # noqa: E402  (scripts/export/, the export's package)
from export.architecture import architecture  # noqa: E402

VARIANTS = ("fp8", "fp8-kv", "fp16", "fp16-kv")  # the order they are compiled in: FP8 first (issue 44)
REL_L2_MAX = 1e-2  # -kv against its plain variant: the same math, GEMM rounding only


def sig(x: float) -> float:
    """x to 3 significant digits (errors, whose size matters, not their decimals)."""
    return float(f"{x:.3g}")


class KVSlice(nn.Module):
    """Stands in for an attn2's to_k or to_v: its input is the packed keys and values of every attn2
    (kv_precompute), its output its own columns of them, [rows, tokens, width] (a view)."""

    def __init__(self, offset: int, width: int) -> None:
        super().__init__()
        self.offset, self.width = offset, width

    def forward(self, kv: torch.Tensor) -> torch.Tensor:
        return kv[..., self.offset:self.offset + self.width]


def cross_attentions(unet: nn.Module) -> list[tuple[str, nn.Module]]:
    """The attn2 layers (cross-attention on the text), in module order."""
    return [(n, m) for n, m in unet.named_modules() if n.endswith(".attn2")]


def projections(unet: nn.Module) -> list[nn.Linear]:
    """Every attn2's to_k and to_v, in module order: the 140 per-step GEMMs."""
    out = []
    for name, attn in cross_attentions(unet):
        for lin in (attn.to_k, attn.to_v):
            if type(lin) is not nn.Linear:  # the FP8 UNet keeps them exact (fp8_quant.fp8_layer_names)
                raise SystemExit(f"cross_kv_probe: {name}: to_k / to_v is {type(lin).__name__}, not nn.Linear")
            out.append(lin)
    return out


def packed_weight(unet: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The 140 projections' weights concatenated ([sum of widths, context dim]) and their biases (None
    when none has one, as in SDXL): kv_precompute's one GEMM."""
    lins = projections(unet)
    w = torch.cat([lin.weight.detach() for lin in lins])
    if all(lin.bias is None for lin in lins):
        return w, None
    return w, torch.cat([lin.bias.detach() if lin.bias is not None else w.new_zeros(lin.out_features) for lin in lins])


def kv_precompute(ctx: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The keys and values of every attn2 from the context: [rows, tokens, sum of widths]."""
    return F.linear(ctx, w, b)


def shared_copy(unet: nn.Module) -> nn.Module:
    """A copy of the module tree sharing every parameter and buffer: its layers can be replaced (FP8,
    KVSlice) while the original and its compiled graph stay as they are."""
    memo = {id(t): t for t in (*unet.parameters(), *unet.buffers())}
    return copy.deepcopy(unet, memo)


def with_cached_kv(unet: nn.Module) -> nn.Module:
    """A shared copy whose attn2 to_k / to_v read the packed keys and values (KVSlice), in packed_weight's
    column order: the copy is called with kv_precompute's output in place of the context."""
    cp = shared_copy(unet)
    off = 0
    for _, attn in cross_attentions(cp):
        for name in ("to_k", "to_v"):
            width = getattr(attn, name).out_features
            setattr(attn, name, KVSlice(off, width))
            off += width
    return cp


# ------------------------------------------------------------------------------------------ set-up


def build_unet(arch: str, device: str, dtype: torch.dtype) -> nn.Module:
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    with torch.device(device):
        torch.set_default_dtype(dtype)
        unet = UNet2DConditionModel(**architecture(arch)["unet"])
        torch.set_default_dtype(torch.float32)
    return unet.eval().requires_grad_(False)


def inputs(unet: nn.Module, rows: int, tokens: int, device: str, dtype: torch.dtype):
    """Latent at the architecture's sample size (1024² for full), timestep 500, a random context of
    `tokens` tokens, SDXL's added conditions. The same values for a given seed and size."""
    c = unet.config
    g = torch.Generator(device).manual_seed(1000 + tokens)
    lat = torch.randn(rows, c.in_channels, c.sample_size, c.sample_size, generator=g, device=device, dtype=dtype)
    t = torch.full((rows,), 500.0, device=device)
    ctx = torch.randn(rows, tokens, c.cross_attention_dim, generator=g, device=device, dtype=dtype)
    side = c.sample_size * 8
    added = {"text_embeds": torch.randn(rows, c.projection_class_embeddings_input_dim - 6 * c.addition_time_embed_dim,
                                        generator=g, device=device, dtype=dtype),
             "time_ids": torch.tensor([[side, side, 0, 0, side, side]] * rows, device=device, dtype=dtype)}
    return lat, t, ctx, added


def make_models(unet16: nn.Module, variants: list[str], calib_inp) -> dict[str, nn.Module]:
    """The module of each variant; fp8's layers quantised with scales from one pass on calib_inp."""
    models = {}
    if any(v.startswith("fp8") for v in variants):
        fp8 = shared_copy(unet16)
        lat, t, ctx, added = calib_inp
        with fp8_quant.input_amax(fp8, fp8_quant.fp8_layer_names(fp8)) as amax:
            fp8(lat, t, ctx, added_cond_kwargs=added)
        models["fp8_layers"] = fp8_quant.quantize_unet(fp8, amax)
        models["fp8"] = fp8
    models["fp16"] = unet16
    for v in variants:
        if v.endswith("-kv"):
            models[v] = with_cached_kv(models[v[:-3]])
    return models


# ----------------------------------------------------------------------------------------- timing


class Clock:
    """CUDA events on the GPU, the wall clock on the CPU (smoke). On the GPU the calls are queued back to
    back, an event pair around each, and synchronised once: the host runs ahead, so a sample is the
    call's GPU time, as under the CUDA graphs sdxl-batch replays (not the host's launch time)."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def samples(self, fn, iters: int) -> list[float]:
        if self.cuda:
            pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
            for start, end in pairs:
                start.record()
                fn()
                end.record()
            torch.cuda.synchronize()
            return [start.elapsed_time(end) for start, end in pairs]
        out = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out

    def median(self, fn, iters: int, warmup: int = 2) -> float:
        for _ in range(warmup):
            fn()
        self.sync()
        return round(statistics.median(self.samples(fn, iters)), 4)


def projection_costs(unet16: nn.Module, w: torch.Tensor, b, ctx: torch.Tensor, clock: Clock, iters: int) -> dict:
    """The precompute (one packed GEMM) and the 140 projections one by one (eager), for this context."""
    lins = projections(unet16)
    m, k = ctx.shape[0] * ctx.shape[1], ctx.shape[2]
    gflop = 2 * m * k * w.shape[0] / 1e9

    def one_by_one():
        for lin in lins:
            F.linear(ctx, lin.weight, lin.bias)

    packed_ms = clock.median(lambda: kv_precompute(ctx, w, b), iters)
    loop_ms = clock.median(one_by_one, iters)
    r = {"gemms": len(lins), "M": m, "K": k, "N_packed": int(w.shape[0]), "gflop": round(gflop, 2),
         "kv_bytes_mib": round(m * w.shape[0] * w.element_size() / 2**20, 1),
         "packed_gemm_ms": packed_ms, "packed_tflops": round(gflop / packed_ms, 1),
         "one_by_one_ms": loop_ms, "one_by_one_tflops": round(gflop / loop_ms, 1)}
    if clock.cuda:  # the 140 GEMMs replayed as one CUDA graph: no launch gaps, as in sdxl-batch's step
        try:
            side = torch.cuda.Stream()  # warm-up on a side stream, as torch.cuda.graphs asks
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                one_by_one()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                one_by_one()
            r["one_by_one_graph_ms"] = clock.median(graph.replay, iters)
            r["one_by_one_graph_tflops"] = round(gflop / r["one_by_one_graph_ms"], 1)
        except Exception as e:  # noqa: BLE001  (the figure is a cross-check: say why it is missing)
            r["one_by_one_graph_error"] = f"{type(e).__name__}: {str(e)[:400]}"
    return r


# ------------------------------------------------------------------------------------------ probe


class Probe:
    def __init__(self, a, device: str, dtype: torch.dtype, out: Path) -> None:
        self.a, self.device, self.dtype, self.out = a, device, dtype, out
        self.clock = Clock(device)
        self.t_start = time.time()
        self.compiled: dict[tuple, object] = {}
        self.last_compile_s = 0.0  # the longest first call (compile) so far
        self.compile_s_sum = 0.0  # the first calls of the last token count's compiles
        self.res = {"argv": sys.argv[1:], "torch": torch.__version__, "rows": a.rows, "images": a.rows // 2,
                    "steps": a.steps, "iters": a.iters, "rounds": a.rounds, "dynamic_tokens": a.dynamic_tokens,
                    "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke: timings mean nothing)",
                    "compile_backend": a.backend, "tokens": {}}

    def left_s(self) -> float:
        return self.a.deadline_s - (time.time() - self.t_start)

    def skip(self, what: str, need_s: float) -> bool:
        """True (and recorded) when what would not end before the deadline (need_s: its estimate)."""
        if self.left_s() > need_s:
            return False
        self.res.setdefault("skipped_by_deadline", []).append(what)
        print(f"[{time.time() - self.t_start:6.1f}s] skipped by the deadline: {what}", flush=True)
        return True

    def save(self) -> None:
        self.res["wall_s"] = round(time.time() - self.t_start, 1)
        (self.out / "cross-kv-probe.json").write_text(json.dumps(self.res, indent=1))
        (self.out / "cross-kv-probe.md").write_text(summary(self.res))

    def log(self, msg: str) -> None:
        print(f"[{time.time() - self.t_start:6.1f}s] {msg}", flush=True)

    def compiled_model(self, variant: str, model: nn.Module, tokens: int):
        key = (variant, None if self.a.dynamic_tokens else tokens)
        if key not in self.compiled:
            # dynamic=False: no automatic dynamic shapes (the four variants are one class to Dynamo, and the
            # context and the packed K/V differ in width); --dynamic-tokens marks the token dimension itself
            self.compiled[key] = torch.compile(model, backend=self.a.backend, dynamic=False)
        return self.compiled[key]

    def step_fn(self, fn, variant: str, inp, kv: torch.Tensor):
        lat, t, ctx, added = inp
        cond = kv if variant.endswith("-kv") else ctx
        if self.a.dynamic_tokens:
            torch._dynamo.maybe_mark_dynamic(cond, 1)
        return lambda: fn(lat, t, cond, added_cond_kwargs=added).sample

    def run_tokens(self, tokens: int, models: dict, w, b) -> None:
        """Every variant at `tokens` tokens, a precision's pair (plain, -kv) at a time: compiled, timed in
        interleaved rounds, profiled and compared before the next pair starts (FP8 first)."""
        a = self.a
        r = self.res["tokens"][str(tokens)] = {"variants": {v: {} for v in a.variants}, "pairs": {}}
        inp = inputs(models["fp16"], a.rows, tokens, self.device, self.dtype)
        kv = kv_precompute(inp[2], w, b)
        r["kv_projection"] = projection_costs(models["fp16"], w, b, inp[2], self.clock, a.iters)
        self.log(f"{tokens} tokens: K/V projections {json.dumps(r['kv_projection'])}")
        # eager: the -kv variants against their plain ones before anything is compiled
        eager = {v: self.step_fn(models[v], v, inp, kv)().float() for v in a.variants}
        for v in a.variants:
            if v.endswith("-kv") and v[:-3] in eager:
                r["variants"][v]["eager_rel_l2_vs_plain"] = sig(rel_l2(eager[v], eager[v[:-3]]))
        del eager
        self.save()
        self.compile_s_sum = 0.0
        outs: dict[str, torch.Tensor] = {}
        for base in ("fp8", "fp16"):
            steps = {}
            for v in (base, base + "-kv"):
                if v in a.variants:
                    step = self.compile_and_measure(v, models[v], tokens, inp, kv, r, outs)
                    if step is not None:
                        steps[v] = step
            self.compare(r, outs)
            self.interleaved(r, steps, tokens)
            self.profile(r, steps, tokens)
            r["pairs"].update(pairs(r, a, base))
            self.save()

    def compile_and_measure(self, v: str, model: nn.Module, tokens: int, inp, kv, r: dict, outs: dict):
        """Compiles v (the first call, timed) unless the deadline forbids, then the median of --iters calls;
        returns the step function (None: skipped or failed, recorded)."""
        vr = r["variants"][v]
        fresh = (v, None if self.a.dynamic_tokens else tokens) not in self.compiled
        # a -kv graph reuses most of its plain one's Triton kernels (Inductor's cache): its compile is shorter
        plain_s = r["variants"].get(v[:-3], {}).get("first_call_s") if v.endswith("-kv") else None
        need = (plain_s or self.last_compile_s) * 1.1 + 10
        if fresh and self.skip(f"{v} at {tokens} tokens (compile)", need):
            return None
        step = self.step_fn(self.compiled_model(v, model, tokens), v, inp, kv)
        try:
            t0 = time.time()
            outs[v] = step().float().clone()
            self.clock.sync()
            vr["first_call_s"] = round(time.time() - t0, 1)
            if fresh:
                self.last_compile_s = max(self.last_compile_s, vr["first_call_s"])
                self.compile_s_sum += vr["first_call_s"]
            vr["step_ms_median_after_compile"] = self.clock.median(step, self.a.iters)
        except Exception as e:  # noqa: BLE001  (a variant that does not compile: say why, measure the others)
            vr["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
            self.log(f"{v}: failed: {vr['error'][:400]}")
            self.save()
            return None
        self.log(f"{tokens} tokens, {v}: first call {vr['first_call_s']} s, step {vr['step_ms_median_after_compile']} ms")
        self.save()
        return step

    def profile(self, r: dict, steps: dict, tokens: int) -> None:
        """Each variant's kernel time by class (two profiled calls; on the GPU only)."""
        if self.device != "cuda":
            return
        for v, step in steps.items():
            if self.skip(f"{v} at {tokens} tokens (profile)", 10):
                break
            p = profile_kernels(step)
            r["variants"][v].update(kernels_by_class=p["by_class"], kernel_ms_per_step=p["kernel_ms_per_step"],
                                    kernel_calls_per_step=p["kernel_calls_per_step"], top_kernels=p["top_kernels"][:12])

    def compare(self, r: dict, outs: dict) -> None:
        for v, o in outs.items():
            for ref in (v[:-3] if v.endswith("-kv") else None, "fp16" if v.startswith("fp8") else None):
                if ref in outs:
                    name = "rel_l2_vs_plain" if ref == v[:-3] else "rel_l2_vs_fp16"
                    r["variants"][v][name] = sig(rel_l2(o, outs[ref]))

    def interleaved(self, r: dict, steps: dict, tokens: int) -> None:
        """--rounds rounds of --iters calls of the pair's variants in turn (the order swapped each round; one
        untimed call first, the switch's host work): the medians and, for the pair, the per-round
        differences of the medians."""
        if len(steps) < 2:
            return
        per_call = max(r["variants"][v]["step_ms_median_after_compile"] for v in steps) / 1e3
        samples: dict[str, list[float]] = {v: [] for v in steps}
        rounds: dict[str, list[float]] = {v: [] for v in steps}
        for i in range(self.a.rounds):
            if self.skip(f"round {i + 1} at {tokens} tokens ({', '.join(steps)})",
                         per_call * (self.a.iters + 1) * len(steps) + 5):
                break
            for v in (list(steps) if i % 2 == 0 else list(steps)[::-1]):
                steps[v]()
                s = self.clock.samples(steps[v], self.a.iters)
                samples[v] += s
                rounds[v].append(statistics.median(s))
        for v in steps:
            if samples[v]:
                r["variants"][v].update(step_ms_median=round(statistics.median(samples[v]), 4),
                                        step_ms_min=round(min(samples[v]), 4), step_ms_rounds=[round(x, 4) for x in rounds[v]])


def pairs(r: dict, a, base: str) -> dict:
    """{base: the saving of base-kv over base, per step and per image} ({} when one was not timed)."""
    p, k = r["variants"].get(base, {}), r["variants"].get(base + "-kv", {})
    key = "step_ms_median" if "step_ms_median" in p and "step_ms_median" in k else "step_ms_median_after_compile"
    if key not in p or key not in k:
        return {}
    images, proj = a.rows // 2, r["kv_projection"]
    saved = p[key] - k[key]
    saved_image = saved * a.steps - proj["packed_gemm_ms"]  # the precompute runs once per image-batch
    out = {
        "timing": "interleaved rounds" if key == "step_ms_median" else "after compile only",
        "step_ms": p[key], "step_ms_kv": k[key], "saved_ms_per_step": round(saved, 3),
        "saved_pct_of_step": round(100 * saved / p[key], 2),
        "saved_ms_per_step_rounds": [round(x - y, 3) for x, y in zip(p.get("step_ms_rounds", []),
                                                                       k.get("step_ms_rounds", []))],
        "precompute_ms": proj["packed_gemm_ms"],
        "saved_ms_per_image": round(saved_image / images, 3),
        "saved_pct_of_image_sampling": round(100 * saved_image / (p[key] * a.steps), 2),
        "projections_one_by_one_ms": proj["one_by_one_ms"],
        "projections_one_by_one_graph_ms": proj.get("one_by_one_graph_ms"),
        "rel_l2_kv_vs_plain": k.get("rel_l2_vs_plain"), "eager_rel_l2_kv_vs_plain": k.get("eager_rel_l2_vs_plain"),
    }
    bad = [x for x in ("rel_l2_kv_vs_plain", "eager_rel_l2_kv_vs_plain") if out[x] is None or not out[x] < REL_L2_MAX]
    out["check"] = "ok" if not bad else f"FAILED: {bad} not below {REL_L2_MAX}"
    if "kernels_by_class" in p and "kernels_by_class" in k:  # where the saving is (and what else moved)
        cp, ck = p["kernels_by_class"], k["kernels_by_class"]
        out["kernel_ms_saved_per_step_by_class"] = {
            c: round(cp.get(c, {}).get("ms_per_step", 0.0) - ck.get(c, {}).get("ms_per_step", 0.0), 3)
            for c in sorted(set(cp) | set(ck))}
        out["gemm_kernel_ms_saved_per_step"] = out["kernel_ms_saved_per_step_by_class"].get("gemm")
        out["kernel_ms_saved_per_step"] = round(p["kernel_ms_per_step"] - k["kernel_ms_per_step"], 3)
        out["kernel_calls_saved_per_step"] = p["kernel_calls_per_step"] - k["kernel_calls_per_step"]
    return {base: out}


# ----------------------------------------------------------------------------------------- output


def summary(res: dict) -> str:
    md = ["## Cross-attention keys and values computed once per image-batch (issue 44, item 3)", "",
          f"{res['gpu']}, torch {res['torch']}, {res['rows']} rows ({res['images']} images with CFG), "
          f"{res['steps']} steps, torch.compile backend {res['compile_backend']}"
          f"{', token dimension dynamic' if res['dynamic_tokens'] else ', static shapes'}; "
          f"{res['rounds']} interleaved rounds of {res['iters']} calls. Probe wall time {res.get('wall_s')} s.", ""]
    head = ["tokens", "UNet", "step ms", "step ms, K/V given", "saved ms / step", "% of step",
            "precompute ms (once)", "saved ms / image", "K/V projections one by one, ms (CUDA graph)",
            "kernel ms saved / step (GEMM)",
            "rel. L2 kv vs plain (compiled / eager)", "check"]
    md += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for tokens, r in res["tokens"].items():
        for base, p in r.get("pairs", {}).items():
            cells = [tokens, base, f"{p['step_ms']:.2f}", f"{p['step_ms_kv']:.2f}", f"{p['saved_ms_per_step']:.3f}",
                     f"{p['saved_pct_of_step']:.2f}", f"{p['precompute_ms']:.3f}", f"{p['saved_ms_per_image']:.2f}",
                     f"{p['projections_one_by_one_ms']:.3f} ({p['projections_one_by_one_graph_ms'] or '—'})",
                     f"{p.get('kernel_ms_saved_per_step', '—')} ({p.get('gemm_kernel_ms_saved_per_step', '—')})",
                     f"{p['rel_l2_kv_vs_plain']} / {p['eager_rel_l2_kv_vs_plain']}", p["check"]]
            md.append("| " + " | ".join(cells) + " |")
    md.append("")
    for tokens, r in res["tokens"].items():
        kp = r.get("kv_projection", {})
        md.append(f"- {tokens} tokens: the {kp.get('gemms')} K/V projections, M {kp.get('M')} x K {kp.get('K')} -> "
                  f"{kp.get('N_packed')} columns, {kp.get('gflop')} GFLOP, {kp.get('kv_bytes_mib')} MiB of keys and "
                  f"values: one packed GEMM {kp.get('packed_gemm_ms')} ms ({kp.get('packed_tflops')} TFLOP/s), one by one "
                  f"{kp.get('one_by_one_ms')} ms ({kp.get('one_by_one_tflops')} TFLOP/s), as one CUDA graph "
                  f"{kp.get('one_by_one_graph_ms', kp.get('one_by_one_graph_error', '—'))} ms")
        for v, vr in r.get("variants", {}).items():
            if "error" in vr:
                md.append(f"  - {v}: failed: {vr['error'][:300]}")
            elif "first_call_s" in vr:
                md.append(f"  - {v}: first call (compile) {vr['first_call_s']} s, step after compile "
                          f"{vr['step_ms_median_after_compile']} ms, interleaved rounds {vr.get('step_ms_rounds')}, "
                          f"kernels {vr.get('kernel_ms_per_step', '—')} ms per step")
        for base, p in r.get("pairs", {}).items():
            md.append(f"  - {base}: saved ms per step by round {p['saved_ms_per_step_rounds']} ({p['timing']}); "
                      f"kernel ms saved per step by class {json.dumps(p.get('kernel_ms_saved_per_step_by_class'))}, "
                      f"kernel launches saved {p.get('kernel_calls_saved_per_step', '—')}")
    verdicts = [f"{base} at {tokens} tokens: {p['saved_pct_of_step']:.2f} % of the step "
                f"({'at or above' if p['saved_pct_of_step'] >= 1.0 else 'below'} the 1 % threshold)"
                for tokens, r in res["tokens"].items() for base, p in r.get("pairs", {}).items()]
    smoke = " (a CPU smoke run: its timings mean nothing)" if res["gpu"].startswith("cpu") else ""
    md += ["", f"Decision input{smoke} (build the cached K/V into the export and the C++ sampler at about 1 % of the "
               "step or more): " + ("; ".join(verdicts) if verdicts else "nothing measured")]
    if res.get("skipped_by_deadline"):
        md.append(f"Skipped by the deadline: {res['skipped_by_deadline']}")
    return "\n".join(md) + "\n"


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True, help="result folder (cross-kv-probe.json and .md)")
    ap.add_argument("--rows", type=int, default=16, help="UNet rows per call (CFG: 2 per image), default 16")
    ap.add_argument("--tokens", default="77,154", help="context lengths, in order, default 77,154")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of " + ",".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=28, help="sampler steps per image (the per-image saving)")
    ap.add_argument("--iters", type=int, default=10, help="timed calls per measurement, default 10")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved timing rounds, default 4")
    ap.add_argument("--dynamic-tokens", action="store_true",
                    help="compile each variant once with the token dimension dynamic (as the packages are)")
    ap.add_argument("--deadline-s", type=float, default=520, help="start nothing that would end after this")
    ap.add_argument("--smoke-cpu", action="store_true", help="the whole probe on the CPU with the tiny UNet")
    ap.add_argument("--smoke-inductor", action="store_true", help="with --smoke-cpu: Inductor, not aot_eager")
    a = ap.parse_args()
    a.tokens = [int(x) for x in a.tokens.split(",") if x.strip()]
    a.variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    if not a.variants or set(a.variants) - set(VARIANTS):
        ap.error(f"--variants takes {','.join(VARIANTS)}")
    a.variants = [v for v in VARIANTS if v in a.variants]  # plain before -kv, FP8 first
    if a.rows < 2 or a.rows % 2:
        ap.error("--rows must be even (CFG: 2 rows per image)")
    a.backend = "inductor"
    if a.smoke_cpu:
        a.rows, a.iters, a.rounds = 2, 2, 2
        a.backend = "inductor" if a.smoke_inductor else "aot_eager"
    return a


def main() -> int:
    a = parse_args()
    if not a.smoke_cpu and not torch.cuda.is_available():
        print("cross_kv_probe: no CUDA device here (--smoke-cpu runs the probe on the CPU)", file=sys.stderr)
        return 2
    device, dtype, arch = ("cpu", torch.float32, "tiny") if a.smoke_cpu else ("cuda", torch.float16, "full")
    torch.set_grad_enabled(False)
    # the variants are instances of one class: one compiled entry each on its forward, per token count
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    probe = Probe(a, device, dtype, out)
    unet16 = build_unet(arch, device, dtype)
    models = make_models(unet16, a.variants, inputs(unet16, a.rows, a.tokens[0], device, dtype))
    probe.res["fp8_layers"] = models.pop("fp8_layers", 0)
    probe.res["cross_attentions"] = len(cross_attentions(unet16))
    w, b = packed_weight(unet16)
    for v in a.variants:  # the plain UNets keep their projections; each -kv one reads all of the packed K/V
        if v.endswith("-kv"):
            slices = [m for m in models[v].modules() if isinstance(m, KVSlice)]
            end = max(s.offset + s.width for s in slices)
            if len(slices) != 2 * probe.res["cross_attentions"] or end != w.shape[0]:
                raise SystemExit(f"cross_kv_probe: {v}: {len(slices)} KVSlice up to column {end}, packed K/V {w.shape[0]}")
        else:
            projections(models[v])
    probe.res["build_s"] = round(time.time() - probe.t_start, 1)
    probe.log(f"UNet built ({arch}, {probe.res['cross_attentions']} attn2, packed K/V weight {tuple(w.shape)}), "
              f"{probe.res['fp8_layers']} FP8 layers")
    for i, tokens in enumerate(a.tokens):
        if i and not a.dynamic_tokens:
            if probe.skip(f"{tokens} tokens (all variants)", probe.compile_s_sum * 1.1 + 30):
                continue
            probe.compiled.clear()
            torch._dynamo.reset()
        probe.run_tokens(tokens, models, w, b)
        if device == "cuda":
            torch.cuda.empty_cache()
    probe.res["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None
    probe.save()
    print(summary(probe.res))
    failed = [f"{t}/{base}" for t, r in probe.res["tokens"].items() for base, p in r.get("pairs", {}).items()
              if p["check"] != "ok"]
    errors = [f"{t}/{v}" for t, r in probe.res["tokens"].items() for v, vr in r["variants"].items() if "error" in vr]
    return 1 if failed or errors else 0


if __name__ == "__main__":
    sys.exit(main())
