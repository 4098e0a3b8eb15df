#!/usr/bin/env bash
# Do the runtime's choices change the images? (GPU machine, repository root)
#   OUT=DIR bash bench/runtime/checks.sh check|order     (or bench/gpu_runtime.sh MODE)
# check: the same 3 images with and without CUDA graphs (identical PNGs? s/image),
#        4 images at --max-batch 4 against the same seeds at batch 1 (PSNR),
#        4 images at --max-batch 4 under --vram-limit 12GiB (admission, OOM count).
# order: the same 3 images in two orders, with and without CUDA graphs: an image
#        must not depend on whether it is the first of its size on its GPU.
# story: configs/story-wildcards.json (characters, a style, wildcards; 12 images
#        at 1024²) run, run --force, two shards and --max-batch 4: the same PNGs?
#        (its one random-seed task draws a new seed in --force and shard runs)
#        Then the time of --verify-model on the full-size export (all its files).
# Results: $OUT/summary.txt (+ build/export logs and the reports as JSON).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-}
case "$MODE" in check|order|story) ;; *) echo "usage: [OUT=DIR] bash bench/runtime/checks.sh check|order|story" >&2; exit 2 ;; esac
source bench/lib/gpu_prepare.sh  # build + export; sets OUT WORK SDXL MODEL
source bench/lib/runtime.sh

if [ "$MODE" = check ]; then
  mkbatch "$WORK/three.json" 3 0
  run graphs-off "$WORK/three.json" --no-cuda-graphs
  run graphs-on "$WORK/three.json"
  compare graphs-off graphs-on
  mkbatch "$WORK/four.json" 4 0
  run four-b1 "$WORK/four.json" --max-batch 1
  run four-b4 "$WORK/four.json" --max-batch 4
  compare four-b1 four-b4
  run four-b4-12g "$WORK/four.json" --max-batch 4 --vram-limit 12GiB
  log_warnings
elif [ "$MODE" = story ]; then
  story=configs/story-wildcards.json
  run story-a "$story"
  run story-force "$story" --force
  run story-s0 "$story" --shard 0/2 && cp -r "$WORK/story-s0" "$WORK/story-shards"
  rm -rf "$WORK/story-s1" && "$SDXL" --log-level warn run "$story" --model "$MODEL" --device cuda \
    --out "$WORK/story-shards" --shard 1/2 --no-progress > "$WORK/story-s1.log" 2>&1 || echo "story-s1: exit $?" >> "$OUT/summary.txt"
  run story-b4 "$story" --max-batch 4
  compare story-a story-force
  compare story-a story-shards
  compare story-a story-b4
  du -sb "$MODEL" | awk '{printf "model folder: %.2f GB\n", $1/1e9}' | tee -a "$OUT/summary.txt"
  sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null && echo "page cache dropped" | tee -a "$OUT/summary.txt" || true
  for k in 1 2; do
    t0=$(date +%s.%N)
    "$SDXL" run "$story" --model "$MODEL" --out "$WORK/verify" --dry-run --verify-model 2>&1 | grep -- "--verify-model" \
      | tee -a "$OUT/summary.txt"
    python3 -c "import sys,time; print(f'verify run {sys.argv[2]}: {time.time()-float(sys.argv[1]):.1f} s wall (dry run)')" "$t0" "$k" \
      | tee -a "$OUT/summary.txt"
  done
  log_warnings
elif [ "$MODE" = order ]; then
  # An image must not depend on whether it is the first of its size on its GPU.
  mkbatch "$WORK/fwd.json" 3 0
  python3 - "$WORK/fwd.json" "$WORK/rev.json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1])); b["tasks"].reverse(); json.dump(b, open(sys.argv[2], "w"), indent=1)
PY
  run fwd-graphs "$WORK/fwd.json" --order file
  run rev-graphs "$WORK/rev.json" --order file
  run fwd-plain "$WORK/fwd.json" --order file --no-cuda-graphs
  run rev-plain "$WORK/rev.json" --order file --no-cuda-graphs
  compare fwd-graphs rev-graphs
  compare fwd-plain rev-plain
  compare fwd-plain fwd-graphs
fi
