#!/usr/bin/env bash
# Issue 58: ComfyUI against sdxl-batch on the same GPU, the same weights, in one call
# (GPU machine, repository root; carry .deps .whl .comfy/src.tar.xz .comfy/whl):
#   OUT=DIR bash bench/comfyui/run.sh
# sdxl-batch is built and the full-size random SDXL exported (bench/lib/gpu_prepare.sh, with its
# diffusers copy); that copy is written as an original-layout single file for ComfyUI
# (reference.single_file_fixture), the mixed batch's two rank-64 kohya LoRAs are made
# (reference.make_test_loras --full), a random full-size ControlNet (reference.controlnet_fixture:
# diffusers layout for ComfyUI, exported for sdxl-batch) and a random full-size 4x RRDBNet
# (bench/upscale_bench.py --make-rrdbnet: the .pth for ComfyUI, exported for sdxl-batch).
# bench/comfyui/workloads.py writes both tools' inputs from one task list. Then, in stages:
#   w1      W1_PANELS panels of 1024², 28 steps, CFG 7, Euler: sdxl-batch as README's first real run
#           has it (no flags: TorchScript UNet, --max-batch 1) and at --max-batch BEST_BATCH;
#           ComfyUI with its defaults, one prompt per panel; ComfyUI with COMFY_FAST_FLAGS, one prompt
#           per panel, then at batch size BEST_BATCH
#   w2      the mixed batch (MIXED panels of each size, three priorities, three LoRA sets), then the
#           finished comic night (FINISH panels: hires fix on a third, an upscaler-model frame on all,
#           a ControlNet on half), both tools as in w1 (ComfyUI with COMFY_FAST_FLAGS)
# Each stage leaves a marker in $WORK: a second call on the warm machine runs what the first did
# not reach. No stage starts after DEADLINE_S (540) seconds from the start; ComfyUI's runs also stop
# starting then. Rates exclude each tool's model load (sdxl-batch: report.json's run_s; ComfyUI: a
# warm-up prompt first). GPU busy: nvidia-smi samples with utilisation > 0 (100 ms); peak memory:
# the largest nvidia-smi memory.used sample (whole card, both tools alike), and sdxl-batch's own
# peak allocated / reserved from report.json.
# Results: $OUT/summary.txt, $OUT/comfy58.md (bench/comfyui/summarize.py: the table and the draft
# write-up for bench/results/), comfy-*.json, the reports, the server logs.
# Knobs: W1_PANELS (16), MIXED (8), FINISH (12), BEST_BATCH (8), COMFY_FAST_FLAGS ("--fast --highvram"),
# STAGES ("w1 w2"), DEADLINE_S (540), RUN_TIMEOUT (300 s a sdxl-batch run).
# The AOTInductor UNet's rows (its export alone takes 5-7 minutes: a call of its own, then one for
# the rows, ComfyUI's rows kept from the first calls):
#   SDXL_MODEL_NAME=full-aoti SDXL_EXPORT_ARGS=--aoti SKIP_COMFY=1 RUN_PREFIX=aoti- OUT=$OUT bash bench/comfyui/run.sh
# DRY=1: a CPU dry run of this script (bench/comfyui/dry_run.sh sets it up): the tiny model for
# sdxl-batch, a full-size random checkpoint for ComfyUI (--cpu), SIZE 256, STEPS 2.
set -euo pipefail
cd "$(dirname "$0")/../.."
T_START=$(date +%s)
DEADLINE_S=${DEADLINE_S:-540}
W1_PANELS=${W1_PANELS:-16} MIXED=${MIXED:-8} FINISH=${FINISH:-12} BEST_BATCH=${BEST_BATCH:-8}
COMFY_FAST_FLAGS=${COMFY_FAST_FLAGS:---fast --highvram}
STAGES=${STAGES:-w1 w2} SKIP_COMFY=${SKIP_COMFY:-} RUN_PREFIX=${RUN_PREFIX:-}
export RUN_TIMEOUT=${RUN_TIMEOUT:-300}
if [ -n "${DRY:-}" ]; then  # bench/comfyui/dry_run.sh: everything on the CPU, small
  OUT=${OUT:?} WORK=${WORK:?} SDXL=${SDXL:?} MODEL=${MODEL:?}
  SIZE=${SIZE:-256} STEPS=${STEPS:-2}
  export RUN_DEVICE=cpu
  COMFY_DEVICE_FLAGS=${COMFY_DEVICE_FLAGS:---cpu}
  mkdir -p "$OUT" "$WORK"
