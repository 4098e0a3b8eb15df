#!/usr/bin/env bash
# On the GPU machine, after bench/gpu_skeleton.sh built build/gpu/sdxl-batch and
# exported the full-size SDXL (random weights, fp16) to $WORK/full:
#   1. reference.make_test_loras --full (tests/reference): two rank-64 kohya LoRAs (UNet attention,
#      ff and proj layers + both text encoders, fp16) shaped for the full SDXL;
#   2. sdxl-lora-bench: time to load each from disk onto the GPU and merge it,
#      cached switches A<->B (median/mean/min/max), restore to the base weights;
#   3. a 3-image run alternating the two LoRAs (per-image lora_s in report.json,
#      cache hits/misses/evictions in its "lora" section).
# Usage: bench/bench_lora.sh [SWITCHES]   env: WORK (/tmp/sdxl-gpu), OUT (bench/tmp), BIN (build/gpu/sdxl-batch),
#   LORA_BENCH (build/gpu/sdxl-lora-bench)
# Note: the LoRA files were just written, so "from disk" is from the page cache
# unless the caches are dropped first (echo 3 > /proc/sys/vm/drop_caches, root).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/sdxl-gpu}
OUT=${OUT:-$PWD/bench/tmp}
BIN=${BIN:-build/gpu/sdxl-batch}
LORA_BENCH=${LORA_BENCH:-$(dirname "$BIN")/sdxl-lora-bench}
switches=${1:-40}
mkdir -p "$OUT" "$WORK/loras"
[ -f "$WORK/full/model.json" ] || { echo "bench_lora: no $WORK/full/model.json (run bench/gpu_skeleton.sh first)" >&2; exit 1; }
if [ ! -f "$WORK/loras/full_b.safetensors" ]; then
  PYTHONPATH=$PWD/tests${PYTHONPATH:+:$PYTHONPATH} python3 -m reference.make_test_loras --full --out "$WORK/loras" | tee "$OUT/lora-make.log"
fi
ls -l "$WORK"/loras/full_*.safetensors | tee "$OUT/lora-bench.txt"
"$LORA_BENCH" --model "$WORK/full" --device cuda --lora "$WORK/loras/full_a.safetensors:0.8" \
  --lora "$WORK/loras/full_b.safetensors:0.8" --switches "$switches" --json "$OUT/lora-bench.json" 2>&1 | tee -a "$OUT/lora-bench.txt"
cat > "$WORK/lora-batch.json" <<JSON
{"version": 1,
 "loras": {"a": {"path": "$WORK/loras/full_a.safetensors", "pin": true}, "b": {"path": "$WORK/loras/full_b.safetensors"}},
 "defaults": {"steps": 4, "width": 1024, "height": 1024},
 "tasks": [
  {"id": "a1", "prompt": "comic panel, a lighthouse keeper <lora:a:0.8>", "seed": 1},
  {"id": "b1", "prompt": "comic panel, a lighthouse keeper <lora:b:0.8>", "seed": 1},
  {"id": "a2", "prompt": "comic panel, a lighthouse keeper <lora:a:0.8>", "seed": 1}]}
JSON
rm -rf "$WORK/lora-run"
"$BIN" run "$WORK/lora-batch.json" --model "$WORK/full" --device cuda --out "$WORK/lora-run" 2>&1 | grep -E "LoRA|done" | tee -a "$OUT/lora-bench.txt"
python3 - "$WORK/lora-run/report.json" <<'PY' | tee -a "$OUT/lora-bench.txt"
import json, sys
r = json.load(open(sys.argv[1]))
for im in r["images"]:
    print(f"{im['task']}: lora switch {im.get('lora_s', 0):.3f} s, sample {im['sample_s']:.3f} s")
print("cache:", json.dumps(r.get("lora", {})))
PY
