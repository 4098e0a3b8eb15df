"""Export SDXL as TorchScript modules into a model directory that sdxl-batch loads.

Sources (exactly one):
  --tiny          random tiny SDXL-shaped weights (CI; seconds on CPU)
  --tiny-aoti     the tiny model with a shallower UNet (one resnet and one transformer layer per
                  block): what the AOTI test compiles with --aoti (AOTInductor's CPU compile grows
                  with the UNet's op count)
  --random-full   the real SDXL base architecture with random weights (2.57 B UNet)
  --from DIR      a diffusers-format SDXL directory (real weights, local files only)
  --from FILE     a single-file checkpoint (.safetensors, original Stability / A1111 layout);
                  architecture: SDXL base's, or --config DIR (scripts/export/checkpoint.py)
                  An SDXL inpainting model (a UNet of 9 input channels: latents, mask, masked
                  image latents) exports from either; model.json /unet/in_channels records 9.
  --vae FILE|DIR  (with --from) this VAE instead of the checkpoint's
  --vae-only      only the VAE of --vae, as a VAE folder a task can name ("vae")
  --controlnet SRC an SDXL ControlNet (diffusers folder, or one .safetensors file in the
                  diffusers or the original layout) as a ControlNet folder
                  (scripts/export/controlnet.py); --config DIR|config.json its architecture
  --upscaler FILE [FILE...]
                  upscaler models as published (.pth, .pt, .safetensors: ESRGAN / Real-ESRGAN RRDBNet,
                  Real-ESRGAN Compact, SwinIR, HAT, DAT, ... as spandrel recognises them), each as an
                  upscaler folder --out/<file stem> (scripts/export/upscaler.py)
  --ip-adapter FILE --image-encoder DIR
                  an SDXL IP-Adapter (one .safetensors file, the original layout) and its CLIP
                  vision encoder (a transformers folder) as an IP-Adapter folder
                  (scripts/export/ip_adapter.py)
  --tiny-ip-adapter DIR, --tiny-controlnet DIR
                  a tiny random plain IP-Adapter (with its tiny CLIP vision encoder) or ControlNet for the
                  model whose diffusers folder DIR is (--tiny --save-diffusers DIR), seeded by --seed, as an
                  IP-Adapter or ControlNet folder (scripts/export/tiny_adapters.py; the example batch's);
                  --source-only writes the sources instead (the test fixtures')
  --detector FILE.pt
                  an Ultralytics YOLO detection or segmentation checkpoint (ADetailer's face_yolov8n.pt,
                  hand_yolov8n.pt, person_yolov8n-seg.pt ...) as a detector folder --out
                  (scripts/export/detector.py)
--print-config tiny|tiny-aoti|full prints the configs --tiny / --tiny-aoti / --random-full build, as JSON
(the test references make files that fit the exported model from it).

Output (see docs/models-and-export.md, the model directory):
  model.json, text_encoder.ts, text_encoder_2.ts, unet.ts, vae_decoder.ts,
  vae_encoder.ts, tokenizer/, tokenizer_2/

Module contracts (all traced on --device, weights in the model dtype; the
parameter names inside each .ts equal the diffusers / transformers state-dict
keys of that component, so LoRA keys map without a prefix):
  text_encoder.ts    ids int64 [B,77] -> (penultimate hidden [B,77,H1], pooled [B,H1])
  text_encoder_2.ts  ids int64 [B,77] -> (penultimate hidden [B,77,H2], text_embeds [B,P])
  unet.ts            (latent [B,C,h,w], timestep f32 [B], context [B,77k,H1+H2],
                      text_embeds [B,P], time_ids [B,6]) -> noise prediction [B,4,h,w];
                     C = 4, or 9 for an inpainting UNet (latents, mask, masked image latents)
                     (floating inputs are cast to the model dtype inside, the
                      timestep to float32; output is in the model dtype)
                     method forward_control(the same five, residuals): residuals is a tuple
                     of N+1 tensors, a ControlNet's N down-block residuals in diffusers'
                     order then its mid residual (model.json unet.control gives N, their
                     channels and downscales); = diffusers' UNet with
                     down_block_additional_residuals / mid_block_additional_residual
                     method forward_ip(the same five, ip_kv) and
                     forward_control_ip(the same five, residuals, ip_kv): ip_kv is a tuple of
                     2L tensors (k_0, v_0, .., k_{L-1}, v_{L-1}), one pair per cross-attention
                     layer (attn2) in the order of diffusers' unet.attn_processors (= the
                     IP-Adapter file's ip_adapter.1, .3, .5, ..), each [B, T, C_l] (row b goes
                     with the latent's row b: CFG's negative rows take the negative image
                     tokens; T image tokens, C_l = that layer's to_k out_features; model.json
                     unet.ip_adapter.layers), cast to the model dtype inside. Each attn2 adds
                     sdpa(q, k_l, v_l) to its text attention before to_out: = diffusers'
                     IPAdapterAttnProcessor2_0 with one adapter when the caller passes
                     v_l = scale * to_v_ip(tokens) (the IP scale goes into v); several reference
                     images are their tokens concatenated along dim 1
                     method forward_regional(latent, timestep, contexts, text_embeds, time_ids,
                     weights) and forward_regional_control(.., weights, residuals),
                     forward_regional_ip(.., weights, ip_kv, ip_masks),
                     forward_regional_control_ip(.., weights, residuals, ip_kv, ip_masks):
                     regional prompts (attention couple). contexts [B,R,77k,H1+H2]: R >= 1
                     prompts a row (0 = the task's own, then each region; R - 1 <= model.json
                     unet.regions.max_regions, --max-regions); weights a tuple of one [B,R,n_d]
                     per unet.regions.downscales entry d (n_d = the latent's cells after
                     log2(d) stride-2 convolutions, row-major), >= 0 and summing to 1 over R;
                     each attn2 of downscale d: to_out(sum_r weights_d[:,r,:,None] *
                     sdpa(q, K_r, V_r)); ip_kv a k and a v [B,M,T,C_l] per cross-attention
                     layer (M masked groups, one reference image each, scale in v), ip_masks
                     one [B,M,n_d] per downscale: + sum_m ip_masks_d[:,m,:,None] *
                     sdpa(q, k_m, v_m) before to_out (diffusers' ip_adapter_masks)
  vae_decoder.ts     latent / scaling_factor [B,4,h,w] -> image [B,3,8h,8w] in [-1,1]
  vae_encoder.ts     image [B,3,H,W] in [-1,1] -> latent mean [B,4,H/8,W/8] (unscaled)
  unet.pt2           (--aoti) the same UNet wrapper, torch.export'ed and compiled by
                     AOTInductor for --device; same inputs as unet.ts, but each must
                     have the recorded dtype and be contiguous. The package holds
                     NO weights (aot_inductor.package_constants_in_so=False): the
                     loader takes unet.ts's parameters as user-managed constants,
                     so they live once in memory and LoRA patches reach both
                     (AOTInductor inlines a few tiny tensors, e.g. conv_out.bias, as
                     literals: those are not constants and LoRAs must not touch them).
  unet_fp8.ts        (--fp8) unet.ts with the transformer blocks' linear layers in FP8 e4m3
                     (scripts/export/fp8_quant.py: the layers, the scales, their calibration); the
                     same methods and inputs; sdxl-batch --precision fp8 runs it
  unet_fp8.pt2       (--fp8 --aoti) unet_fp8.ts's UNet compiled by AOTInductor, as unet.pt2;
                     with --fp8-conv also the 3x3 convolutions in FP8 (scripts/export/fp8_conv.py:
                     Triton kernels compiled into the package; unet_fp8.ts runs their math in torch);
                     with --fp8-geglu (experimental) each feed-forward's GEGLU fused into its first
                     FP8 GEMM (scripts/export/fp8_geglu.py, the same way)

The UNet is traced at a latent size that is NOT a multiple of 2**num_upsamplers,
so the graph carries diffusers' forward_upsample_size path: every up-sampler
interpolates to the (dynamic) size of its skip connection. For latent sizes that
are multiples of 4 this is bit-identical to scale_factor=2, and it also makes
every multiple of 8 px work (limits.size_multiple = 8). --check verifies it.
"""
from __future__ import annotations

