#!/usr/bin/env python3
"""Parity (ctest label parity): regional prompts (issue 59) vs reference.regions_reference on the tiny model, CPU.

Python only (no sdxl-batch; --python-only runs just these):
  - the reference checked on its own: a task without regions == reference_sdxl.generate (the plain pipeline)
    bit for bit; one region of the whole panel, weight 1, region_base 0 == the plain pipeline given the
    region's prompt as context (and the task's pooled embedding) bit for bit; the regions and the
    references change the image (PSNR < ACTS_MAX_PSNR);
  - export_sdxl.py --max-regions outside 1..32 is refused (exit 2, naming the flag); --model's
    model.json unet.regions: downscales [2, 4], a downscale index per cross-attention layer, max_regions;
  - unet.ts forward_regional on the task's encoded prompts and the weights the reference computes at each
    unet.regions downscale == diffusers' UNet with the reference's processors; forward_regional_ip with
    two masked reference images (k / v from the adapter's to_k_ip / to_v_ip, the scale in v, the masks
    IPAdapterMaskProcessor.downsample's) == diffusers' UNet with the adapter loaded; max |diff| <= UNET_TOL;
  - sdxl-batch (one `run` of one batch file, 64x64, 4 Euler steps, cfg 5, fp32) vs the reference,
    PSNR >= 65 dB: (a) "boxes-mask": two box regions (one with its own negative, one with emphasis) and a
    grey PNG-mask region (30x30: area averaging over uneven cells) with a long prompt (two chunks, so every
    prompt of the task is padded to two), region_base 0.2; (b) "characters": two characters with reference
    pictures (the task's IP-Adapter, scales 0.7 and 0.4) and negatives in two box regions; (c) "plain": a
    task without regions, whose PNG must be byte-identical to the same task run alone in a batch without
    regions (today's code path).

    PYTHONPATH=tests parity_regions.py --binary B --model TINY --diffusers TINY_DIFFUSERS --work DIR
    PYTHONPATH=tests parity_regions.py --python-only --model TINY --diffusers TINY_DIFFUSERS --work DIR
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from parity_common import finish, parse_args, run_ours_batch
from PIL import Image
from testkit import meta_of
from testkit import run_ok as run

from reference.compare_images import load_rgb, psnr
from reference.reference_sdxl import a1111_encode, generate, load_pipeline
from reference.regions_reference import (encode_task, generate_regions, ip_masks, region_weights, regions_installed,
                                         residual_size, resolve, run_pipe)

EXPORT = Path(__file__).resolve().parents[2] / "scripts" / "export_sdxl.py"
MIN_PSNR, ACTS_MAX_PSNR, UNET_TOL = 65.0, 60.0, 1e-4
SETTINGS = {"seed": 21, "steps": 4, "cfg": 5.0, "sampler": "Euler", "width": 64, "height": 64}
LONG = ", ".join(["an old man with a grey beard and a heavy wool coat"] * 8)  # > 75 tokens: two chunks
TASKS = {
    "boxes-mask": {"prompt": "two people talking on a pier, (ink:1.2)", "negative": "blurry", **SETTINGS,
                   "regions": [{"box": [0, 0, 0.5, 1], "prompt": "a woman waving, (red scarf:1.3)"},
                               {"box": [0.25, 0.5, 1, 1], "prompt": "a dog", "negative": "ugly", "weight": 1.5},
                               {"mask": "masks/right.png", "prompt": LONG, "weight": 0.8}],
                   "region_base": 0.2},
    "characters": {"prompt": "two people talking, comic panel", "negative": "lowres", **SETTINGS,
                   "regions": [{"box": [0, 0, 0.5, 1], "prompt": "a woman waving", "character": "mara"},
                               {"box": [0.5, 0, 1, 1], "prompt": "an old man", "negative": "blurry",
                                "character": "keeper"}],
                   "region_base": 0.2},
    "plain": {"prompt": "two people talking on a pier, (ink:1.2)", "negative": "blurry", **SETTINGS},
}
CHARACTERS = {"mara": {"prompt": "red scarf", "negative": "hat",
                       "reference": {"image": "refs/mara.png", "scale": 0.7}},
              "keeper": {"prompt": "grey beard", "negative": "",
                         "reference": {"image": "refs/keeper.png", "scale": 0.4}}}


def make_inputs(work: Path) -> None:
    """masks/right.png (30x30 grey: 0 on the left third, a ramp, 255 on the right) and two reference pictures."""
    (work / "masks").mkdir(exist_ok=True)
    (work / "refs").mkdir(exist_ok=True)
    x = np.clip((np.arange(30) - 10) * 255.0 / 12, 0, 255)
    Image.fromarray(np.tile(x, (30, 1)).astype(np.uint8)).save(work / "masks" / "right.png")
    yy, xx = np.mgrid[0:48, 0:40].astype(np.float32)
    for name, base in (("mara", (200, 40, 50)), ("keeper", (60, 90, 160))):
        arr = np.stack([base[0] + 50 * np.sin(xx / 5), base[1] + 80 * yy / 48, base[2] - 60 * xx / 40], -1)
        Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(work / "refs" / f"{name}.png")


def same(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max()) if a.shape == b.shape else float("inf")


def self_check_rows(pipe, work: Path) -> tuple[list[dict], dict]:
    """The reference against the plain pipeline (no regions; one whole-panel region) and the regions'
    effect. -> (rows, {tag: (PIL, latents)} of the references made on the way)."""
    plain = TASKS["plain"]
    img0, lat0 = generate(pipe, plain["prompt"], plain["negative"], plain["seed"], plain["steps"], plain["cfg"],
                          plain["width"], plain["height"], "Euler")
    img1, lat1 = generate_regions(pipe, plain, {}, work)
    d0 = max(same(lat0, lat1), same(np.asarray(img0, np.float32), np.asarray(img1, np.float32)))
    whole = dict(plain, regions=[{"box": [0, 0, 1, 1], "prompt": "a lighthouse keeper, (red scarf:1.2)"}],
                 region_base=0.0)
    img2, lat2 = generate_regions(pipe, whole, {}, work)
    with torch.inference_mode():
        (_, pooled), (z_region, _), (z_neg, neg_pooled) = a1111_encode(
            pipe, [plain["prompt"], whole["regions"][0]["prompt"], plain["negative"]])
    img3, lat3 = run_pipe(pipe, {"prompt_embeds": z_region, "pooled_prompt_embeds": pooled,
                                 "negative_prompt_embeds": z_neg, "negative_pooled_prompt_embeds": neg_pooled}, plain)
    d1 = max(same(lat2, lat3), same(np.asarray(img2, np.float32), np.asarray(img3, np.float32)))
    refs = {"plain": (img1, lat1), "boxes-mask": generate_regions(pipe, TASKS["boxes-mask"], {}, work)}
    unreferenced = {n: {k: v for k, v in c.items() if k != "reference"} for n, c in CHARACTERS.items()}
    refs["characters-unreferenced"] = generate_regions(pipe, TASKS["characters"], unreferenced, work)
    p = psnr(np.asarray(refs["boxes-mask"][0]), np.asarray(img1))
    rows = [{"case": "reference: no regions == plain pipeline", "what": "max |diff| of latents and pixels",
             "value": d0, "ok": d0 == 0.0},
            {"case": "reference: whole-panel region == its prompt", "what": "max |diff| of latents and pixels vs "
             "the plain pipeline on the region's prompt", "value": d1, "ok": d1 == 0.0},
            {"case": "reference: the regions act", "what": "PSNR dB of boxes-mask vs plain", "value": p,
             "ok": p < ACTS_MAX_PSNR}]
    return rows, refs


def cells_row(work: Path) -> dict:
    """The reference's masks at the 2 x 2 grid of a 64 x 64 panel, worked out by hand: box [0, 0, 0.5, 1]
    holds the left column's centres (x 0.25), box [0.25, 0.5, 1, 1] the bottom row's; masks/right.png's
    15 x 15 halves average (0 + 21 + 42 + 63 + 85) / 15 / 255 on the left and (106 + 127 + 148 + 170 + 191 +
    212 + 233 + 8 * 255) / 15 / 255 on the right (its uint8 ramp)."""
    from reference.regions_reference import region_cells

    left, right = (0 + 21 + 42 + 63 + 85) / 15 / 255, (1187 + 8 * 255) / 15 / 255
    want = [[1, 0, 1, 0], [0, 0, 1, 1], [left, right, left, right]]
    got = [region_cells(r, work, 2, 2).tolist() for r in TASKS["boxes-mask"]["regions"]]
    d = float(np.abs(np.array(got) - np.array(want)).max())
    return {"case": "reference: masks at a 2 x 2 grid", "what": "max |diff| vs the masks worked out by hand",
            "value": d, "ok": d <= 1e-6}


def flag_rows(model: Path) -> list[dict]:
    """--max-regions outside 1..32 refused before torch loads; model.json unet.regions as the contract says."""
    rows = []
    for n in (0, 33):
        r = subprocess.run([sys.executable, str(EXPORT), "--tiny", "--out", "/nonexistent/x", "--max-regions", str(n)],
                           capture_output=True, text=True)
        msg = (r.stderr.strip().splitlines() or [""])[-1]
        rows.append({"case": f"export --max-regions {n} refused", "what": msg[-76:], "value": float(r.returncode),
                     "ok": r.returncode == 2 and "--max-regions" in msg and "1..32" in msg})
    u = meta_of(model)["unet"]
    reg = u.get("regions", {})
    ok = (reg.get("downscales") == [2, 4] and len(reg.get("layers", [])) == len(u["ip_adapter"]["layers"])
          and set(reg["layers"]) == {0, 1} and reg.get("max_regions") == 8)
    rows.append({"case": "model.json unet.regions", "what": json.dumps(reg)[:76], "value": float(ok), "ok": ok})
    return rows


def unet_inputs_for(pipe, task: dict, characters: dict, work: Path, model: Path):
    """A CFG pair of rows for the task at one timestep: (diffusers' UNet arguments, unet.ts's first five
    with the 4-D contexts, the weights per unet.regions downscale, the reference's processor state)."""
    prompts, negatives, _ = resolve(task, characters)
    with torch.inference_mode():
        pos, neg, pooled, neg_pooled = encode_task(pipe, prompts, negatives, True)
    contexts = [torch.cat([n, p]) for n, p in zip(neg, pos)]
    lat_h, lat_w = task["height"] // 8, task["width"] // 8
    gen = torch.Generator().manual_seed(5)
    latent, t = torch.randn(2, 4, lat_h, lat_w, generator=gen), torch.tensor([601.0, 601.0])
    te = torch.cat([neg_pooled, pooled])
    tid = torch.tensor([[float(task["height"]), float(task["width"]), 0.0, 0.0, float(task["height"]),
                         float(task["width"])]] * 2)
    regions, base = task.get("regions", []), float(task.get("region_base", 0.2))
    weights = tuple(region_weights(regions, base, work, residual_size(lat_h, d), residual_size(lat_w, d))[None]
                    .expand(2, -1, -1).contiguous() for d in meta_of(model)["unet"]["regions"]["downscales"])
    state = {"contexts": contexts, "latent": (lat_h, lat_w),
             "weights": lambda grid: region_weights(regions, base, work, *grid)}
    return (latent, t, contexts[0], te, tid), (latent, t, torch.stack(contexts, 1), te, tid), weights, state


def unet_row(tag: str, ours: torch.Tensor, ref: torch.Tensor) -> dict:
    d = float((ours - ref).abs().max())
    return {"case": f"unet.ts {tag}", "what": f"max |diff| vs diffusers' UNet + reference processors (ref max "
            f"{float(ref.abs().max()):.3g})", "value": d, "ok": d <= UNET_TOL}


def unet_text_row(pipe, unet_ts, work: Path, model: Path) -> dict:
    """forward_regional == diffusers' UNet with regions_reference's processors, on the boxes-mask task."""
    d_in, ts_in, weights, state = unet_inputs_for(pipe, TASKS["boxes-mask"], {}, work, model)
    lat, t, ctx, te, tid = d_in
    with torch.inference_mode(), regions_installed(pipe.unet, state):
        ref = pipe.unet(lat, t, encoder_hidden_states=ctx, added_cond_kwargs={"text_embeds": te, "time_ids": tid},
                        return_dict=False)[0]
    with torch.inference_mode():
        ours = unet_ts.forward_regional(*ts_in, weights)
    return unet_row("forward_regional (boxes-mask)", ours, ref)


def unet_ip_row(pipe, unet_ts, work: Path, model: Path) -> dict:
    """forward_regional_ip == diffusers' UNet with the adapter loaded and the reference's processors (the
    masked loop of IPAdapterAttnProcessor2_0), on the characters task: ip_kv from each layer's to_k_ip /
    to_v_ip on the projected image tokens, v times the character's scale; ip_masks per downscale from
    IPAdapterMaskProcessor.downsample."""
    from diffusers.image_processor import IPAdapterMaskProcessor

    task = TASKS["characters"]
    d_in, ts_in, weights, state = unet_inputs_for(pipe, task, CHARACTERS, work, model)
    lat, t, ctx, te, tid = d_in
    _, _, refs = resolve(task, CHARACTERS)
    scales = [float(r["scale"]) for _, r in refs]
    pipe.set_ip_adapter_scale([scales])
    images = [[Image.open(work / r["image"]).convert("RGB") for _, r in refs]]
    with torch.inference_mode():
        embeds = pipe.prepare_ip_adapter_image_embeds(images, None, torch.device("cpu"), 1, True)
        states = pipe.unet.encoder_hid_proj(embeds)[0]  # [2, M, T, cross_dim]
    state["ip_masks"] = masks = ip_masks(task, refs, work)
    ip_kv = []
    for name, proc in pipe.unet.attn_processors.items():
        if name.endswith("attn2.processor"):
            with torch.inference_mode():
                k, v = proc.to_k_ip[0](states), proc.to_v_ip[0](states)
            ip_kv += [k, v * torch.tensor(scales)[None, :, None, None]]
    lat_h, lat_w = lat.shape[-2:]
    ip_m = tuple(torch.stack([IPAdapterMaskProcessor.downsample(masks[:, i], 2, n, 1)[..., 0]
                              for i in range(masks.shape[1])], 1)
                 for n in (residual_size(lat_h, d) * residual_size(lat_w, d)
                           for d in meta_of(model)["unet"]["regions"]["downscales"]))
    with torch.inference_mode(), regions_installed(pipe.unet, state):
        ref = pipe.unet(lat, t, encoder_hidden_states=ctx, return_dict=False,
                        added_cond_kwargs={"text_embeds": te, "time_ids": tid, "image_embeds": embeds})[0]
    with torch.inference_mode():
        ours = unet_ts.forward_regional_ip(*ts_in, weights, tuple(ip_kv), ip_m)
    return unet_row("forward_regional_ip (characters)", ours, ref)


def ip_pipeline(pipe, fixture: Path):
    """The pipeline's components with the fixture's plain encoder and IP-Adapter loaded (load_ip_adapter)."""
    from diffusers import StableDiffusionXLPipeline
    from transformers import CLIPImageProcessor, CLIPVisionModelWithProjection

    enc = CLIPVisionModelWithProjection.from_pretrained(str(fixture / "plain" / "image_encoder"), dtype=torch.float32,
                                                        local_files_only=True).eval()
    s = enc.config.image_size
    parts = {k: v for k, v in pipe.components.items() if k not in ("image_encoder", "feature_extractor")}
    ip = StableDiffusionXLPipeline(**parts, image_encoder=enc, feature_extractor=CLIPImageProcessor(size=s, crop_size=s),
                                   add_watermarker=False)
    ip.set_progress_bar_config(disable=True)
    ip.sdxl_base_scheduler_config = pipe.sdxl_base_scheduler_config
    ip.load_ip_adapter(str(fixture / "plain"), subfolder="", weight_name="ip-adapter-plain.safetensors",
                       image_encoder_folder=None)
    return ip


def binary_rows(a, work: Path, refs: dict, fixture: Path) -> list[dict]:
    """(a), (b), (c) as tasks of ONE `sdxl-batch run`, and (c) alone in a batch without regions."""
    ip_dir = work / "ip-plain"
    run([sys.executable, str(EXPORT), "--ip-adapter", str(fixture / "plain" / "ip-adapter-plain.safetensors"),
         "--image-encoder", str(fixture / "plain" / "image_encoder"), "--out", str(ip_dir), "--force", "--dtype",
         "fp32", "--device", "cpu", "--threads", "1"], "export --ip-adapter plain")
    tasks = copy.deepcopy(TASKS)
    tasks["characters"]["ip_adapter"] = {"model": str(ip_dir), "images": [], "scale": 1}
    pngs = run_ours_batch(a, work, tasks, top={"characters": CHARACTERS})
    rows = []
    for tag in ("boxes-mask", "characters"):
        p = psnr(load_rgb(str(pngs[tag])), np.asarray(refs[tag][0]))
        rows.append({"case": f"sdxl-batch: {tag}", "what": "PSNR dB vs regions_reference", "value": p,
                     "ok": p >= MIN_PSNR})
    together = pngs["plain"].read_bytes()
    alone = run_ours_batch(a, work, {"plain": TASKS["plain"]})["plain"].read_bytes()
    rows.append({"case": "sdxl-batch: plain (no regions)", "what": "PNG bytes equal to the task run alone without "
                 "regions (1 = yes)", "value": float(together == alone), "ok": together == alone})
    return rows


def main() -> int:
    def extra(ap):
        ap.add_argument("--python-only", action="store_true",
                        help="only the reference's self-checks, the export's flag and layout, and unet.ts vs diffusers")
        ap.set_defaults(min_psnr=MIN_PSNR)

    a, work = parse_args(__doc__, extra, binary_required="--python-only" not in sys.argv)
    torch.set_num_threads(1)
    make_inputs(work)
    model = Path(a.model)
    rows = flag_rows(model) + [cells_row(work)]
    pipe, _ = load_pipeline(a.diffusers)
    self_rows, refs = self_check_rows(pipe, work)
    rows += self_rows
    unet_ts = torch.jit.load(str(model / "unet.ts"))
    rows.append(unet_text_row(pipe, unet_ts, work, model))
    from reference.ip_adapter_fixture import write

    fixture = work / "fixture"
    write(Path(a.diffusers), fixture, 31, "tiny", ["plain"])
    ip = ip_pipeline(pipe, fixture)
    rows.append(unet_ip_row(ip, unet_ts, work, model))
    refs["characters"] = generate_regions(ip, TASKS["characters"], CHARACTERS, work)
    p = psnr(np.asarray(refs["characters"][0]), np.asarray(refs["characters-unreferenced"][0]))
    rows.append({"case": "reference: the references act", "what": "PSNR dB of characters with vs without their "
                 "reference pictures", "value": p, "ok": p < ACTS_MAX_PSNR})
    for tag in ("boxes-mask", "characters"):
        refs[tag][0].save(work / f"{tag}-ref.png")
    if not a.python_only:
        rows += binary_rows(a, work, refs, fixture)
    failed = not all(r["ok"] for r in rows)
    return finish(rows, [("case", "case", "<44"), ("what", "what", "<76"), ("value", "value", ">10.3g")],
                  work / "parity_regions.json", failed,
                  "the regions reference, the export's regional methods or sdxl-batch's regions are wrong "
                  "(images below {min_psnr} dB)", ": regions match the reference", MIN_PSNR)


if __name__ == "__main__":
    sys.exit(main())
