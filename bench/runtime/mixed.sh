#!/usr/bin/env bash
# The 32-image mixed batch, serial vs the runtime (GPU machine, repository root):
#   OUT=DIR bash bench/runtime/mixed.sh MODE     (or bench/gpu_runtime.sh MODE)
# The mixed batch: 32 images (1024x1024 and 832x1216, priorities high/mid/low,
# three LoRA sets: none and two rank-64 LoRAs from reference.make_test_loras --full).
# mixed: run serially (--max-batch 1, no CUDA graphs, one writer) and by the runtime
#        (graphs, --max-batch 1), then at --max-batch 4 under 24 GiB and 12 GiB
#        caps; images/hour, GPU busy fraction (nvidia-smi, 100 ms), peaks; then
#        bench/bench_lora.sh (load / cached switch / restore of rank-64 LoRAs).
#        SKIP_SERIAL, SKIP_LORA_BENCH leave those out.
# caps: the serial baseline, the capped runs and the LoRA bench only (same knobs).
# pipeline: serially (file order, one batch at a time, no graphs, --no-overlap),
#        by the runtime with --no-overlap, and by the runtime (stages overlapping:
#        text / sample / decode on three streams); PNGs compared; per-device busy
#        and overlap seconds from report.json. SKIP_SERIAL, SKIP_CAPS.
# single: one H200: UNet profile (gpu_unet_profile.py), serial vs runtime b1/b4,
#        then 64 images of 1024x1024 at b4 and b1.
# defaults: a 2-GPU machine, two runs at a time: the program's defaults, serial vs
#        runtime b1/b4, b4 under 24 / 12 GiB; PNGs across caps; idle gaps
#        (bench/stage_gaps.py). DEFAULTS_EXTRA: flags of one more b4 run.
# Results: $OUT/summary.txt (+ build/export logs and the reports as JSON).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-}
case "$MODE" in mixed|caps|pipeline|single|defaults) ;; *) echo "usage: [OUT=DIR] bash bench/runtime/mixed.sh mixed|caps|pipeline|single|defaults" >&2; exit 2 ;; esac
source bench/lib/gpu_prepare.sh  # build + export; sets OUT WORK SDXL MODEL
source bench/lib/runtime.sh

if [ "$MODE" = mixed ]; then
  need_loras
  mkbatch "$WORK/mixed.json" 16 16 "$WORK/loras"
  [ -n "${SKIP_SERIAL:-}" ] || run serial "$WORK/mixed.json" --order file --max-batch 1 --no-cuda-graphs --writer-threads 1
  run runtime-b1 "$WORK/mixed.json" --max-batch 1
  run cap24-b4 "$WORK/mixed.json" --max-batch 4 --vram-limit 24GiB
  run cap12-b4 "$WORK/mixed.json" --max-batch 4 --vram-limit 12GiB
  compare serial runtime-b1
  python3 - "$WORK/runtime-b1/report.json" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
r = json.load(open(sys.argv[1])); l = r.get("lora", {})
order = [(i["task"], ",".join(x["name"] for x in i.get("loras", [])) or "-") for i in sorted(r["images"], key=lambda i: i["start_s"])]
switches = sum(1 for a, b in zip(order, order[1:]) if a[1] != b[1])
print(f"runtime-b1 LoRA: {l.get('switches')} switches applied, {switches} set changes in image order; cache hits {l.get('hits')}, "
      f"misses {l.get('misses')}, evictions {l.get('evictions')}, load {l.get('load_s', 0):.2f} s, merge {l.get('merge_s', 0):.2f} s")
PY
  [ -n "${SKIP_LORA_BENCH:-}" ] || OUT=$OUT WORK=$WORK BIN=$SDXL bash bench/bench_lora.sh 20 > "$OUT/lora-bench-run.log" 2>&1 || echo "bench_lora failed" | tee -a "$OUT/summary.txt"
  tail -12 "$OUT/lora-bench.txt" 2>/dev/null | tee -a "$OUT/summary.txt"
elif [ "$MODE" = caps ]; then  # the mixed batch's serial baseline, the capped runs and the LoRA bench only
  need_loras
  mkbatch "$WORK/mixed.json" 16 16 "$WORK/loras"
  [ -n "${SKIP_SERIAL:-}" ] || run serial "$WORK/mixed.json" --order file --max-batch 1 --no-cuda-graphs --writer-threads 1
  run cap24-b4 "$WORK/mixed.json" --max-batch 4 --vram-limit 24GiB
  run cap12-b4 "$WORK/mixed.json" --max-batch 4 --vram-limit 12GiB
  for n in serial cap24-b4 cap12-b4; do [ -f "$WORK/$n.log" ] && tail -3 "$WORK/$n.log" | sed "s/^/$n: /" >> "$OUT/summary.txt"; done
  [ -n "${SKIP_LORA_BENCH:-}" ] || OUT=$OUT WORK=$WORK BIN=$SDXL bash bench/bench_lora.sh 20 > "$OUT/lora-bench-run.log" 2>&1 || echo "bench_lora failed" | tee -a "$OUT/summary.txt"
  tail -12 "$OUT/lora-bench.txt" 2>/dev/null | tee -a "$OUT/summary.txt"
