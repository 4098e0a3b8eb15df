#!/usr/bin/env bash
# Do the runtime's choices change the images? (GPU machine, repository root)
#   OUT=DIR bash bench/runtime/checks.sh check|order     (or bench/gpu_runtime.sh MODE)
# check: the same 3 images with and without CUDA graphs (identical PNGs? s/image),
#        4 images at --max-batch 4 against the same seeds at batch 1 (PSNR),
#        4 images at --max-batch 4 under --vram-limit 12GiB (admission, OOM count).
# order: the same 3 images in two orders, with and without CUDA graphs: an image
#        must not depend on whether it is the first of its size on its GPU.
# Results: $OUT/summary.txt (+ build/export logs and the reports as JSON).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-}
case "$MODE" in check|order) ;; *) echo "usage: [OUT=DIR] bash bench/runtime/checks.sh check|order" >&2; exit 2 ;; esac
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
