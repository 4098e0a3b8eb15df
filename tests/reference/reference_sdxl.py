"""diffusers reference image for parity tests (see docs/developing.md, parity tests).

Runs StableDiffusionXLPipeline once, with the noise drawn on the CPU
(torch.Generator("cpu").manual_seed(seed)), and saves
  --out-png      the pipeline's normal PIL output (exactly what output_type="pil" returns)
  --out-latents  the final latents before the VAE (what output_type="latent" would return), float32 .npy
The latents are captured with callback_on_step_end at the last step, inside the
same run, so both files come from one denoising loop.

An empty (or absent) --negative is passed as negative_prompt=None, so the
pipeline's force_zeros_for_empty_prompt gives zero negative embeddings.
(diffusers encodes negative_prompt="" as text; only None is zeroed.)

    PYTHONPATH=tests python -m reference.reference_sdxl --diffusers DIR --prompt "a cat" --seed 42 \
        --steps 8 --cfg 5 --width 256 --height 256 --out-png ref.png --out-latents ref.npy
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from reference.prompt_reference import Chunker, pad_chunks

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def a1111_chunk_count(pipe, text: str) -> int:
    """The 75-token chunks of `text` (the more of the two tokenizers')."""
    return max(len(Chunker(t).tokenize_line(text)[0]) for t in (pipe.tokenizer, pipe.tokenizer_2))


def a1111_embeds(pipe, prompt: str, negative: str, cfg_on: bool, clip_skip: int = 0, min_chunks: int = 1) -> dict:
    """The reference of sdxl-batch's conditioning: A1111's chunks and weights
    (reference.prompt_reference), each encoder's penultimate hidden states (with
    clip skip N >= 3, hidden_states[-N], for the prompt and the negative prompt)
    multiplied by the weights and rescaled to the chunk's mean before weighting,
    chunks concatenated (at least min_chunks, padded with empty chunks); pooled
    output of encoder 2's first chunk; zeros for an empty negative prompt."""
    texts = [prompt] + ([negative] if (cfg_on and negative) else [])
    encoded = a1111_encode(pipe, texts, clip_skip, min_chunks)
    z, pooled = encoded[0]
    kwargs = {"prompt_embeds": z, "pooled_prompt_embeds": pooled}
    if len(encoded) > 1:
        kwargs.update(negative_prompt_embeds=encoded[1][0], negative_pooled_prompt_embeds=encoded[1][1])
    else:
        kwargs.update(negative_prompt_embeds=torch.zeros_like(z), negative_pooled_prompt_embeds=torch.zeros_like(pooled))
    return kwargs


def a1111_encode(pipe, texts: list[str], clip_skip: int = 0, min_chunks: int = 1) -> list[tuple]:
    """Each text's (hidden states [1, 77k, C], pooled) under A1111's rules (a1111_embeds), all padded
    to the same count k of 75-token chunks, the most any of them needs (at least min_chunks): as
    sdxl-batch pads the prompts of one task (its prompt and negative, and each region's)."""
    layer = -clip_skip if clip_skip >= 3 else -2
    chunkers = (Chunker(pipe.tokenizer), Chunker(pipe.tokenizer_2))

    def encode(encoder, chunk_list):
        zs, pooled = [], None
        device = pipe.device
        for ids, mult in chunk_list:
            out = encoder(torch.tensor([ids], device=device), output_hidden_states=True)
            z = out.hidden_states[layer]
            if pooled is None:
                pooled = out[0]
            m = torch.tensor(mult, device=device).reshape(1, -1, 1).to(z.dtype)
            original_mean = z.mean()
            z = z * m
            z = z * (original_mean / z.mean())
            zs.append(z)
        return torch.cat(zs, dim=1), pooled

    chunked = [[ch.tokenize_line(text)[0] for ch in chunkers] for text in texts]
    k = max([min_chunks] + [len(c) for lists in chunked for c in lists])
    out = []
    for lists in chunked:
        z1, _ = encode(pipe.text_encoder, pad_chunks(chunkers[0], lists[0], k))
        z2, pooled = encode(pipe.text_encoder_2, pad_chunks(chunkers[1], lists[1], k))
        out.append((torch.cat([z1, z2], dim=-1), pooled))
    return out


def parse_lora_spec(spec: str) -> tuple[str, float]:
    """FILE[:WEIGHT] -> (FILE, WEIGHT); 1.0 without a weight."""
    path, _, w = spec.rpartition(":")
    return (path, float(w)) if path and w.replace(".", "", 1).lstrip("-").isdigit() else (spec, 1.0)


def load_pipeline(diffusers: str, dtype: str = "fp32", device: str = "cpu", loras: list[tuple[str, float]] = (),
                  embeddings: list[str] = ()):
    """StableDiffusionXLPipeline from a diffusers folder, without watermark or progress bar, with
    `loras` (FILE, WEIGHT) fused (reference.lora_reference) and textual-inversion `embeddings`
    loaded under their file stems. -> (pipe, the LoRA layer counts)."""
    from diffusers import StableDiffusionXLPipeline

    pipe = StableDiffusionXLPipeline.from_pretrained(diffusers, dtype=DTYPES[dtype], local_files_only=True,
                                                     add_watermarker=False)
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    pipe.sdxl_base_scheduler_config = dict(pipe.scheduler.config)
    pipe.sdxl_embeddings = bool(embeddings)
    lora_counts = {}
    if loras:
        from reference.lora_reference import fuse_lora_files

        lora_counts = fuse_lora_files(pipe, list(loras))
    for path in embeddings:
        from safetensors.torch import load_file

        state, name = load_file(path), Path(path).stem
        pipe.load_textual_inversion(state["clip_l"], token=name, text_encoder=pipe.text_encoder, tokenizer=pipe.tokenizer)
        pipe.load_textual_inversion(state["clip_g"], token=name, text_encoder=pipe.text_encoder_2,
                                    tokenizer=pipe.tokenizer_2)
    return pipe, lora_counts


def text_at(entries: list, step: int) -> str:
    """A1111's reconstruct_cond_batch: the text of sampler step `step` (from 0) of a schedule
    [[end_at_step, text], ...], the first entry with step <= end_at_step."""
    return next((text for end, text in entries if step <= end), entries[0][1])


def scheduled_embeds(pipe, prompt_steps: list, negative_steps: list, steps: int, cfg_on: bool, clip_skip: int) -> list:
    """Prompt editing as A1111 applies it: each step's conditioning (a1111_embeds of that step's
    prompt and negative texts, every text padded to the chunk count of the longest), per step."""
    texts = [t for _, t in prompt_steps] + ([t for _, t in negative_steps if t] if cfg_on else [])
    k = max(a1111_chunk_count(pipe, t) for t in texts)
    cache, out = {}, []
    for i in range(steps):
        key = (text_at(prompt_steps, i), text_at(negative_steps, i) if cfg_on else "")
        if key not in cache:
            cache[key] = a1111_embeds(pipe, key[0], key[1], cfg_on, clip_skip, min_chunks=k)
        out.append(cache[key])
    return out


def generate(pipe, prompt: str, negative: str = "", seed: int = 0, steps: int = 28, cfg: float = 7.0,
             width: int = 1024, height: int = 1024, sampler: str = "Euler", schedule: str = "Automatic",
             guidance_rescale: float = 0.0, clip_skip: int = 0, prompt_rules: str = "a1111",
             prompt_steps: list | None = None, negative_steps: list | None = None):
    """One image of load_pipeline's `pipe` (a fresh scheduler of sampler / schedule, the noise of a
    CPU generator list of one). prompt_steps / negative_steps: A1111 prompt editing, the
    schedules [[end_at_step, text], ...] of the prompt and the negative prompt (A1111's
    get_learned_conditioning_prompt_schedules), swapped in by callback_on_step_end before each
    step (a first-order sampler: one model call per step). -> (PIL image, the final latents
    before the VAE as float32 numpy)."""
    from reference.a1111_schedulers import make_scheduler

    pipe.scheduler = make_scheduler(pipe.sdxl_base_scheduler_config, sampler, schedule)
    if getattr(pipe, "sdxl_embeddings", False):  # a name of n vectors becomes "name name_1 ... name_{n-1}", as diffusers' encode_prompt does
        prompt = pipe.maybe_convert_prompt(prompt, pipe.tokenizer)
        negative = pipe.maybe_convert_prompt(negative, pipe.tokenizer) if negative else negative
    captured: dict[str, torch.Tensor] = {}
    per_step = None
    if prompt_steps is not None:
        with torch.inference_mode():
            per_step = scheduled_embeds(pipe, prompt_steps, negative_steps or [[steps, negative]], steps, cfg > 1.0,
                                        clip_skip)

    def on_step_end(p, i, t, kwargs):
        if i == p.num_timesteps - 1:
            captured["latents"] = kwargs["latents"].detach().clone()
        elif per_step is not None:  # the conditioning of step i + 1, in the pipeline's CFG order [negative, positive]
            e = per_step[i + 1]
            pos, pooled = e["prompt_embeds"], e["pooled_prompt_embeds"]
            if cfg > 1.0:
                pos = torch.cat([e["negative_prompt_embeds"], pos])
                pooled = torch.cat([e["negative_pooled_prompt_embeds"], pooled])
            kwargs["prompt_embeds"], kwargs["add_text_embeds"] = pos, pooled
        return kwargs

    prompt_kwargs = {"prompt": prompt, "negative_prompt": negative if negative else None}
    if per_step is not None:
        prompt_kwargs = per_step[0]
    elif prompt_rules == "a1111":
        with torch.inference_mode():
            prompt_kwargs = a1111_embeds(pipe, prompt, negative, cfg > 1.0, clip_skip)
    elif clip_skip >= 3:
        prompt_kwargs["clip_skip"] = clip_skip - 2  # diffusers counts from the penultimate layer
    with torch.inference_mode():
        out = pipe(
            **prompt_kwargs,
            num_inference_steps=steps,
            guidance_scale=cfg,
            width=width,
            height=height,
            guidance_rescale=guidance_rescale,
            # A list of per-image CPU generators, as sdxl-batch draws (one image here).
            generator=[torch.Generator("cpu").manual_seed(seed)],
            output_type="pil",
            callback_on_step_end=on_step_end,
            callback_on_step_end_tensor_inputs=["latents"] + (["prompt_embeds", "add_text_embeds"] if per_step else []),
        )
    if "latents" not in captured:
        raise RuntimeError("the last step's latents were not captured")
    return out.images[0], captured["latents"].float().cpu().numpy().astype(np.float32)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--diffusers", required=True, help="a diffusers SDXL directory (export_sdxl.py --save-diffusers)")
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--negative", default="")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=28)
    ap.add_argument("--cfg", type=float, default=7.0)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--height", type=int, default=1024)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    ap.add_argument("--out-png", required=True)
    ap.add_argument("--out-latents")
    ap.add_argument("--sampler", default="Euler", help="A1111 sampler name (reference.a1111_schedulers)")
    ap.add_argument("--schedule", default="Automatic", help="A1111 schedule type")
    ap.add_argument("--guidance-rescale", type=float, default=0.0)
    ap.add_argument("--clip-skip", type=int, default=0,
                    help="A1111's clip skip N: 1, 2 = the default layer; N >= 3 passes clip_skip=N-2 to the pipeline "
                         "(diffusers rules: the prompt's hidden_states[-N], the negative prompt's stay [-2]) and takes "
                         "hidden_states[-N] of the prompt and the negative prompt (a1111 rules)")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    ap.add_argument("--lora", action="append", default=[],
                    help="FILE[:WEIGHT], fused into the weights before generating (reference.lora_reference)")
    ap.add_argument("--embedding", action="append", default=[],
                    help="an SDXL textual-inversion file (clip_l, clip_g), loaded as diffusers' load_textual_inversion "
                         "under its file stem, which prompts use")
    ap.add_argument("--prompt-rules", choices=["a1111", "diffusers"], default="a1111",
                    help="a1111 (what sdxl-batch does): emphasis, BREAK and 75-token chunks via prompt_reference.py, "
                         "fed to the pipeline as embeddings; diffusers: the pipeline's own encode_prompt (truncates at 77)")
    a = ap.parse_args()

    if a.threads:
        torch.set_num_threads(a.threads)
    t0 = time.time()
    pipe, lora_counts = load_pipeline(a.diffusers, a.dtype, a.device, [parse_lora_spec(s) for s in a.lora], a.embedding)
    t_load = time.time() - t0
    t0 = time.time()
    try:
        img, lat = generate(pipe, a.prompt, a.negative, a.seed, a.steps, a.cfg, a.width, a.height, a.sampler,
                            a.schedule, a.guidance_rescale, a.clip_skip, a.prompt_rules)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    t_run = time.time() - t0
    Path(a.out_png).parent.mkdir(parents=True, exist_ok=True)
    img.save(a.out_png)
    if a.out_latents:
        Path(a.out_latents).parent.mkdir(parents=True, exist_ok=True)
        np.save(a.out_latents, lat)
    print(json.dumps({
        "png": a.out_png, "latents": a.out_latents, "latents_shape": list(lat.shape),
        "latents_abs_max": float(np.abs(lat).max()), "image_size": list(img.size),
        "load_s": round(t_load, 2), "run_s": round(t_run, 2), "lora_layers": lora_counts,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