elif [ "$MODE" = pipeline ]; then
  need_loras
  mkbatch "$WORK/mixed.json" 16 16 "$WORK/loras"
  [ -n "${SKIP_SERIAL:-}" ] || run serial "$WORK/mixed.json" --order file --max-batch 1 --no-cuda-graphs --no-overlap --writer-threads 1
  run no-overlap "$WORK/mixed.json" --max-batch 1 --no-overlap
  run overlap "$WORK/mixed.json" --max-batch 1
  compare no-overlap overlap
  [ -n "${SKIP_CAPS:-}" ] || run cap24-overlap "$WORK/mixed.json" --max-batch 4 --vram-limit 24GiB
  [ -n "${SKIP_CAPS:-}" ] || run cap12-overlap "$WORK/mixed.json" --max-batch 4 --vram-limit 12GiB
  stage_summary
elif [ "$MODE" = single ]; then
  # One H200: where the UNet's time goes, then the mixed batch serial vs the
  # runtime at batch 1 and 4 (each run alone on the GPU), then 64 images of
  # 1024x1024 at --max-batch 4 and 1.
  timeout 240 python3 bench/gpu_unet_profile.py "$MODEL" --json "$OUT/unet-profile.json" 2>&1 | tail -40 | tee -a "$OUT/summary.txt" || true
  need_loras
  mkbatch "$WORK/mixed.json" 16 16 "$WORK/loras"
  mkbatch "$WORK/plain64.json" 64 0
  run serial "$WORK/mixed.json" --order file --max-batch 1 --no-cuda-graphs --no-overlap --writer-threads 1
  run runtime-b1 "$WORK/mixed.json" --max-batch 1
  run runtime-b4 "$WORK/mixed.json" --max-batch 4
  compare serial runtime-b1
  run plain64-b4 "$WORK/plain64.json" --max-batch 4
  run plain64-b1 "$WORK/plain64.json" --max-batch 1
  compare plain64-b1 plain64-b4
  vs_serial runtime-b1 runtime-b4
  wrap_up
elif [ "$MODE" = defaults ]; then
  # Issue 6 with the program's defaults (deterministic cuDNN, expandable
  # segments set from C++, LoRA files loaded while a lane waits for room), on a
  # 2-GPU machine: each run alone on its GPU, two runs at a time. The mixed
  # batch serially and by the runtime at batch 1 and 4, then at batch 4 under
  # 24 and 12 GiB caps; are the PNGs the same across caps and batch sizes;
  # where the device sat idle (bench/stage_gaps.py). DEFAULTS_EXTRA: flags of
  # one more batch-4 run of the mixed batch, beside the 12 GiB one, compared
  # with runtime-b4 (e.g. "--jit-optimize").
  need_loras
  mkbatch "$WORK/mixed.json" 16 16 "$WORK/loras"
  GPU=0 run serial "$WORK/mixed.json" --order file --max-batch 1 --no-cuda-graphs --no-overlap --writer-threads 1 &
  GPU=1 run runtime-b4 "$WORK/mixed.json" --max-batch 4 &
  wait
  GPU=0 run runtime-b1 "$WORK/mixed.json" --max-batch 1 &
  GPU=1 run cap24-b4 "$WORK/mixed.json" --max-batch 4 --vram-limit 24GiB &
  wait
  GPU=0 run cap12-b4 "$WORK/mixed.json" --max-batch 4 --vram-limit 12GiB &
  [ -z "${DEFAULTS_EXTRA:-}" ] || GPU=1 run extra-b4 "$WORK/mixed.json" --max-batch 4 $DEFAULTS_EXTRA &
  wait
  compare serial runtime-b1
  compare runtime-b1 runtime-b4
  compare runtime-b4 cap24-b4
  compare runtime-b4 cap12-b4
  [ -z "${DEFAULTS_EXTRA:-}" ] || compare runtime-b4 extra-b4
  vs_serial runtime-b1 runtime-b4 cap24-b4 cap12-b4
  python3 bench/stage_gaps.py "$WORK"/*/report.json | tee -a "$OUT/summary.txt" || true
  wrap_up
fi
