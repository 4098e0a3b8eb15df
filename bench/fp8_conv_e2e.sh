#!/usr/bin/env bash
# On the GPU machine (repository root): the FP8 3x3 convolutions (export_sdxl.py --fp8 --fp8-conv,
# issue 44 item 1) end to end in sdxl-batch, against the FP8 package without them, one call:
#   OUT=DIR bash bench/fp8_conv_e2e.sh
#   1. builds sdxl-batch and exports the full-size random-weight model twice, side by side
#      (bench/lib/gpu_prepare.sh): $WORK/full-fp8 with --fp8 and $WORK/full-fp8conv with
#      --fp8 --fp8-conv, both --aoti --aoti-variants fp8 --aoti-size 1024x1024 (the same seeded
#      weights and calibration: the two UNets differ only in the convolutions). With 2 GPUs the
#      second export runs on GPU 1 (nvidia-h200-x2: 32 cores for the two compiles).
#   2. the fp16 UNet's images of the first BENCH_REF_PANELS (8) panels (unet.ts of full-fp8,
#      --precision default, same seeds) on GPU 0 as soon as the first export and the build are done,
#      while the --fp8-conv export may still compile (not timed);
#   3. BENCH_PANELS (25) comic panels at 1024², 28 steps, CFG 7, --max-batch 8 with each package
#      (--unet-backend aoti --precision fp8): batches 1, 8, 8, 8, so the steady sampling s/image is
#      the 16 images of the two batches after the first of each shape. With 2 GPUs the two runs go
#      side by side, one GPU each; on one GPU the fp8conv run first.
#   4. bench/fp8_conv_summary.py: speed per run, PSNR / SSIM of each package's images against the
#      fp16 UNet's and against each other, each export's model.json (layers, compile seconds, the
#      package's checks) -> $OUT/fp8-conv-e2e.{md,json}, also printed.
# Every part is skipped when its result is in $WORK already and parts stop starting once
# BENCH_DEADLINE_S (540 s) is near, so a second call on a warm machine goes on where the first
# stopped (on one H200 the two exports side by side may not leave time for the runs).
# Knobs: OUT (bench/tmp), WORK (/tmp/sdxl-gpu), BENCH_PANELS, BENCH_REF_PANELS, BENCH_FP8_STEPS
# (calibration steps per prompt, 10 here against the export's default 28: both exports alike),
# BENCH_DEADLINE_S; SDXL_FP8_CONV_KERNEL=ptr exports
# the convolutions with the pointer kernel only (no TMA), should a GPU refuse the TMA kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
T_START=$(date +%s)
DEADLINE=$(( T_START + ${BENCH_DEADLINE_S:-540} ))
OUT=${OUT:-$PWD/bench/tmp}
WORK=${WORK:-/tmp/sdxl-gpu}
mkdir -p "$OUT" "$WORK"
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
AOTI_ARGS="--fp8 --aoti --aoti-variants fp8 --aoti-size 1024x1024 --aoti-config aot_inductor.compile_wrapper_opt_level=O0"
AOTI_ARGS+=" --fp8-steps ${BENCH_FP8_STEPS:-10}"  # calibration: 8 prompts x 10 steps (28: +25 s an export)
echo "# bench/fp8_conv_e2e.sh $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $NGPU GPU(s)" | tee -a "$OUT/summary.txt"

# The --fp8-conv export in the background (GPU 1 when there is one), with the environment
# gpu_prepare.sh would give it (carried wheels, tests/ on PYTHONPATH).
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export SDXL_WHEELS_INSTALLED=1 PYTHONPATH=$PWD/tests${PYTHONPATH:+:$PYTHONPATH}  # gpu_prepare.sh: not again
CONV_GPU=0; [ "$NGPU" -ge 2 ] && CONV_GPU=1
conv_pid=
if [ ! -f "$WORK/full-fp8conv/unet_fp8.pt2" ]; then
  ( t0=$(date +%s)
    CUDA_VISIBLE_DEVICES=$CONV_GPU python3 scripts/export_sdxl.py --random-full --dtype fp16 --device cuda \
      --out "$WORK/full-fp8conv" $AOTI_ARGS --fp8-conv --check none --force > "$OUT/export-fp8conv.log" 2>&1 \
      && echo "export --fp8-conv (GPU $CONV_GPU): $(( $(date +%s) - t0 )) s" \
      || echo "export --fp8-conv FAILED after $(( $(date +%s) - t0 )) s (see export-fp8conv.log)" ) \
    | tee -a "$OUT/summary.txt" &
  conv_pid=$!
fi
# Build + the export without the convolutions (GPU 0) in the foreground.
export SDXL_MODEL_NAME=full-fp8 SDXL_EXPORT_DONE_FILE=unet_fp8.pt2 SDXL_EXPORT_ARGS="$AOTI_ARGS" SDXL_PREPARE_KEEP_GOING=1
source bench/lib/gpu_prepare.sh  # sets OUT WORK SDXL MODEL; export.log
source bench/lib/runtime.sh