else
  export SDXL_SAVE_DIFFUSERS=1
  source bench/lib/gpu_prepare.sh  # build + export (+ $WORK/full-diffusers); sets OUT WORK SDXL MODEL
  SIZE=1024 STEPS=28 COMFY_DEVICE_FLAGS=
fi
source bench/lib/runtime.sh
left() { echo $(( DEADLINE_S - ($(date +%s) - T_START) )); }
note() { echo "$*" | tee -a "$OUT/summary.txt"; }

# ComfyUI: its wheels beside python3's packages, its source unpacked.
if [ ! -f "$WORK/comfy-src/main.py" ]; then
  mkdir -p "$WORK/comfy-src" && tar -xJf .comfy/src.tar.xz -C "$WORK/comfy-src"
fi
if [ -z "${DRY:-}" ] && [ ! -d /tmp/comfy-site ]; then
  # Only the wheels whose module python3 lacks (its own torch, numpy, Pillow, ... stay).
  need=()
  for w in .comfy/whl/*.whl; do
    mod=$(basename "$w" | cut -d- -f1 | tr 'A-Z' 'a-z'); mod=${mod/python_dotenv/dotenv}
    python3 -c "import $mod" 2>/dev/null || need+=("$w")
  done
  mkdir -p /tmp/comfy-site
  [ ${#need[@]} -eq 0 ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/comfy-site "${need[@]}"
  note "ComfyUI wheels installed: ${need[*]##*/}"
fi
COMFY_PY=/tmp/comfy-site${PYTHONPATH:+:$PYTHONPATH}
note "ComfyUI $(cat "$WORK/comfy-src/COMMIT") ($(grep -o '"[0-9.]*"' "$WORK/comfy-src/comfyui_version.py"))"

# The same weights for both tools.
M=$WORK/models58 B=$WORK/comfy-base
mkdir -p "$M/controlnets" "$M/up" "$B/custom_nodes" "$B/models/checkpoints" "$B/models/loras" "$B/models/controlnet" \
  "$B/models/upscale_models" "$B/input" "$B/output"
t0=$(date +%s)
if [ -z "${DRY:-}" ]; then
  [ -f "$WORK/single/checkpoint.safetensors" ] || python3 -m reference.single_file_fixture \
    --from-diffusers "$WORK/full-diffusers" --out "$WORK/single" --dtype fp16 > "$OUT/single-file.log" 2>&1
  need_loras
  for f in full_a full_b; do ln -sf "$WORK/loras/$f.safetensors" "$B/models/loras/"; done
  if [ ! -f "$M/controlnets/pose/model.json" ]; then
    python3 -m reference.controlnet_fixture --diffusers "$WORK/full-diffusers" --out "$WORK/cn-src" --seed 3 \
      --std-scale 0.02 --diffusers-only --name full-random-controlnet > "$OUT/cn-fixture.log" 2>&1
    python3 scripts/export_sdxl.py --controlnet "$WORK/cn-src/diffusers" --dtype fp16 --device cuda --check none \
      --out "$M/controlnets/pose" --force > "$OUT/export-cn.log" 2>&1
  fi
  if [ ! -f "$M/up/rrdbnet_x4/model.json" ]; then
    python3 bench/upscale_bench.py --make-rrdbnet "$WORK/rrdbnet_x4.pth"
    python3 scripts/export_sdxl.py --upscaler "$WORK/rrdbnet_x4.pth" --out "$M/up" --force > "$OUT/export-up.log" 2>&1
  fi
