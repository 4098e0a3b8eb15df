#!/usr/bin/env bash
# On the GPU machine (repository root): the FP8 package with each transformer feed-forward's GEGLU fused
# into its first FP8 GEMM (export_sdxl.py --fp8 --fp8-geglu, issue 44 item 2; scripts/export/fp8_geglu.py),
# first H200 run. One export (full-size random SDXL, fp16; its package check against the fp16 UNet, as near
# as the eager fused FP8 UNet, is the first result), then, when the package passes, PANELS (64) panels at
# 1024², 28 steps, CFG 7, --max-batch 8 on it (--precision fp8 --unet-backend aoti): s/image to set beside
# the FP8 package without the fusion (0.757 s/image as bench/runtime/fp8conv_ptr.sh cites it;
# bench/lab/2026-12-fp8-unet/results/2026-12-02-fp8-aoti-h200.md's 32-panel b8 rows: steady 0.728, rate 0.848 s/image).
#   OUT=DIR bash bench/runtime/fp8geglu.sh        or        OUT=DIR bash bench/gpu_runtime.sh fp8-geglu
# Knobs: FP8_GEGLU_KERNEL=ptr (default) | tma: the kernel variant compiled into the package
# (SDXL_FP8_GEGLU_KERNEL, read by the op when torch.export traces it); PANELS=N (64; 0 stops after the export
# and its package check, which runs the package at 1, 2 and 16 rows); WITH_CONV=1 also compiles in the FP8
# 3x3 convolutions (--fp8-conv, pointer kernel: item 1), the package with every kernel of issue 44 built so
# far; MLPERF=1 runs the panels once more at MLPerf's settings (20 steps, CFG 8); PROFILE=1 first times and
# profiles one 16-row step of the package by kernel class (bench/lab/2026-12-fp8-unet/aoti_step_profile.py, ~30 s).
# Time: the export with the compile took 265-330 s for the FP8 packages so far (the build runs beside it),
# 64 panels about 50 s of sampling plus the model load: one 600 s call. With less time left, PANELS=24.
set -euo pipefail
cd "$(dirname "$0")/../.."
kernel=${FP8_GEGLU_KERNEL:-ptr}
case "$kernel" in ptr | tma) ;; *) echo "FP8_GEGLU_KERNEL=$kernel: ptr or tma" >&2; exit 2 ;; esac
panels=${PANELS:-64}
[[ "$panels" =~ ^[0-9]+$ ]] || { echo "PANELS=$panels: a number of panels (0: export only)" >&2; exit 2; }
export SDXL_FP8_GEGLU_KERNEL=$kernel
conv= name=full-fp8geglu-$kernel
if [ "${WITH_CONV:-0}" = 1 ]; then conv=--fp8-conv name=$name-conv; export SDXL_FP8_CONV_KERNEL=ptr; fi
export SDXL_MODEL_NAME=$name SDXL_EXPORT_DONE_FILE=unet_fp8.pt2 SDXL_PREPARE_KEEP_GOING=1
export SDXL_EXPORT_ARGS="--fp8 --fp8-geglu $conv --aoti --aoti-variants fp8 --aoti-size 1024x1024 --fp8-steps 10 --aoti-config aot_inductor.compile_wrapper_opt_level=O0"
# build + the export; sets OUT WORK SDXL MODEL. `|| true`: a failed export (its package check refusing
# unet_fp8.pt2 is a result) must not end the call before the build is waited for and the log is read.
source bench/lib/gpu_prepare.sh || true
source bench/lib/runtime.sh
grep -h "fp8: \|aoti_compile_and_package\|check unet_fp8.pt2\|Error" "$OUT/export.log" | tail -8 | tee -a "$OUT/summary.txt" || true
if [ ! -f "$WORK/$SDXL_MODEL_NAME/unet_fp8.pt2" ]; then
  { echo "no unet_fp8.pt2: the export or its package check failed; export.log ends:"; tail -5 "$OUT/export.log"; } | tee -a "$OUT/summary.txt"
  exit 0
fi
python3 - "$WORK/$SDXL_MODEL_NAME/model.json" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
f = json.load(open(sys.argv[1]))["unet"]["fp8"]
print("model.json unet.fp8.geglu:", json.dumps(f.get("geglu")), "| rel. L2 vs fp16 on the trace inputs:",
      f["rel_l2_vs_unet_on_trace_inputs"])
PY
if [ "${PROFILE:-0}" = 1 ]; then
  python3 bench/lab/2026-12-fp8-unet/aoti_step_profile.py "$WORK/$SDXL_MODEL_NAME" --packages unet_fp8.pt2 --rows 16 \
    --out "$OUT/profile" > "$OUT/profile.log" 2>&1 || echo "aoti_step_profile.py failed (profile.log)" | tee -a "$OUT/summary.txt"
  grep -h "^unet_fp8.pt2 {" "$OUT/profile.log" | tee -a "$OUT/summary.txt" || true
fi
[ "${SDXL_BUILD_FAILED:-0}" = 1 ] && { echo "sdxl-batch did not build (build.log): no panels" | tee -a "$OUT/summary.txt"; exit 0; }
[ "$panels" = 0 ] && exit 0
mkpanels() {  # FILE STEPS CFG
python3 - "$1" "$panels" "$2" "$3" <<'PY'
import json, sys
scenes = ["a lighthouse keeper in a storm", "two kids racing bicycles downhill", "a robot reading under a tree",
          "a detective in a neon alley"]
tasks = [{"id": f"p{i:02d}", "prompt": f"comic panel {i}, {scenes[i % 4]}, bold ink lines", "seed": 500 + i}
         for i in range(int(sys.argv[2]))]
json.dump({"version": 1, "defaults": {"negative": "blurry, lowres", "steps": int(sys.argv[3]), "cfg": float(sys.argv[4]),
                                      "width": 1024, "height": 1024}, "tasks": tasks}, open(sys.argv[1], "w"), indent=1)
PY
}
mkpanels "$WORK/panels-geglu.json" 28 7
run "aoti-${name#full-}" "$WORK/panels-geglu.json" --max-batch 8 --unet-backend aoti --precision fp8
if [ "${MLPERF:-0}" = 1 ]; then
  mkpanels "$WORK/panels-geglu-mlperf.json" 20 8
  run "aoti-${name#full-}-mlperf" "$WORK/panels-geglu-mlperf.json" --max-batch 8 --unet-backend aoti --precision fp8
fi