time_for() {
  local left=$(( DEADLINE - $(date +%s) ))
  if [ "$left" -lt "$1" ]; then echo "not run (${left} s left, needs ~$1 s): $2" | tee -a "$OUT/summary.txt"; return 1; fi
}
python3 - "$WORK/panels-conv.json" "${BENCH_PANELS:-25}" "$WORK/panels-conv-ref.json" "${BENCH_REF_PANELS:-8}" <<'PY'
import json, sys
scenes = ["a lighthouse keeper in a storm", "two kids racing bicycles downhill", "a robot reading under a tree",
          "a detective in a neon alley"]
def panels(n):
    return [{"id": f"p{i:02d}", "prompt": f"comic panel {i}, {scenes[i % 4]}, bold ink lines", "seed": 500 + i}
            for i in range(n)]
defaults = {"negative": "blurry, lowres", "steps": 28, "cfg": 7.0, "width": 1024, "height": 1024}
json.dump({"version": 1, "defaults": defaults, "tasks": panels(int(sys.argv[2]))}, open(sys.argv[1], "w"), indent=1)
json.dump({"version": 1, "defaults": defaults, "tasks": panels(int(sys.argv[4]))}, open(sys.argv[3], "w"), indent=1)
PY

reference() {  # the fp16 UNet's images (unet.ts of full-fp8: the same fp16 weights)
  [ -f "$WORK/ts-fp16-ref/report.json" ] && return 0
  time_for 40 "ts-fp16-ref (the fp16 images)" || return 0
  MODEL=$WORK/full-fp8 GPU=$1 run ts-fp16-ref "$WORK/panels-conv-ref.json" --max-batch 8 --unet-backend torchscript \
    --precision default || true
}
# The fp16 images first, on GPU 0, while the --fp8-conv export may still be compiling (its GPU is
# idle then): not a timed run.
[ -z "${SDXL_BUILD_FAILED:-}" ] && [ -f "$WORK/full-fp8/unet.ts" ] && reference 0
[ -n "$conv_pid" ] && wait "$conv_pid" || true
echo "both exports done: $(( $(date +%s) - T_START )) s" | tee -a "$OUT/summary.txt"
for log in "$OUT/export.log" "$OUT/export-fp8conv.log"; do
  [ -f "$log" ] || continue
  echo "-- $(basename "$log")" >> "$OUT/summary.txt"
  grep -h "fp8: \|aoti_compile_and_package\|check unet_fp8.pt2\|Error\|error:" "$log" | tail -12 | tee -a "$OUT/summary.txt" || true
done

if [ -n "${SDXL_BUILD_FAILED:-}" ]; then
  echo "sdxl-batch did not build (build.log): no runs" | tee -a "$OUT/summary.txt"
else
  # timed NAME EXPORT GPU: one package's run of the panels on that GPU.
  timed() {
    [ -f "$WORK/$1/report.json" ] && return 0
    [ -f "$WORK/$2/unet_fp8.pt2" ] || { echo "not run: $1 ($2 has no unet_fp8.pt2)" | tee -a "$OUT/summary.txt"; return 0; }
    time_for 45 "$1" || return 0
    MODEL=$WORK/$2 GPU=$3 run "$1" "$WORK/panels-conv.json" --max-batch 8 --unet-backend aoti --precision fp8 || true
  }
  if [ "$NGPU" -ge 2 ]; then
    # Side by side, one GPU each (the host's CPUs are not the limit).
    timed aoti-fp8 full-fp8 1 &
    side=$!
    timed aoti-fp8conv full-fp8conv 0
    wait "$side" || true
  else
    timed aoti-fp8conv full-fp8conv 0
    timed aoti-fp8 full-fp8 0
  fi
  reference 0  # if it did not run before
fi
python3 bench/fp8_conv_summary.py --title "FP8 3x3 convolutions: unet_fp8.pt2 with --fp8-conv against without (H200)" \
  --run "fp8=$WORK/aoti-fp8" --run "fp8conv=$WORK/aoti-fp8conv" --run "fp16-ts=$WORK/ts-fp16-ref" \
  --pair fp8:fp16-ts --pair fp8conv:fp16-ts --pair fp8conv:fp8 \
  --export "fp8=$WORK/full-fp8" --export "fp8conv=$WORK/full-fp8conv" \
  --json "$OUT/fp8-conv-e2e.json" --md "$OUT/fp8-conv-e2e.md" | tee -a "$OUT/summary.txt" || true
sample_steady
echo "total: $(( $(date +%s) - T_START )) s" | tee -a "$OUT/summary.txt"
