#!/usr/bin/env bash
# Two GPUs of one machine (repository root):
#   OUT=DIR bash bench/runtime/multigpu.sh MODE     (or bench/gpu_runtime.sh MODE)
# multi: 64 images (the mixed batch twice over) with --devices 0 and with
#        --devices 0,1; the scaling ratio; PNGs compared (noise is drawn on
#        the CPU, so they must match).
# x2:    pipeline + caps + multi in one call (single-GPU runs go two at a time,
#        one per GPU).
# scale: 64 images on GPU 0 alone, on GPUs 0,1 in one process, and as two
#        processes (--shard 0/2, 1/2); then the mixed batch: serial vs runtime
#        (batch 1 and 4). SCALE_IMAGES (32 per size), SCALE_SHARDS=0 (no
#        two-process control), SCALE_MIXED=0 (no mixed batch), SCALE_FLAGS.
# Results: $OUT/summary.txt (+ build/export logs and the reports as JSON).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-}
case "$MODE" in multi|x2|scale) ;; *) echo "usage: [OUT=DIR] bash bench/runtime/multigpu.sh multi|x2|scale" >&2; exit 2 ;; esac
source bench/lib/gpu_prepare.sh  # build + export; sets OUT WORK SDXL MODEL
source bench/lib/runtime.sh

if [ "$MODE" = multi ]; then
  need_loras
  mkbatch "$WORK/mixed64.json" 32 32 "$WORK/loras"
  run gpu0 "$WORK/mixed64.json" --max-batch 1 --devices 0
  run gpu01 "$WORK/mixed64.json" --max-batch 1 --devices 0,1
  compare gpu0 gpu01
  python3 - "$WORK/gpu0/report.json" "$WORK/gpu01/report.json" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
print(f"scaling: {a['images_per_hour']:.0f} images/hour on 1 GPU, {b['images_per_hour']:.0f} on 2 GPUs = "
      f"{b['images_per_hour'] / a['images_per_hour']:.2f}x (load {a['load_s']:.1f} s / {b['load_s']:.1f} s, not counted)")
PY
  stage_summary
elif [ "$MODE" = x2 ]; then
  need_loras
  mkbatch "$WORK/mixed.json" 16 16 "$WORK/loras"
  mkbatch "$WORK/mixed64.json" 32 32 "$WORK/loras"
  GPU=0 run serial "$WORK/mixed.json" --order file --max-batch 1 --no-cuda-graphs --no-overlap --writer-threads 1 &
  GPU=1 run no-overlap "$WORK/mixed.json" --max-batch 1 --no-overlap &
  wait
  GPU=0 run overlap "$WORK/mixed.json" --max-batch 1 &
  GPU=1 run cap24-overlap "$WORK/mixed.json" --max-batch 4 --vram-limit 24GiB &
  wait
  GPU=0 run gpu0 "$WORK/mixed64.json" --max-batch 1 &
  GPU=1 run cap12-overlap "$WORK/mixed.json" --max-batch 4 --vram-limit 12GiB &
  wait
  run gpu01 "$WORK/mixed64.json" --max-batch 1 --devices 0,1
  compare serial overlap
  compare no-overlap overlap
  compare gpu0 gpu01
  python3 - "$WORK/serial/report.json" "$WORK/no-overlap/report.json" "$WORK/overlap/report.json" "$WORK/gpu0/report.json" "$WORK/gpu01/report.json" <<'PY' | tee -a "$OUT/summary.txt" || true
import json, sys
s, n, o, a, b = (json.load(open(p)) for p in sys.argv[1:6])
print(f"runtime vs serial: {o['images_per_hour']:.0f} / {s['images_per_hour']:.0f} = {o['images_per_hour'] / s['images_per_hour']:.2f}x; "
      f"overlap vs no-overlap: {o['images_per_hour']:.0f} / {n['images_per_hour']:.0f} = {o['images_per_hour'] / n['images_per_hour']:.2f}x")
print(f"scaling: {a['images_per_hour']:.0f} images/hour on 1 GPU, {b['images_per_hour']:.0f} on 2 GPUs = "
      f"{b['images_per_hour'] / a['images_per_hour']:.2f}x (load {a['load_s']:.1f} s / {b['load_s']:.1f} s, not counted)")
PY
  wrap_up