import argparse
import faulthandler
import importlib
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from .architecture import ARCHITECTURES, TINY_KINDS, architecture
from .inputs import file_or_folder, folder, read_header, regular_file

REPO = Path(__file__).resolve().parents[2]
# --upscaler-tile's range: the runtime's tiles overlap by 32 px (a tile must leave a step beyond it), and a
# window-attention model's memory grows with the tile's area (8192 took over 10 GB to trace).
UPSCALER_TILE = (64, 1024)
DTYPE_NAMES = ("bf16", "fp16", "fp32")  # common.DTYPES's keys (common imports torch: cli does so only to export)

# The export kinds, one per source flag: (the flag's dest, the kind's name, the module of this
# package whose export(a, job) writes it; imported once the inputs are checked). The kind's name
# is what the log and a random model's model.json "source" say. A new kind (an upscaler, a
# detector) is a module with export(a, job), a flag in build_parser's source group (its rules in
# check_args, its input files in check_inputs) and a row here.
KINDS = (
    ("tiny", "tiny", "sdxl"),
    ("tiny_aoti", "tiny-aoti", "sdxl"),
    ("random_full", "random-full", "sdxl"),
    ("from_path", "from", "sdxl"),
    ("vae_only", "vae-only", "vae"),
    ("controlnet", "controlnet", "controlnet"),
    ("ip_adapter", "ip-adapter", "ip_adapter"),
    ("tiny_ip_adapter", "tiny-ip-adapter", "ip_adapter"),  # its sources drawn first (tiny_adapters)
    ("tiny_controlnet", "tiny-controlnet", "controlnet"),
    ("upscaler", "upscaler", "upscaler"),  # export_all(a): several files, one folder each under --out
    ("detector", "detector", "detector"),
)


