#!/usr/bin/env bash
# Where the UNet's time goes per step (GPU machine, repository root):
#   OUT=DIR bash bench/runtime/trace.sh trace     (or bench/gpu_runtime.sh trace)
# trace: per-step UNet times of 2+2 images (SDXL_TRACE_STEPS=1), with and without
#        CUDA graphs; then the UNet profile (bench/gpu_unet_profile.py) unless
#        SKIP_PROFILE is set.
# Results: $OUT/summary.txt (+ build/export logs and the reports as JSON).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-}
case "$MODE" in trace) ;; *) echo "usage: [OUT=DIR] bash bench/runtime/trace.sh trace" >&2; exit 2 ;; esac
source bench/lib/gpu_prepare.sh  # build + export; sets OUT WORK SDXL MODEL
source bench/lib/runtime.sh

if [ "$MODE" = trace ]; then
  # Per-step timing of the first batches of two shapes (SDXL_TRACE_STEPS=1:
  # a sync around every UNet call), with and without CUDA graphs; then the
  # UNet profile (gpu_unet_profile.py) unless SKIP_PROFILE is set.
  mkbatch "$WORK/trace.json" 2 2
  for g in graphs plain; do
    flags=(--max-batch 1 --order file); [ $g = plain ] && flags+=(--no-cuda-graphs)
    rm -rf "$WORK/trace-$g"
    SDXL_TRACE_STEPS=1 timeout 120 "$SDXL" --log-level info run "$WORK/trace.json" --model "$MODEL" --device cuda \
      --out "$WORK/trace-$g" --no-progress "${flags[@]}" > "$WORK/trace-$g.log" 2>&1 || echo "trace-$g: exit $?"
    grep -E "trace:|captured|loaded model" "$WORK/trace-$g.log" | sed "s/^[0-9-]* //" > "$OUT/trace-$g.txt"
    python3 - "$WORK/trace-$g.log" "$g" <<'PY' | tee -a "$OUT/summary.txt"
import re, sys
calls = [(m.group(1), float(m.group(2)), float(m.group(3))) for m in
         re.finditer(r"latents \[([^\]]+)\] t=[\d.]+: UNet call ([\d.]+) ms, sampler between calls ([\d.]+) ms", open(sys.argv[1]).read())]
print(f"{sys.argv[2]}: {len(calls)} UNet calls")
for i, (shape, ms, gap) in enumerate(calls):
    if i % 28 in (0, 1, 2, 27) or ms > 150 or gap > 50:
        print(f"  call {i:3d} image {i // 28} [{shape}]: UNet {ms:.1f} ms, between {gap:.1f} ms")
PY
    cp "$WORK/trace-$g/report.json" "$OUT/report-trace-$g.json" 2>/dev/null || true
  done
  [ -n "${SKIP_PROFILE:-}" ] || timeout 200 python3 bench/gpu_unet_profile.py "$MODEL" --json "$OUT/unet-profile.json" 2>&1 | tail -40 | tee -a "$OUT/summary.txt" || true
fi