elif [ "$MODE" = scale ]; then
  need_loras
  mkbatch "$WORK/mixed.json" 16 16 "$WORK/loras"
  # SCALE_IMAGES (32): images per size of the scaling batch (2 sizes); SCALE_SHARDS=0
  # leaves out the two-process control, SCALE_MIXED=0 the mixed batch after it.
  n_scale=${SCALE_IMAGES:-32}
  mkbatch "$WORK/mixed64.json" "$n_scale" "$n_scale" "$WORK/loras"
  echo "scaling batch: $((2 * n_scale)) images, flags: ${SCALE_FLAGS:-none}" | tee -a "$OUT/summary.txt"
  # SCALE_FLAGS: extra flags of these four runs (e.g. --deterministic-cudnn)
  run gpu0 "$WORK/mixed64.json" --max-batch 1 --devices 0 ${SCALE_FLAGS:-}
  run gpu01 "$WORK/mixed64.json" --max-batch 1 --devices 0,1 ${SCALE_FLAGS:-}
  compare gpu0 gpu01
  reports=("$WORK/gpu0/report.json" "$WORK/gpu01/report.json")
  if [ "${SCALE_SHARDS:-1}" != 0 ]; then
    GPU=0 run shard0 "$WORK/mixed64.json" --max-batch 1 --shard 0/2 ${SCALE_FLAGS:-} &
    GPU=1 run shard1 "$WORK/mixed64.json" --max-batch 1 --shard 1/2 ${SCALE_FLAGS:-} &
    wait
    compare gpu0 shard0
    compare gpu0 shard1
    reports+=("$WORK/shard0/report.json" "$WORK/shard1/report.json")
  fi
  python3 - "${reports[@]}" <<'PY' | tee -a "$OUT/summary.txt" || true
import json, sys
a, b, *shards = (json.load(open(p)) for p in sys.argv[1:])
line = (f"scaling: {a['images_per_hour']:.0f} images/hour on 1 GPU; 2 GPUs in one process {b['images_per_hour']:.0f} = "
        f"{b['images_per_hour'] / a['images_per_hour']:.2f}x")
if shards:
    s0, s1 = shards
    # images_per_hour counts from the model load's end (run_s includes the load): the same for the pair
    two = (s0["images_done"] + s1["images_done"]) * 3600 / max(s0["run_s"] - s0["load_s"], s1["run_s"] - s1["load_s"])
    line += f"; 2 processes (one per GPU, --shard) {two:.0f} = {two / a['images_per_hour']:.2f}x"
# with the model load counted: the whole command, images over run_s
line += (f"; load counted: {a['images_done'] * 3600 / a['run_s']:.0f} vs {b['images_done'] * 3600 / b['run_s']:.0f} = "
         f"{(b['images_done'] / b['run_s']) / (a['images_done'] / a['run_s']):.2f}x (load {a['load_s']:.1f} / {b['load_s']:.1f} s)")
print(line)
for name, r in zip(("gpu0", "gpu01", "shard0", "shard1"), (a, b, *shards)):
    l = r.get("lora", {})
    for d in r.get("devices", []):
        print(f"  {name} {d['name']}: {d['images']} images, sampling {d['sample_s'] / max(1, d['images']):.3f} s/image, "
              f"text {d['text_s']:.1f} s, decode {d['decode_s']:.1f} s, busy {d['busy_fraction']:.0%}, engine {d.get('engine', {})}")
    print(f"  {name} LoRA: load {l.get('load_s', 0):.2f} s (hash {l.get('hash_s', 0):.2f} s), merge {l.get('merge_s', 0):.2f} s, switches {l.get('switches')}")
PY
  sample_steady
  if [ "${SCALE_MIXED:-1}" = 0 ]; then stage_summary; exit 0; fi
  GPU=0 run serial "$WORK/mixed.json" --order file --max-batch 1 --no-cuda-graphs --no-overlap --writer-threads 1 &
  GPU=1 run runtime-b4 "$WORK/mixed.json" --max-batch 4 &
  wait
  GPU=0 run runtime-b1 "$WORK/mixed.json" --max-batch 1 &
  GPU=1 run runtime-b4-24g "$WORK/mixed.json" --max-batch 4 --vram-limit 24GiB &
  wait
  compare serial runtime-b1
  vs_serial runtime-b1 runtime-b4 runtime-b4-24g
  wrap_up
fi
