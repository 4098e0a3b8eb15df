"""Regional prompts (attention couple, issue 59) on diffusers' StableDiffusionXLPipeline: the reference
sdxl-batch's `"regions"` are tested against (tests/parity/parity_regions.py).

The formula, computed here from the batch file's own keys (nothing of sdxl-batch or the export):
  - prompts: i = 0 the task's prompt, then each region's (a region's character adds its prompt after
    the region's, joined by ", "); negatives: the task's for i = 0, a region's own negative or else the
    task's (then the character's negative after it); every text of the task padded to the same count of
    75-token chunks under A1111's rules (reference_sdxl.a1111_encode); an empty negative is zeros;
    the pooled embeddings and the time ids are the task's;
  - each region's mask m_i at an attention layer's cell grid (gh x gw, the latent after log2(d) stride-2
    convolutions, found from the layer's token count): a box [x0, y0, x1, y1] (fractions of the panel)
    covers a cell when the cell's centre is inside, x0 <= (j + 0.5) / gw < x1 and y0 <= (i + 0.5) / gh < y1;
    a mask PNG is its grey levels / 255 taken to the grid by F.interpolate(mode="area");
  - raw weights weight_i * m_i for region i and 1 - (1 - region_base) * max_i m_i for the task's prompt,
    normalised to sum to 1 over the prompts at each cell; the same weights for the unconditional row;
  - every cross-attention layer (attn2): to_out(sum_i w_i * sdpa(q, K_i, V_i)), one prompt at a time;
  - a character's reference picture (through the task's IP-Adapter, loaded by diffusers' load_ip_adapter):
    one image of one adapter per character, its scale its own (set_ip_adapter_scale([[s_0, s_1, ..]])),
    its mask the region's at the image size (a box: a pixel is inside when its centre is, by the rule
    above; a PNG as it is) through diffusers' IPAdapterMaskProcessor.preprocess, and in the layer
    IPAdapterAttnProcessor2_0's masked loop (IPAdapterMaskProcessor.downsample, each image its own
    softmax), added before to_out.

    from reference.regions_reference import generate_regions
    image, latents = generate_regions(pipe, task, characters, base_dir)
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from reference.a1111_schedulers import make_scheduler
from reference.reference_sdxl import a1111_encode


def residual_size(n: int, downscale: int) -> int:
    """A latent side of n after log2(downscale) stride-2 convolutions (kernel 3, padding 1)."""
    while downscale > 1:
        n, downscale = (n + 1) // 2, downscale // 2
    return n


def cell_grid(lat_h: int, lat_w: int, tokens: int) -> tuple[int, int]:
    """The (rows, columns) of the attention resolution that has `tokens` cells for a latent of lat_h x lat_w."""
    d = 1
    while d <= 2 * max(lat_h, lat_w):
        gh, gw = residual_size(lat_h, d), residual_size(lat_w, d)
        if gh * gw == tokens:
            return gh, gw
        d *= 2
    raise ValueError(f"{tokens} attention tokens fit no downscale of a {lat_h}x{lat_w} latent")


def box_grid(box, rows: int, cols: int) -> torch.Tensor:
    """1.0 where a cell's centre lies inside the box (x0 <= cx < x1, y0 <= cy < y1), else 0.0: [rows, cols]."""
    x0, y0, x1, y1 = (float(v) for v in box)
    cy = (torch.arange(rows, dtype=torch.float64) + 0.5) / rows
    cx = (torch.arange(cols, dtype=torch.float64) + 0.5) / cols
    inside_y = (cy >= y0) & (cy < y1)
    inside_x = (cx >= x0) & (cx < x1)
    return (inside_y[:, None] & inside_x[None, :]).to(torch.float32)


def mask_grey(path: Path) -> torch.Tensor:
    """A mask PNG's grey levels / 255 (PIL's "L" conversion), float32 [h, w]."""
    return torch.from_numpy(np.array(Image.open(path).convert("L"), dtype=np.float32) / 255.0)


def region_cells(region: dict, base: Path, rows: int, cols: int) -> torch.Tensor:
    """Region's mask at a cell grid, flattened row-major: [rows * cols]."""
    if "box" in region:
        return box_grid(region["box"], rows, cols).flatten()
    grey = mask_grey(base / region["mask"])
    return F.interpolate(grey[None, None], size=(rows, cols), mode="area").flatten()


