#!/usr/bin/env bash
# Issue 9 ("beat diffusers on the same GPU"): sdxl-batch and diffusers on the same
# weights and settings, one markdown table. On the GPU machine (1x H200, no
# network), from the repository root, with .deps and .whl carried, in ONE call
# (about 9 minutes: build + export ~4, rows ~5):
#
#   OUT=<dir> bash bench/bench_speed.sh
#
# What it does (every step time-boxed with `timeout`; a row that fails or runs
# out of time is "failed" in the table, the others still run):
#   0. bench/lib/gpu_prepare.sh: build (cmake --preset gpu) while exporting the
#      full-size SDXL architecture with random weights (fp16, cuda) and its
#      diffusers copy (SDXL_SAVE_DIFFUSERS=1), so both tools run the same weights;
#   1. dense matmul peak, fp16 and bf16, 8192^3 (bench/bench_matmul_peak.py);
#   2. sdxl-batch `run` of BENCH_IMAGES (64) images of 1024x1024, 28 steps,
#      CFG 7, Euler, four prompts, fixed seeds, --max-batch 1 (the rate from
#      report.json: model load excluded);
#   3. diffusers eager batch 4, then batch 1 (bench/bench_diffusers_sdxl.py,
#      one warm-up call excluded, BENCH_DIFFUSERS_CALLS timed calls; batch 4
#      first, so the row the others are compared with is always there);
#   4. sdxl-batch --max-batch 4 on BENCH_IMAGES_MB4 (64) images;
#   5. MLPerf Inference's SDXL settings (20 steps, CFG 8, 1024², Euler):
#      sdxl-batch --max-batch 4 and diffusers eager batch 4, compared with
#      each other (the anchor's figures are per image at these settings);
#   6. diffusers with torch.compile of the UNet (mode BENCH_COMPILE_MODE,
#      "default"), batch 1; compile time reported apart;
#   7. bench/bench_table.py: s/image, images/hour, achieved TFLOP/s
#      (389 TFLOP per image at 28 steps), fraction of the hardware limit,
#      peak memory, ratio to the best diffusers row of the same steps and CFG
#      -> stdout and $OUT/table.md.
#
# Environment: OUT (results; default bench/tmp), WORK (scratch; /tmp/sdxl-gpu),
# BENCH_IMAGES (64), BENCH_IMAGES_MB4 (64), BENCH_DIFFUSERS_CALLS (2),
# BENCH_COMPILE_MODE (default | max-autotune-no-cudagraphs | ...),
# BENCH_SDXL_FLAGS (extra flags of both sdxl-batch rows, e.g. "--vae-dtype fp32"),
# BENCH_DEADLINE_S (every step must end this many seconds after the start; 570),
# BENCH_SKIP (space-separated rows to leave out: matmul sdxl-mb1 diffusers-eager
# diffusers-compile sdxl-mb4 mlperf), BENCH_AOTI=1 (export with --aoti --aoti-size
# 1024x1024 into $WORK/full-aoti, about 5 more minutes, and run the sdxl-batch
# rows with --unet-backend aoti; to fit one call, e.g. BENCH_IMAGES=32
# BENCH_IMAGES_MB4=32 BENCH_SKIP=diffusers-compile BENCH_DEADLINE_S=590), BENCH_FP8=1
# (export with --fp8, and with BENCH_AOTI only unet_fp8.pt2; the sdxl-batch rows run
# --precision fp8: docs/models-and-export.md#fp8-unet).
#
# CPU smoke test of the whole pipeline (tiny model from models/tiny, exported
# with its diffusers copy if missing; 4 images of 256x256 (its smallest size), 2 steps, fp32, device cpu;
# the FLOP columns then use the full model's constants and mean nothing):
#
#   BENCH_SMOKE=1 bench/bench_speed.sh          # results in bench/tmp/smoke
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
T_START=$(date +%s)
SMOKE=${BENCH_SMOKE:-}
SKIP=" ${BENCH_SKIP:-} "
CALLS=${BENCH_DIFFUSERS_CALLS:-2}
COMPILE_MODE=${BENCH_COMPILE_MODE:-default}

