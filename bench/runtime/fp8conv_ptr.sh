#!/usr/bin/env bash
# On the GPU machine (repository root): the --fp8-conv package with the pointer kernel only
# (SDXL_FP8_CONV_KERNEL=ptr: no TMA descriptors), after the TMA package faulted at its first call
# (bench/lab/2026-12-fp8-unet/results/2026-12-04-fp8-conv-e2e-h200.md). One export (its package check against the eager
# FP8 UNet is the first result), then, when the package passes, 24 panels at 1024², 28 steps,
# CFG 7, --max-batch 8 on it (--precision fp8 --unet-backend aoti): s/image to set beside the FP8
# package without the convolutions (0.757 s/image, 2026-12-03-fp8-aoti-h200.md).
#   OUT=DIR bash bench/runtime/fp8conv_ptr.sh
# FP8_CONV_KERNEL=default exports the default kernels (tma, tma_w) instead; PANELS=0 stops after the
# export and its package check (the check runs the package at 1, 2 and 16 rows).
set -euo pipefail
cd "$(dirname "$0")/../.."
kernel=${FP8_CONV_KERNEL:-ptr}
[ "$kernel" = ptr ] && export SDXL_FP8_CONV_KERNEL=ptr
export SDXL_MODEL_NAME=full-fp8conv-$kernel SDXL_EXPORT_DONE_FILE=unet_fp8.pt2 SDXL_PREPARE_KEEP_GOING=1
export SDXL_EXPORT_ARGS="--fp8 --fp8-conv --aoti --aoti-variants fp8 --aoti-size 1024x1024 --fp8-steps 10 --aoti-config aot_inductor.compile_wrapper_opt_level=O0"
source bench/lib/gpu_prepare.sh  # build + the export; sets OUT WORK SDXL MODEL
source bench/lib/runtime.sh
grep -h "fp8: \|aoti_compile_and_package\|check unet_fp8.pt2\|Error" "$OUT/export.log" | tail -8 | tee -a "$OUT/summary.txt" || true
[ -f "$WORK/$SDXL_MODEL_NAME/unet_fp8.pt2" ] || { echo "no unet_fp8.pt2: the package failed its check" | tee -a "$OUT/summary.txt"; exit 0; }
[ "${PANELS:-24}" = 0 ] && exit 0
python3 - "$WORK/panels-ptr.json" <<'PY'
import json, sys
scenes = ["a lighthouse keeper in a storm", "two kids racing bicycles downhill", "a robot reading under a tree",
          "a detective in a neon alley"]
tasks = [{"id": f"p{i:02d}", "prompt": f"comic panel {i}, {scenes[i % 4]}, bold ink lines", "seed": 500 + i} for i in range(24)]
json.dump({"version": 1, "defaults": {"negative": "blurry, lowres", "steps": 28, "cfg": 7.0, "width": 1024, "height": 1024},
           "tasks": tasks}, open(sys.argv[1], "w"), indent=1)
PY
run "aoti-fp8conv-$kernel" "$WORK/panels-ptr.json" --max-batch 8 --unet-backend aoti --precision fp8