class PrintConfig(argparse.Action):
    """--print-config ARCH: print architecture(ARCH) as JSON and exit (no other argument needed)."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(json.dumps(architecture(values), indent=1))
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tiny", action="store_true")
    src.add_argument("--tiny-aoti", action="store_true",
                     help="the tiny model with a shallower UNet (one resnet and one transformer layer per block), "
                          "for the AOTI test: AOTInductor's CPU compile time grows with the UNet's op count")
    src.add_argument("--random-full", action="store_true")
    src.add_argument("--vae-only", action="store_true",
                     help="export only the VAE given by --vae, as a VAE folder that tasks can swap in "
                          "(\"vae\" in a batch file, --vae on the CLI)")
    src.add_argument("--from", dest="from_path", metavar="DIR|FILE",
                     help="real weights: a diffusers SDXL folder, or a single-file checkpoint (.safetensors, the "
                          "original Stability / A1111 layout)")
    src.add_argument("--controlnet", metavar="DIR|FILE",
                     help="export one SDXL ControlNet (a diffusers folder, or a .safetensors file in the diffusers "
                          "or the original layout) as a ControlNet folder a task can name")
    src.add_argument("--ip-adapter", metavar="FILE",
                     help="export one SDXL IP-Adapter (.safetensors: image_proj.*, ip_adapter.*; plain or plus) "
                          "and its --image-encoder as an IP-Adapter folder a task can name")
    src.add_argument("--tiny-ip-adapter", metavar="DIFFUSERS_DIR",
                     help="a tiny random plain IP-Adapter for the model of this diffusers folder (its unet/config.json; "
                          "--tiny --save-diffusers DIR), exported as --ip-adapter would")
    src.add_argument("--tiny-controlnet", metavar="DIFFUSERS_DIR",
                     help="a tiny random ControlNet from the UNet of this diffusers folder (from_unet, the zero "
                          "convolutions re-drawn), exported as --controlnet would")
    src.add_argument("--upscaler", nargs="+", metavar="FILE",
                     help="export upscaler models (.pth, .pt, .safetensors; the architectures spandrel recognises) "
                          "as upscaler folders --out/<file stem> a task's \"upscale\" can name")
    src.add_argument("--detector", metavar="FILE.pt",
                     help="export an Ultralytics YOLO detection or segmentation checkpoint (.pt, YOLOv8 / YOLO11, "
                          "as published for ADetailer) as a detector folder for `sdxl-batch detect`")
    ap.add_argument("--upscaler-tile", type=int, default=512, metavar="T",
                    help="with --upscaler: the tile size window-attention architectures (SwinIR, HAT, DAT) are "
                         "traced at and run at (default 512, ComfyUI's tile)")
    ap.add_argument("--print-config", choices=list(ARCHITECTURES), action=PrintConfig,
                    help="print the diffusers / transformers configs and the scheduler config of the --tiny, "
                         "--tiny-aoti or --random-full architecture as JSON, and exit")
    ap.add_argument("--config", metavar="DIR",
                    help="with --from FILE: the architecture as a diffusers-layout folder (configs, scheduler, "
                         "tokenizers; weights not needed); default: SDXL base 1.0's built-in configs. With "
                         "--controlnet FILE: the ControlNet's config.json (or a folder holding it, or a diffusers "
                         "SDXL folder whose unet/config.json the ControlNet is derived from)")
    ap.add_argument("--vae", metavar="FILE|DIR",
                    help="with --from: this VAE instead of the checkpoint's (a diffusers VAE folder, or a "
                         ".safetensors VAE file in the original or the diffusers layout)")
    ap.add_argument("--image-encoder", metavar="DIR",
                    help="with --ip-adapter: the CLIP vision encoder it was trained with, a transformers folder "
                         "(config.json + model.safetensors, CLIPVisionModelWithProjection)")
    ap.add_argument("--source-only", action="store_true",
                    help="with --tiny-ip-adapter / --tiny-controlnet: write the sources to --out (IP-Adapters: "
                         "<variant>/ip-adapter-<variant>.safetensors + <variant>/image_encoder/; ControlNet: "
                         "diffusers/) and export nothing; prints their info as JSON")
    ap.add_argument("--ip-variants", nargs="+", choices=["plain", "plus"], default=["plain", "plus"],
                    help="with --tiny-ip-adapter --source-only: which adapters to write (default both)")
    ap.add_argument("--ip-size", choices=["tiny", "full"], default="tiny",
                    help="with --tiny-ip-adapter --source-only: full writes the published adapters' encoder and "
                         "Resampler shapes (the GPU benchmark)")
    ap.add_argument("--std-scale", type=float, default=1.0,
                    help="with --tiny-controlnet: scales the re-drawn weights' spread (full-size models: small, so "
                         "fp16 stays finite)")
    ap.add_argument("--dtype", choices=DTYPE_NAMES)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-diffusers", metavar="DIR")
    ap.add_argument("--check", choices=["none", "quick", "full"], default="quick")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--json-report", metavar="FILE", help="write every check result here")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: 1 for --tiny and --tiny-aoti on cpu, whose tensors are too small "
                         "to gain from more and which run >10x slower with OpenMP on a busy 2-core box; else torch's)")
    ap.add_argument("--aoti", action="store_true",
                    help="also compile the UNet with torch.export + AOTInductor into unet.pt2 (minutes; "
                         "for --device; run it with sdxl-batch --unet-backend aoti)")
    ap.add_argument("--aoti-size", metavar="dynamic|WxH", default="dynamic",
                    help="latent size of unet.pt2: dynamic within the model's limits (default), or one "
                         "fixed size in pixels, e.g. 1024x1024 (other sizes then run on unet.ts)")
    ap.add_argument("--aoti-config", metavar="KEY=VALUE", action="append", default=[],
                    help="extra torch._inductor config for the AOTI compile (repeatable), "
                         "e.g. max_autotune=True")
    ap.add_argument("--prediction-type", choices=["epsilon", "v_prediction"],
                    help="what the UNet predicts (default: the source's: a diffusers folder's scheduler config, a "
                         "single file's v_pred marker key, else epsilon); a flag that contradicts a marker is refused")
    ap.add_argument("--zero-snr", action=argparse.BooleanOptionalAction, default=None,
                    help="betas rescaled to zero terminal SNR, trailing timestep spacing (default: the source's: "
                         "rescale_betas_zero_snr, or a single file's ztsnr marker key)")
    ap.add_argument("--guidance-rescale", type=float, metavar="R",
                    help="the model's default guidance_rescale, 0..1 (model.json defaults; default 0.7 for "
                         "v-prediction with zero-SNR, else 0); a task's guidance_rescale replaces it")
    ap.add_argument("--batch-max", type=int, metavar="N", default=8,
                    help="images per UNet call the model is made for (default 8; model.json limits.batch_max): "
                         "sdxl-batch caps --max-batch at it, and the AOTI packages take 1 .. 2*N rows (CFG)")
    ap.add_argument("--max-regions", type=int, metavar="N", default=8,
                    help="regions a task may add to its own prompt (default 8, 1..32; model.json unet.regions."
                         "max_regions): what sdxl-batch allows in the forward_regional* methods")
    ap.add_argument("--fp8", action="store_true",
                    help="also write unet_fp8.ts: the transformer blocks' linear layers in FP8 e4m3 with scales "
                         "calibrated on --fp8-prompts (sdxl-batch --precision fp8; docs/models-and-export.md#fp8-unet)")
    ap.add_argument("--fp8-prompts", metavar="FILE", default=str(REPO / "configs" / "fp8-calibration-prompts.txt"),
                    help="calibration prompts, one per line (default: configs/fp8-calibration-prompts.txt)")
    ap.add_argument("--fp8-steps", type=int, metavar="N",
                    help="sampling steps per calibration prompt (default: the model's default steps)")
    ap.add_argument("--fp8-conv", action="store_true",
                    help="with --fp8: also the UNet's 3x3 convolutions (all but conv_in, conv_out and the shapes "
                         "where FP8 loses) in FP8 e4m3, input scales calibrated as the linear layers'; fast only "
                         "in unet_fp8.pt2 (--aoti), whose Triton kernels unet_fp8.ts cannot hold "
                         "(docs/models-and-export.md#fp8-convolutions)")
    ap.add_argument("--fp8-geglu", action="store_true",
                    help="with --fp8, experimental: each transformer feed-forward's GEGLU fused into its first FP8 "
                         "GEMM (one Triton kernel writes the e4m3 input of the second layer); only in unet_fp8.pt2 "
                         "(--aoti): unet_fp8.ts runs the unfused FP8 layers; tensor names unchanged, "
                         "so LoRAs patch it as before (docs/models-and-export.md#fused-fp8-geglu)")
    ap.add_argument("--aoti-variants", metavar="LIST", default="all",
                    help="with --aoti: which packages to compile, comma-separated: 'fp16' (the model dtype's "
                         "unet.pt2), 'fp8' (unet_fp8.pt2, with --fp8), 'vae' (vae_decoder.pt2) or 'all' (default)")
    return ap


def check_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Refuses combinations of options that do not go together (ap.error: exit 2, naming
    them); turns --aoti-variants into the set of packages to compile."""
    if a.config and not (a.from_path or a.vae_only or a.controlnet):
        ap.error("--config goes with --from, --vae-only or --controlnet")
    if a.vae and not (a.from_path or a.vae_only):
        ap.error("--vae goes with --from or --vae-only")
    if a.vae_only and not a.vae:
        ap.error("--vae-only needs --vae FILE|DIR")
    if a.detector and (a.aoti or a.fp8 or a.config or a.save_diffusers or a.device != "cpu" or a.dtype):
        ap.error("--detector goes with --out and --force only (it exports on cpu, in fp32)")
    tiny_adapter = a.tiny_ip_adapter or a.tiny_controlnet
    if a.source_only and not tiny_adapter:
        ap.error("--source-only goes with --tiny-ip-adapter or --tiny-controlnet")
    if tiny_adapter and (a.aoti or a.fp8 or a.config or a.save_diffusers):
        ap.error("--tiny-ip-adapter / --tiny-controlnet go without --aoti, --fp8, --config and --save-diffusers")
    if bool(a.ip_adapter) != bool(a.image_encoder):
        ap.error("--ip-adapter FILE and --image-encoder DIR go together")
    if not 1 <= a.batch_max <= 64:
        ap.error(f"--batch-max {a.batch_max}: must be 1..64 (sdxl-batch --max-batch takes 1..64)")
    if not 1 <= a.max_regions <= 32:
        ap.error(f"--max-regions {a.max_regions}: must be 1..32")
    names = set(a.aoti_variants.replace(" ", "").split(","))
    if not names <= {"all", "fp16", "fp8", "vae"}:
        ap.error(f"--aoti-variants '{a.aoti_variants}': {', '.join(sorted(names - {'all', 'fp16', 'fp8', 'vae'}))} "
                 "is not one of fp16, fp8, vae, all")
    variants = {"fp16", "fp8", "vae"} if "all" in names else names
    a.aoti_variants = variants if a.fp8 else variants - {"fp8"}
    if a.aoti and not a.aoti_variants:
        ap.error("--aoti-variants fp8 needs --fp8")
    if a.aoti and "fp8" in a.aoti_variants and a.device != "cuda":
        ap.error("--fp8 --aoti compiles unet_fp8.pt2 for CUDA only (Inductor's CPU code has no FP8 types): "
                 "add --device cuda, or --aoti-variants fp16 to compile only unet.pt2")
    if a.upscaler and (a.aoti or a.fp8 or a.config or a.save_diffusers or a.device != "cpu"):
        ap.error("--upscaler goes with --out, --dtype, --upscaler-tile and --force only (it exports on cpu)")
    if a.upscaler and not UPSCALER_TILE[0] <= a.upscaler_tile <= UPSCALER_TILE[1]:
        ap.error(f"--upscaler-tile {a.upscaler_tile}: must be {UPSCALER_TILE[0]}..{UPSCALER_TILE[1]} (the trace and "
                 "every model call of a fixed-tile upscaler hold a tile of this size)")
    if a.upscaler and a.dtype == "bf16":
        ap.error("--upscaler: --dtype fp16 (where the architecture supports it) or fp32")
    if a.fp8_conv and not a.fp8:
        ap.error("--fp8-conv goes with --fp8")
    if a.fp8_geglu and not a.fp8:
        ap.error("--fp8-geglu goes with --fp8 (it fuses the GEGLU into the FP8 UNet's feed-forward GEMMs)")
    model = a.tiny or a.tiny_aoti or a.random_full or a.from_path
    if (a.prediction_type or a.zero_snr is not None or a.guidance_rescale is not None) and not model:
        ap.error("--prediction-type, --zero-snr and --guidance-rescale go with a model export "
                 "(--tiny, --tiny-aoti, --random-full or --from)")
    if a.guidance_rescale is not None and not 0.0 <= a.guidance_rescale <= 1.0:
        ap.error(f"--guidance-rescale {a.guidance_rescale}: must be 0..1")
    if a.fp8 and (a.vae_only or a.controlnet or a.ip_adapter):
        ap.error("--fp8 goes with a model export (--tiny, --tiny-aoti, --random-full or --from)")