if [ -n "$SMOKE" ]; then
  OUT=${OUT:-$PWD/bench/tmp/smoke}
  WORK=${WORK:-/tmp/sdxl-bench-smoke}
  mkdir -p "$OUT" "$WORK"
  PY=${PY:-.venv/bin/python}
  SDXL=${SDXL:-$PWD/build/default/sdxl-batch}
  MODEL=$PWD/models/tiny
  DIFF=$PWD/models/tiny-diffusers
  DEVICE=cpu SIZE=256 STEPS=2 DTYPE=fp32 MATMUL=(--n 256 --reps 3 --device cpu --dtypes fp32)
  N1=${BENCH_IMAGES:-4}
  N4=${BENCH_IMAGES_MB4:-4}
  DEADLINE=${BENCH_DEADLINE_S:-1800}
  COMPILE_ARGS=(--compile-backend eager)  # dynamo only: inductor's C++ build of the UNet takes many minutes on 2 cores
  SDXL_BUILD_FAILED=
  [ -x "$SDXL" ] || { echo "bench_speed: no $SDXL (cmake --preset default && cmake --build build/default)"; SDXL_BUILD_FAILED=1; }
  if [ ! -f "$MODEL/model.json" ] || [ ! -f "$DIFF/model_index.json" ] || { [ -n "${BENCH_FP8:-}" ] && [ ! -f "$MODEL/unet_fp8.ts" ]; }; then
    echo "bench_speed: exporting the tiny model with its diffusers copy"
    "$PY" scripts/export_sdxl.py --tiny ${BENCH_FP8:+--fp8} --out "$MODEL" --save-diffusers "$DIFF" --force > "$OUT/export.log" 2>&1 ||
      { echo "bench_speed: tiny export failed, see $OUT/export.log"; exit 1; }
  fi
else
  # A warm machine may hold an export without its diffusers copy (gpu_runtime.sh): export again.
  w=${WORK:-/tmp/sdxl-gpu}
  if [ -n "${BENCH_AOTI:-}" ]; then  # the UNet also compiled by AOTInductor (unet.pt2), for 1024x1024
    export SDXL_MODEL_NAME=full-aoti SDXL_EXPORT_DONE_FILE=unet.pt2 SDXL_EXPORT_ARGS="--aoti --aoti-size 1024x1024"
  fi
  if [ -n "${BENCH_FP8:-}" ]; then  # the FP8 UNet (unet_fp8.ts; with BENCH_AOTI unet_fp8.pt2 and vae_decoder.pt2)
    export SDXL_MODEL_NAME=${SDXL_MODEL_NAME:-full}-fp8 SDXL_EXPORT_ARGS="--fp8 ${SDXL_EXPORT_ARGS:-}"
    if [ -n "${BENCH_AOTI:-}" ]; then
      export SDXL_EXPORT_DONE_FILE=unet_fp8.pt2 SDXL_EXPORT_ARGS="$SDXL_EXPORT_ARGS --aoti-variants fp8,vae"
    else
      export SDXL_EXPORT_DONE_FILE=unet_fp8.ts
    fi
  fi
  [ -f "$w/full-diffusers/model_index.json" ] || rm -f "$w/${SDXL_MODEL_NAME:-full}/${SDXL_EXPORT_DONE_FILE:-model.json}"
  SDXL_SAVE_DIFFUSERS=1 SDXL_PREPARE_KEEP_GOING=1 source bench/lib/gpu_prepare.sh   # sets OUT WORK SDXL MODEL
  set +e
  PY=python3
  DIFF=$WORK/full-diffusers
  # shellcheck disable=SC2054  # "fp16,bf16" is one argument
  DEVICE=cuda SIZE=1024 STEPS=28 DTYPE=fp16 MATMUL=(--n 8192 --reps 20 --device cuda --dtypes fp16,bf16)
  N1=${BENCH_IMAGES:-64}
  N4=${BENCH_IMAGES_MB4:-64}
  DEADLINE=${BENCH_DEADLINE_S:-570}
  COMPILE_ARGS=(--compile-mode "$COMPILE_MODE")
fi
ROWS=$OUT/rows.jsonl
: > "$ROWS"
echo "bench_speed: device $DEVICE, $N1 images (--max-batch 1), $N4 (--max-batch 4), ${SIZE}px, $STEPS steps; " \
     "deadline ${DEADLINE} s, $(( $(date +%s) - T_START )) s used" | tee -a "$OUT/summary.txt"

