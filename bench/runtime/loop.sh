#!/usr/bin/env bash
# The runtime against the for-loop a user would write with diffusers (a 2-GPU
# machine, repository root):
#   OUT=DIR bash bench/runtime/loop.sh loop     (or bench/gpu_runtime.sh loop)
# loop: the mixed batch by reference.diffusers_loop (tests/reference) on GPU 1
#       beside sdxl-batch serial on GPU 0, then the runtime at b1 and b4, and at
#       b4 under 24 and 12 GiB; images/hour of each against the loop's, and the
#       loop's PNGs against sdxl-batch's. Needs the export's diffusers copy
#       ($WORK/full-diffusers): exported again if a warm machine lacks it.
# Results: $OUT/summary.txt (+ build/export logs and the reports as JSON).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-}
case "$MODE" in loop) ;; *) echo "usage: [OUT=DIR] bash bench/runtime/loop.sh loop" >&2; exit 2 ;; esac
export SDXL_SAVE_DIFFUSERS=1  # diffusers needs the export's diffusers copy: export again if a warm machine lacks it
[ -f "${WORK:-/tmp/sdxl-gpu}/full-diffusers/model_index.json" ] || rm -f "${WORK:-/tmp/sdxl-gpu}/${SDXL_MODEL_NAME:-full}/model.json"
source bench/lib/gpu_prepare.sh  # build + export; sets OUT WORK SDXL MODEL
source bench/lib/runtime.sh

if [ "$MODE" = loop ]; then
  # Issue 6's "users report +50% from a queue": what they would run otherwise is
  # a for-loop over diffusers' pipeline (reference.diffusers_loop: file order,
  # one image per call, LoRA sets fused when they change, the same seeds,
  # prompts and sampler). It runs on GPU 1 beside sdxl-batch's serial run on
  # GPU 0; then the runtime at batch 1 and 4, and at 4 under 24 and 12 GiB. images/hour
  # of each against the loop's, and the loop's PNGs against sdxl-batch's.
  need_loras
  mkbatch "$WORK/mixed.json" 16 16 "$WORK/loras"
  GPU=0 run serial "$WORK/mixed.json" --order file --max-batch 1 --no-cuda-graphs --no-overlap --writer-threads 1 &
  (
    rm -rf "$WORK/loop"
    upid=$(GPU=1 busy_start "$WORK/loop.util")
    CUDA_VISIBLE_DEVICES=1 timeout "${RUN_TIMEOUT:-400}" python3 -m reference.diffusers_loop --diffusers "$WORK/full-diffusers" \
      --model "$MODEL" --batch "$WORK/mixed.json" --out "$WORK/loop" > "$WORK/loop.log" 2>&1 || echo "loop: exit $?" | tee -a "$OUT/summary.txt"
    kill "$upid" 2>/dev/null || true
    cp "$WORK/loop/report.json" "$OUT/report-loop.json" 2>/dev/null || true
  ) &
  wait
  GPU=0 run runtime-b4 "$WORK/mixed.json" --max-batch 4 &
  GPU=1 run cap24-b4 "$WORK/mixed.json" --max-batch 4 --vram-limit 24GiB &
  wait
  GPU=0 run runtime-b1 "$WORK/mixed.json" --max-batch 1 &
  GPU=1 run cap12-b4 "$WORK/mixed.json" --max-batch 4 --vram-limit 12GiB &
  wait
  compare serial loop
  compare runtime-b4 loop
  python3 - "$WORK" "$WORK/loop.util" <<'PY' | tee -a "$OUT/summary.txt" || true
import json, os, sys
work = sys.argv[1]
u = [float(x) for x in open(sys.argv[2]).read().split() if x.strip().replace('.', '', 1).isdigit()]
loop = json.load(open(os.path.join(work, "loop", "report.json")))
print(f"diffusers loop: {loop['images']} images in {loop['run_s']:.1f} s (+load {loop['load_s']:.1f} s) = "
      f"{loop['images_per_hour']:.0f} images/hour; LoRA restore+fuse {loop['lora_s']:.2f} s over {loop['lora_switches']} switches; "
      f"GPU busy {sum(1 for x in u if x > 0) / max(1, len(u)):.0%}; peak allocated {loop.get('peak_allocated_bytes', 0) / 2**30:.2f} GiB, "
      f"reserved {loop.get('peak_reserved_bytes', 0) / 2**30:.2f} GiB")
# A lower bound of the loop's cost: its time with the LoRA restores and fuses taken out.
bare = 3600.0 * loop["images"] / (loop["run_s"] - loop["lora_s"])
print(f"diffusers loop without its LoRA switching: {bare:.0f} images/hour")
for name in ("serial", "runtime-b1", "runtime-b4", "cap24-b4", "cap12-b4"):
    r = json.load(open(os.path.join(work, name, "report.json")))
    print(f"{name} vs diffusers loop: {r['images_per_hour']:.0f} / {loop['images_per_hour']:.0f} = "
          f"{r['images_per_hour'] / loop['images_per_hour']:.2f}x; vs the loop without LoRA switching "
          f"{r['images_per_hour'] / bare:.2f}x")
PY
  vs_serial runtime-b1 runtime-b4 cap24-b4 cap12-b4
  wrap_up
fi