fi  # DRY: dry_run.sh made the same files from the tiny model and a CPU-made full-size checkpoint
ln -sf "$WORK/single/checkpoint.safetensors" "$B/models/checkpoints/sdxl-random.safetensors"
ln -sf "$WORK/cn-src/diffusers/diffusion_pytorch_model.safetensors" "$B/models/controlnet/controlnet.safetensors"
ln -sf "$WORK/rrdbnet_x4.pth" "$B/models/upscale_models/rrdbnet_x4.pth"
note "assets (single file, LoRAs, ControlNet, upscaler; both layouts): $(( $(date +%s) - t0 )) s"
# sdxl-batch reads inputs only inside the folder they are named in (no link out): $WORK/loras itself.
python3 bench/comfyui/workloads.py --out "$WORK/wl" --models "$M" --loras "${LORAS:-$WORK/loras}" --size "$SIZE" --steps "$STEPS" \
  --panels "$W1_PANELS" --mixed "$MIXED" --finish "$FINISH" --comfy-batch "$BEST_BATCH" | tee -a "$OUT/summary.txt"
cp "$WORK"/wl/control/*.png "$B/input/" 2>/dev/null || true
cp "$WORK"/wl/*.json "$OUT/" 2>/dev/null || true

# mem_run NAME BATCH ARGS...: runtime.sh's run, with the card's memory.used sampled beside it.
mem_run() {
  local pid=
  pid=$( (nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$WORK/$1.mem" 2>/dev/null & echo $!) )
  run "$@" || true
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
}
# comfy LABEL FLAGS RUN=FILE...: one ComfyUI server with FLAGS, the runs in order (comfy_queue.py).
comfy() {
  local label=$1 flags=$2; shift 2
  PYTHONPATH=$COMFY_PY python3 bench/comfyui/comfy_queue.py --comfy "$WORK/comfy-src" --base "$B" \
    --out "$OUT/comfy-$label.json" --flags "$COMFY_DEVICE_FLAGS $flags" --warmup "$WORK/wl/w1.comfy.json" \
    --deadline $(( T_START + DEADLINE_S )) --run-timeout "$RUN_TIMEOUT" "$@" 2>&1 | tee -a "$OUT/summary.txt" || note "comfy $label: exit $?"
}
TAG=${SDXL_MODEL_NAME:-full}${DRY:+-dry}
stage() {  # stage NAME: run it unless done (by this model's calls) or out of time
  [ -f "$WORK/stage58-$TAG-$1.done" ] && { note "stage $1: done by an earlier call"; return 1; }
  [ "$(left)" -gt 30 ] || { note "stage $1: not started, $(left) s left (call again on the warm machine)"; return 1; }
  note "stage $1: $(left) s left"
}
R=--max-batch
for s in $STAGES; do
  case $s in
    w1)
      stage w1 || continue
      mem_run "${RUN_PREFIX}readme-w1" "$WORK/wl/w1.json"
      mem_run "${RUN_PREFIX}best-w1" "$WORK/wl/w1.json" $R "$BEST_BATCH"
      [ -n "$SKIP_COMFY" ] || comfy defaults-w1 "" w1=$WORK/wl/w1.comfy.json
      [ -n "$SKIP_COMFY" ] || comfy fast-w1 "$COMFY_FAST_FLAGS" w1=$WORK/wl/w1.comfy.json \
        "w1-batch$BEST_BATCH=$WORK/wl/w1-batch.comfy.json"
      touch "$WORK/stage58-$TAG-w1.done" ;;
    w2)
      stage w2 || continue
      mem_run "${RUN_PREFIX}readme-mixed" "$WORK/wl/mixed.json"
      mem_run "${RUN_PREFIX}best-mixed" "$WORK/wl/mixed.json" $R "$BEST_BATCH"
      mem_run "${RUN_PREFIX}readme-finish" "$WORK/wl/finish.json"
      mem_run "${RUN_PREFIX}best-finish" "$WORK/wl/finish.json" $R "$BEST_BATCH"
      [ -n "$SKIP_COMFY" ] || comfy fast-w2 "$COMFY_FAST_FLAGS" mixed=$WORK/wl/mixed.comfy.json \
        finish=$WORK/wl/finish.comfy.json
      touch "$WORK/stage58-$TAG-w2.done" ;;
    *) note "unknown stage $s (w1, w2)" ;;
  esac
done
python3 bench/comfyui/summarize.py --work "$WORK" --out "$OUT" --comfy-base "$B" | tee -a "$OUT/summary.txt" || true
note "run.sh: $(( $(date +%s) - T_START )) s"