table() {
  "$PY" bench/bench_table.py --rows "$ROWS" --peak "$OUT/peak.json" --steps "$STEPS" --dtype "$DTYPE" --out "$OUT/table.md" \
    --title "sdxl-batch vs diffusers$([ -n "$SMOKE" ] && echo ' (CPU smoke test: tiny model, FLOP columns meaningless)')" \
    | tee -a "$OUT/summary.txt"
}
trap table EXIT  # whatever happened, the table of what was measured

# box WANT [RESERVE]: seconds a step may take: WANT, less if the deadline (minus
# RESERVE for the steps after it and 15 s for the table) comes first.
box() {
  local want=$1 reserve=${2:-0}
  local left=$(( DEADLINE - ($(date +%s) - T_START) - 15 - reserve ))
  (( left < want )) && want=$left
  echo "$want"
}
skipped() { [[ "$SKIP" == *" $1 "* ]]; }

# The batch: N images, four prompts in turn, seeds 1000 + i, one size and
# sampler so that --max-batch can group any of them.
mkbatch() {  # mkbatch FILE N STEPS CFG
  "$PY" - "$1" "$2" "$SIZE" "$3" "$4" <<'PY'
import json, sys
path, n, size, steps, cfg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
prompts = ["comic panel, a lighthouse keeper in a storm, bold ink lines",
           "comic panel, a fishing boat fighting huge waves at night, dramatic sky",
           "watercolour, a quiet harbour at dawn, seagulls, soft pastel light",
           "oil painting, a red umbrella on a rainy city street, reflections"]
tasks = [{"id": f"img{i:03d}", "prompt": prompts[i % len(prompts)], "seed": 1000 + i} for i in range(n)]
json.dump({"version": 1,
           "defaults": {"negative": "blurry, lowres", "steps": steps, "cfg": cfg, "width": size, "height": size,
                        "sampler": "Euler"},
           "tasks": tasks}, open(path, "w"), indent=1)
PY
}

# sdxl_row NAME IMAGES LIMIT_S MAX_BATCH STEPS CFG ARGS...: one `sdxl-batch run`, a line in rows.jsonl.
sdxl_row() {
  local name=$1 n=$2 limit=$3 mb=$4 steps=$5 cfg=$6; shift 6
  local dir=$WORK/$name log=$OUT/$name.log rc why=""
  rm -rf "$dir" "$OUT/report-$name.json"
  if [ -n "$SDXL_BUILD_FAILED" ]; then
    rc=-1; why="no sdxl-batch binary (build failed, see build.log)"; echo "$why" > "$log"
  elif (( limit < 20 )); then
    rc=124; limit=0; why="skipped: no time left before the deadline"; echo "$why" > "$log"
  else
    mkbatch "$WORK/$name.json" "$n" "$steps" "$cfg"
    echo "== $name: $n images, $steps steps, CFG $cfg, --max-batch $mb, limit $limit s: $*" | tee -a "$OUT/summary.txt"
    # SIGTERM at the limit: sdxl-batch finishes the image in flight and writes
    # report.json (the row then counts the images made); -k: then SIGKILL.
    # shellcheck disable=SC2086
    timeout -k 20 "$limit" "$SDXL" --log-level info run "$WORK/$name.json" --model "$MODEL" --device "$DEVICE" \
      --out "$dir" --no-progress --max-batch "$mb" "$@" ${BENCH_AOTI:+--unet-backend aoti} ${BENCH_FP8:+--precision fp8} \
      ${BENCH_SDXL_FLAGS:-} \
      > "$log" 2>&1
    rc=$?
    cp "$dir/report.json" "$OUT/report-$name.json" 2>/dev/null
  fi
  local fallbacks; fallbacks=$(grep -c "decoding it again in fp32" "$log" 2>/dev/null)
  "$PY" -c 'import json,sys; a=sys.argv; r={"tool": "sdxl-batch", "name": a[1], "report": a[2], "rc": int(a[3]),
      "limit_s": int(a[4]), "log": a[5], "vae_fallbacks": int(a[6] or 0)}; r.update({"error": a[7]} if a[7] else {}); print(json.dumps(r))' \
    "sdxl-batch${BENCH_AOTI:+ aoti}${BENCH_FP8:+ fp8} --max-batch $mb" "$OUT/report-$name.json" "$rc" "$limit" "$log" "${fallbacks:-0}" "$why" \
    >> "$ROWS"
  echo "   $name: exit $rc after $(( $(date +%s) - T_START )) s" | tee -a "$OUT/summary.txt"
}

