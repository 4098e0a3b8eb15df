#!/usr/bin/env bash
# Runtime measurements on the GPU machine (full-size random SDXL, fp16, 28 steps,
# CFG 7), one mode per call, from the repository root:
#   OUT=DIR bash bench/gpu_runtime.sh MODE          (no MODE: check)
# Each family of modes is one script under bench/runtime/ (also runnable directly
# with the same MODE); each builds sdxl-batch and exports the model first
# (bench/lib/gpu_prepare.sh) and shares the runs and comparisons of bench/lib/runtime.sh.
#   checks.sh    check     CUDA graphs on/off, batching, 12 GiB cap: same images?
#                order     same 3 images in two orders, graphs on/off: identical PNGs?
#                story     the story example: run, --force, shards, batch 4 agree? --verify-model time
#                embeddings  random SDXL embeddings on the full model: deterministic, and they change the image?
#                vae-fp16  the default VAE decode (fp16 on a GPU) against fp32: time, PSNR, re-decodes
#                vae-aoti  vae_decoder.pt2 against vae_decoder.ts: decode time, images/hour, PSNR
#   mixed.sh     mixed     the 32-image mixed batch, serial vs runtime, caps, LoRA bench
#                caps      the mixed batch's serial baseline, the capped runs, the LoRA bench
#                pipeline  the mixed batch: serial, runtime without / with stage overlap
#                single    1 H200: UNet profile, serial vs runtime b1/b4, 64 images at b4 and b1
#                defaults  2 GPUs: the program's defaults, serial vs runtime b1/b4, 24 / 12 GiB
#   multigpu.sh  multi     64 images on GPU 0, then on GPUs 0 and 1
#                x2        pipeline + caps + multi in one call on a 2-GPU machine
#                scale     2 GPUs: one GPU, two in one process, two processes (--shard); mixed batch
#   memory.sh    capmerge  2 GPUs: b4 under 24 and 12 GiB, each LoRA merge logged; then uncapped
#                wscap     2 GPUs: b1 uncapped / 12 GiB, without and with a cuDNN workspace cap
#                alloc     b4 uncapped / 24 / 12 GiB, default allocator vs expandable segments
#   models.sh    single-file  a full-size original-layout checkpoint: export --from FILE, time, memory, same?
#                vae-switch   an fp16 VAE folder named by every second task: cost, cache, same images?
#                controlnet   a full-size ControlNet: export, s/image and memory with/without, cache, b1 = b4?
#                ip-adapter   full-size IP-Adapters (plus, plain): export, s/image and memory with/without, caches
#   loop.sh      loop      2 GPUs: the diffusers for-loop (reference.diffusers_loop) vs the runtime
#   precision.sh fp8       FP8 UNet vs fp16: export --fp8, fidelity (bench/fp8_fidelity.py), TorchScript
#                          s/image and memory, PSNR, LoRA switches in fp8
#                fp8-aoti  unet_fp8.pt2 (AOTInductor): export time, b4 / b8, MLPerf's settings, PSNR vs fp16
#                fp8-tiny  the tiny model's unet_fp8.pt2 on the GPU: export check to PNG, repeatable, vs unet_fp8.ts
#                fp16-aoti unet.pt2 the same way: the exact fp16 rows of the same lease
#   fp8geglu.sh  fp8-geglu unet_fp8.pt2 with --fp8-geglu (GEGLU fused into the FP8 GEMM, experimental): export,
#                          package check, 64 panels at b8 (FP8_GEGLU_KERNEL=ptr|tma, PANELS=N; one 600 s call)
#   trace.sh     trace     per-step UNet times of 2+2 images (SDXL_TRACE_STEPS=1), UNet profile
#   finish.sh    inpaint   img2img vs inpainting (whole picture, only masked): s/image, memory, exact outside the crop
#                upscale   a full-size 4x RRDBNet, 1024² -> 2048²: sdxl-batch upscale vs spandrel + ComfyUI's loop
#                frames    16 panels of 768x1344 written as 1080x1920 frames (per-task "upscale") vs plain panels
#                detect    sdxl-batch detect with a 640-px YOLOv8n detector, 48 panels, cuda vs cpu
#                detailer  50 panels without / with a per-task detailer (1-3 regions each): s per region and per panel
#                regions   64 panels without / with 2 / with 3 regional prompts (attention couple): s/image, memory
# Knobs of every mode: OUT (results, bench/tmp), WORK (/tmp/sdxl-gpu), RUN_TIMEOUT
# (400 s a run), RUN_LOG_LEVEL (warn), gpu_prepare.sh's SDXL_*; a mode's own knobs
# are in its family's script.
set -euo pipefail
MODE=${1:-check}
case "$MODE" in
  check | order | story | embeddings | vae-fp16 | vae-aoti) family=checks ;;
  mixed | caps | pipeline | single | defaults) family=mixed ;;
  multi | x2 | scale) family=multigpu ;;
  capmerge | wscap | alloc) family=memory ;;
  loop) family=loop ;;
  single-file | vae-switch | controlnet | ip-adapter) family=models ;;
  trace) family=trace ;;
  fp8 | fp8-aoti | fp16-aoti | fp8-tiny) family=precision ;;
  fp8-geglu) family=fp8geglu ;;
  inpaint | upscale | frames | detect | detailer | regions) family=finish ;;
  *)
    echo "usage: [OUT=DIR] bash bench/gpu_runtime.sh MODE; MODE: check | order | mixed | caps | pipeline | single |" \
         "defaults | multi | x2 | scale | capmerge | wscap | alloc | loop | trace | single-file | vae-switch | controlnet |" \
         "ip-adapter | fp8 | fp8-aoti | fp16-aoti | fp8-tiny | fp8-geglu | inpaint | upscale | frames | detect | detailer |" \
         "regions" >&2
    exit 2 ;;
esac
exec bash "$(dirname "$0")/runtime/$family.sh" "$MODE"