def region_weights(regions: list[dict], region_base: float, base: Path, rows: int, cols: int) -> torch.Tensor:
    """Normalised weights [1 + len(regions), rows * cols]: the task's prompt first, then each region."""
    n = rows * cols
    if not regions:
        return torch.ones(1, n)
    m = torch.stack([region_cells(r, base, rows, cols) for r in regions])
    raw = torch.cat([(1.0 - (1.0 - region_base) * m.max(0).values)[None],
                     torch.tensor([float(r.get("weight", 1.0)) for r in regions])[:, None] * m])
    return raw / raw.sum(0, keepdim=True)


def join(*parts: str) -> str:
    return ", ".join(p for p in parts if p)


def resolve(task: dict, characters: dict) -> tuple[list[str], list[str], list[tuple[int, dict]]]:
    """The task's prompts and negatives (task first, then each region, characters joined in) and its
    reference pictures: (region index, the character's "reference") for each region whose character has one."""
    prompts, negatives, refs = [task["prompt"]], [task.get("negative", "")], []
    for i, r in enumerate(task.get("regions", [])):
        c = characters[r["character"]] if r.get("character") else {}
        prompts.append(join(r.get("prompt", ""), c.get("prompt", "")))
        negatives.append(join(r["negative"], c.get("negative", "")) if "negative" in r
                         else join(task.get("negative", ""), c.get("negative", "")))
        if c.get("reference"):
            refs.append((i, c["reference"]))
    return prompts, negatives, refs


def encode_task(pipe, prompts: list[str], negatives: list[str], cfg_on: bool) -> tuple[list, list, torch.Tensor,
                                                                                        torch.Tensor]:
    """([1, 77k, C] per prompt, the same per negative (zeros when empty or CFG is off), the pooled
    embedding of the task's prompt, of its negative): every text padded to one chunk count."""
    texts = list(prompts) + [n for n in negatives if n and cfg_on]
    enc = a1111_encode(pipe, texts)
    pos = [z for z, _ in enc[:len(prompts)]]
    by_text = dict(zip(texts[len(prompts):], enc[len(prompts):]))
    neg = [by_text[n][0] if (n and cfg_on) else torch.zeros_like(pos[0]) for n in negatives]
    neg_pooled = by_text[negatives[0]][1] if (negatives[0] and cfg_on) else torch.zeros_like(enc[0][1])
    return pos, neg, enc[0][1], neg_pooled


class RegionsAttnProcessor:
    """A cross-attention layer's processor: the regional text attention, one prompt at a time, then (when
    the layer's original processor is diffusers' IPAdapterAttnProcessor2_0 and the call carries image
    tokens) its masked image attention exactly as IPAdapterAttnProcessor2_0 computes it with
    ip_adapter_masks, before to_out. `state`: contexts (one [rows, 77k, C] per prompt, rows in the
    pipeline's CFG order), the weights at each grid, the latent size, the IP masks."""

    def __init__(self, original, state: dict):
        self.original, self.state = original, state

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, **kwargs):
        from diffusers.image_processor import IPAdapterMaskProcessor

        assert hidden_states.ndim == 3 and attention_mask is None and not attn.norm_cross
        ip_states = None
        if isinstance(encoder_hidden_states, tuple):
            encoder_hidden_states, ip_states = encoder_hidden_states
        st = self.state
        # The pipeline's own context must be prompt 0's: the rows are in the order assumed here.
        assert torch.equal(encoder_hidden_states, st["contexts"][0])
        batch, tokens = hidden_states.shape[:2]
        weights = st["weights"](cell_grid(*st["latent"], tokens))
        query = attn.to_q(hidden_states)
        head_dim = query.shape[-1] // attn.heads
        query = query.view(batch, -1, attn.heads, head_dim).transpose(1, 2)

        def attend(key, value):
            key = key.view(batch, -1, attn.heads, head_dim).transpose(1, 2)
            value = value.view(batch, -1, attn.heads, head_dim).transpose(1, 2)
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False)
            return out.transpose(1, 2).reshape(batch, -1, attn.heads * head_dim).to(query.dtype)

        hidden = None
        for w, ctx in zip(weights, st["contexts"]):
            term = w[None, :, None] * attend(attn.to_k(ctx), attn.to_v(ctx))
            hidden = term if hidden is None else hidden + term
        if ip_states is not None and st.get("ip_masks") is not None:
            ip, mask = self.original, st["ip_masks"]
            (scales,), (states,), (to_k_ip,), (to_v_ip,) = ip.scale, ip_states, ip.to_k_ip, ip.to_v_ip
            for i in range(mask.shape[1]):  # IPAdapterAttnProcessor2_0's loop over one adapter's masked images
                current = attend(to_k_ip(states[:, i, :, :]), to_v_ip(states[:, i, :, :]))
                down = IPAdapterMaskProcessor.downsample(mask[:, i, :, :], batch, current.shape[1], current.shape[2])
                hidden = hidden + scales[i] * (current * down.to(dtype=query.dtype, device=query.device))
        hidden = attn.to_out[1](attn.to_out[0](hidden))
        if attn.residual_connection:
            hidden = hidden + hidden_states
        return hidden / attn.rescale_output_factor