# diffusers_row NAME CONFIGS LIMIT_S STEPS CFG ARGS...: one bench_diffusers_sdxl.py process.
diffusers_row() {
  local name=$1 configs=$2 limit=$3 steps=$4 cfg=$5; shift 5
  local log=$OUT/$name.log rc why=""
  if (( limit < 20 )); then
    rc=124; limit=0; why="skipped: no time left before the deadline"; echo "$why" > "$log"
  else
    echo "== $name: $configs, $steps steps, CFG $cfg, limit $limit s" | tee -a "$OUT/summary.txt"
    timeout -k 10 "$limit" "$PY" bench/bench_diffusers_sdxl.py --diffusers "$DIFF" --configs "$configs" \
      --jsonl "$ROWS" --device "$DEVICE" --dtype "$DTYPE" --size "$SIZE" --steps "$steps" --cfg "$cfg" \
      --images "$CALLS" "$@" > "$log" 2>&1
    rc=$?
  fi
  "$PY" -c 'import json,sys; a=sys.argv; r={"tool": "diffusers-run", "configs": a[1], "rc": int(a[2]),
      "limit_s": int(a[3]), "log": a[4], "steps": int(a[6]), "cfg": float(a[7])}; r.update({"error": a[5]} if a[5] else {}); print(json.dumps(r))' \
    "$configs" "$rc" "$limit" "$log" "$why" "$steps" "$cfg" >> "$ROWS"
  echo "   $name: exit $rc after $(( $(date +%s) - T_START )) s" | tee -a "$OUT/summary.txt"
}

rm -f "$OUT/peak.json"
if ! skipped matmul; then
  limit=$(box 60)
  echo "== matmul peak, limit $limit s" | tee -a "$OUT/summary.txt"
  if (( limit < 5 )); then
    echo "   matmul peak: skipped, no time left" | tee -a "$OUT/summary.txt"
  else
    timeout -k 5 "$limit" "$PY" bench/bench_matmul_peak.py --out "$OUT/peak.json" "${MATMUL[@]}" \
      > "$OUT/matmul.log" 2>&1 || echo "   matmul peak: failed (exit $?), see matmul.log" | tee -a "$OUT/summary.txt"
  fi
fi
# Expected on the H200: build + export 60-220 s, matmul ~10, --max-batch 1 ~90
# (64 x 1.3 s + load), diffusers eager ~45, --max-batch 4 ~90 (64 images),
# compile 80-140. Each box keeps a reserve for the rows after it, except for
# the compile row (the least predictable, so it runs last and gets what is left).
skipped sdxl-mb1 || sdxl_row sdxl-mb1 "$N1" "$(box 200 250)" 1 "$STEPS" 7
skipped diffusers-eager || diffusers_row diffusers-eager "eager:4,eager:1" "$(box 120 220)" "$STEPS" 7
skipped sdxl-mb4 || sdxl_row sdxl-mb4 "$N4" "$(box 150 130)" 4 "$STEPS" 7
# MLPerf Inference SDXL: 20 steps, CFG 8 (the smoke test keeps its own step count).
MLPERF_STEPS=$([ -n "$SMOKE" ] && echo "$STEPS" || echo 20)
if ! skipped mlperf; then
  sdxl_row sdxl-mb4-mlperf "$N4" "$(box 120 70)" 4 "$MLPERF_STEPS" 8
  diffusers_row diffusers-mlperf "eager:4" "$(box 70 30)" "$MLPERF_STEPS" 8
fi
skipped diffusers-compile || diffusers_row diffusers-compile "compile:1" "$(box 300)" "$STEPS" 7 "${COMPILE_ARGS[@]}"
echo "bench_speed: done in $(( $(date +%s) - T_START )) s; table in $OUT/table.md" | tee -a "$OUT/summary.txt"
