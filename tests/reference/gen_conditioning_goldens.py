"""Golden SDXL conditioning under A1111's prompt rules, from the diffusers
pipeline's own text encoders: for each prompt, the context [1, 77k, H1+H2] and
the pooled embedding [1, P] that reference_sdxl.py feeds the pipeline
(a1111_embeds). The C++ conditioning must match them (tests/unit/test_text_encode.cpp).

    PYTHONPATH=tests python -m reference.gen_conditioning_goldens --diffusers TINY_DIFFUSERS --out DIR [--max-chunks 4]

Writes DIR/index.json (prompts, shapes) and DIR/context-N.npy, DIR/pooled-N.npy.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from reference.prompt_reference import Chunker, fixed_prompts
from reference.reference_sdxl import a1111_embeds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--diffusers", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-chunks", type=int, default=4)
    a = ap.parse_args()
    from diffusers import StableDiffusionXLPipeline

    torch.set_num_threads(1)
    pipe = StableDiffusionXLPipeline.from_pretrained(a.diffusers, dtype=torch.float32, local_files_only=True,
                                                     add_watermarker=False)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    chunker = Chunker(pipe.tokenizer)
    index = []
    with torch.inference_mode():
        for prompt in fixed_prompts():
            if len(chunker.tokenize_line(prompt)[0]) > a.max_chunks:
                continue
            kw = a1111_embeds(pipe, prompt, "", cfg_on=False)
            n = len(index)
            np.save(out / f"context-{n}.npy", kw["prompt_embeds"].float().numpy().astype(np.float32))
            np.save(out / f"pooled-{n}.npy", kw["pooled_prompt_embeds"].float().numpy().astype(np.float32))
            index.append({"prompt": prompt, "context_shape": list(kw["prompt_embeds"].shape)})
    (out / "index.json").write_text(json.dumps(index, ensure_ascii=False, indent=1))
    print(f"wrote {len(index)} prompts' conditioning to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