def check_inputs(a: argparse.Namespace) -> None:
    """Every file the export will read, before anything opens it and before --out is made
    (inputs.py): each path is what its flag expects, a regular file or a folder of regular files,
    and every safetensors file's header is valid; ExportError (exit 1) naming the first that is not."""
    if a.from_path:
        file_or_folder(Path(a.from_path), "--from")
    if a.vae:
        file_or_folder(Path(a.vae), "--vae")
    if a.config:  # config files only: a diffusers folder's weights are not read
        file_or_folder(Path(a.config), "--config", safetensors=False)
    if a.controlnet:
        file_or_folder(Path(a.controlnet), "--controlnet")
    if a.ip_adapter:
        read_header(regular_file(Path(a.ip_adapter), "--ip-adapter"))
    if a.image_encoder:
        folder(Path(a.image_encoder), "--image-encoder")
    for flag, diffusers_dir in (("--tiny-ip-adapter", a.tiny_ip_adapter), ("--tiny-controlnet", a.tiny_controlnet)):
        if diffusers_dir:  # a diffusers SDXL folder (export_sdxl.py --tiny --save-diffusers DIR): its UNet's config
            regular_file(Path(folder(Path(diffusers_dir), flag)) / "unet" / "config.json", flag)
    if a.fp8:
        regular_file(Path(a.fp8_prompts), "--fp8-prompts")
    if a.detector:
        from .detector import check_file  # the standard library only

        check_file(Path(a.detector))
    check_kinds(a)