@contextlib.contextmanager
def regions_installed(unet, state: dict):
    """RegionsAttnProcessor on every attn2 of the UNet (wrapping its processor) for the duration."""
    saved = dict(unet.attn_processors)
    unet.set_attn_processor({n: (RegionsAttnProcessor(p, state) if n.endswith("attn2.processor") else p)
                             for n, p in saved.items()})
    try:
        yield
    finally:
        unet.set_attn_processor(saved)


def ip_masks(task: dict, refs: list[tuple[int, dict]], base: Path) -> torch.Tensor:
    """The characters' regions as diffusers' IPAdapterMaskProcessor().preprocess makes masks at the image
    size (a box drawn at pixel centres, a PNG as given), one image per reference: [1, M, H, W]."""
    from diffusers.image_processor import IPAdapterMaskProcessor

    h, w = task["height"], task["width"]
    pils = []
    for i, _ in refs:
        r = task["regions"][i]
        if "box" in r:
            pils.append(Image.fromarray((box_grid(r["box"], h, w).numpy() * 255).astype(np.uint8)))
        else:
            pils.append(Image.open(base / r["mask"]))
    masks = IPAdapterMaskProcessor().preprocess(pils, height=h, width=w)
    return masks.reshape(1, masks.shape[0], masks.shape[2], masks.shape[3])


def run_pipe(pipe, embeds: dict, task: dict, **extra):
    """One image of `pipe` from prompt embeddings, as reference_sdxl.generate calls it (Euler unless the task
    names a sampler, a CPU generator list of one, the last step's latents captured) -> (PIL, latents)."""
    pipe.scheduler = make_scheduler(pipe.sdxl_base_scheduler_config, task.get("sampler", "Euler"),
                                    task.get("schedule", "Automatic"))
    captured = {}

    def on_step_end(p, i, t, kwargs):
        if i == p.num_timesteps - 1:
            captured["latents"] = kwargs["latents"].detach().clone()
        return kwargs

    with torch.inference_mode():
        out = pipe(**embeds, num_inference_steps=task["steps"], guidance_scale=task["cfg"], width=task["width"],
                   height=task["height"], guidance_rescale=0.0,
                   generator=[torch.Generator("cpu").manual_seed(task["seed"])], output_type="pil",
                   callback_on_step_end=on_step_end, callback_on_step_end_tensor_inputs=["latents"], **extra)
    return out.images[0], captured["latents"].float().cpu().numpy().astype(np.float32)


def generate_regions(pipe, task: dict, characters: dict | None = None, base: Path = Path(".")):
    """The image of one batch-file task with "regions" (and "region_base", default 0.2) on a pipeline of
    reference_sdxl.load_pipeline (seed, steps, cfg, width, height from the task; paths relative to `base`).
    A region's character with a "reference" needs `pipe` to have the task's IP-Adapter loaded
    (load_ip_adapter). -> (PIL image, final latents float32)."""
    prompts, negatives, refs = resolve(task, characters or {})
    cfg_on = task["cfg"] > 1.0
    pos, neg, pooled, neg_pooled = encode_task(pipe, prompts, negatives, cfg_on)
    regions, region_base = task.get("regions", []), float(task.get("region_base", 0.2))
    grids: dict = {}

    def weights_at(grid):
        if grid not in grids:
            grids[grid] = region_weights(regions, region_base, base, *grid)
        return grids[grid]

    contexts = [torch.cat([n, p]) if cfg_on else p for n, p in zip(neg, pos)]
    scale = pipe.vae_scale_factor
    state = {"contexts": contexts, "weights": weights_at, "latent": (task["height"] // scale, task["width"] // scale)}
    extra = {}
    if refs:
        state["ip_masks"] = ip_masks(task, refs, base)
        pipe.set_ip_adapter_scale([[float(ref.get("scale", 1.0)) for _, ref in refs]])
        extra["ip_adapter_image"] = [[Image.open(base / ref["image"]).convert("RGB") for _, ref in refs]]
    embeds = {"prompt_embeds": pos[0], "pooled_prompt_embeds": pooled, "negative_prompt_embeds": neg[0],
              "negative_pooled_prompt_embeds": neg_pooled}
    with regions_installed(pipe.unet, state):
        return run_pipe(pipe, embeds, task, **extra)