def check_kinds(a: argparse.Namespace) -> None:
    """After every path passed check_inputs: a source of another kind than its flag exports (an SD 1.x
    checkpoint for --from, a T2I-Adapter for --controlnet, a FaceID file for --ip-adapter, ...), read from
    its headers and config.json, is refused before torch is imported (ExportError naming it); the
    modules that load them check again."""
    if a.from_path and Path(a.from_path).is_file():
        from .checkpoint_family import (check_checkpoint_file, checkpoint_markers,  # the standard library only
                                        prediction_settings)

        check_checkpoint_file(Path(a.from_path).resolve())
        prediction_settings(a, {}, checkpoint_markers(Path(a.from_path).resolve()))  # flags against the markers
    if a.controlnet:
        from .controlnet_family import classify

        classify(Path(a.controlnet).resolve(), a.config)
    if a.ip_adapter:
        from .ip_adapter_family import check_adapter_file

        check_adapter_file(Path(a.ip_adapter).resolve())


def main() -> int:
    # A crash in native code (e.g. the AOTInductor loader on CUDA, see
    # bench/probes/gpu_aoti_probe.py) then names the Python line it came from.
    faulthandler.enable()
    ap = build_parser()
    a = ap.parse_args()
    check_args(ap, a)
    check_inputs(a)  # before torch is imported: a refused file costs no second
    if a.upscaler:  # several files, each checked before torch loads, each to its own folder under --out
        from .upscaler import export_all

        return export_all(a)
    import torch

    from .common import DTYPES, Job

    tiny = a.tiny or a.tiny_aoti or a.tiny_controlnet or (a.tiny_ip_adapter and a.ip_size == "tiny")
    threads = a.threads if a.threads is not None else (1 if (tiny and a.device == "cpu") else 0)
    if threads > 0:
        torch.set_num_threads(threads)
    t_start = time.time()
    kind, module = next((name, mod) for dest, name, mod in KINDS if getattr(a, dest))
    export = importlib.import_module(f".{module}", __package__).export
    dtype_name = a.dtype or ("fp32" if kind in TINY_KINDS + ("tiny-ip-adapter", "tiny-controlnet") else "fp16")
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available")
    out = Path(a.out).resolve()
    if out.exists() and not a.force:
        raise SystemExit(f"{out} exists (use --force to overwrite)")
    if a.save_diffusers and Path(a.save_diffusers).exists() and not a.force:
        raise SystemExit(f"{a.save_diffusers} exists (use --force to overwrite)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the temp dir is removed on kill
    job = Job(kind, dtype_name, DTYPES[dtype_name], a.device, out, tmp, t_start)
    try:
        if a.tiny_ip_adapter or a.tiny_controlnet:
            from .tiny_adapters import export_drawn

            return export_drawn(a, job, export)
        return export(a, job)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
