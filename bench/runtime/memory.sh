#!/usr/bin/env bash
# The mixed batch under --vram-limit caps (GPU machine, repository root):
#   OUT=DIR bash bench/runtime/memory.sh MODE     (or bench/gpu_runtime.sh MODE)
# capmerge: 2-GPU machine: b4 under 24 and 12 GiB with info logs (each LoRA
#        switch's merge), peak reserved vs the cap; then uncapped, PNGs compared.
# wscap: 2-GPU machine: b1 uncapped and under 12 GiB, without and with a cuDNN
#        workspace cap (WSCAP MiB, 512).
# alloc: b4 uncapped / 24 / 12 GiB (ALLOC_CAPS picks them), the default caching
#        allocator vs expandable segments.
# Results: $OUT/summary.txt (+ build/export logs and the reports as JSON).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-}
case "$MODE" in capmerge|wscap|alloc) ;; *) echo "usage: [OUT=DIR] bash bench/runtime/memory.sh capmerge|wscap|alloc" >&2; exit 2 ;; esac
source bench/lib/gpu_prepare.sh  # build + export; sets OUT WORK SDXL MODEL
source bench/lib/runtime.sh

if [ "$MODE" = capmerge ]; then
  # Issue 6 under the caps alone (a 2-GPU machine, one run per GPU): the mixed
  # batch at --max-batch 4 under 24 and 12 GiB, logged at info level, so each
  # LoRA switch's load and merge seconds show; peak reserved against the cap;
  # then the same batch uncapped (LoRA originals on the device): are the 24 GiB
  # run's PNGs the same (merges from host and device originals alike)?
  need_loras
  mkbatch "$WORK/mixed.json" 16 16 "$WORK/loras"
  export RUN_LOG_LEVEL=info
  GPU=0 run cap12-b4 "$WORK/mixed.json" --max-batch 4 --vram-limit 12GiB &
  GPU=1 run cap24-b4 "$WORK/mixed.json" --max-batch 4 --vram-limit 24GiB &
  wait
  GPU=0 run runtime-b4 "$WORK/mixed.json" --max-batch 4
  compare runtime-b4 cap24-b4
  compare runtime-b4 cap12-b4
  for n in runtime-b4 cap24-b4 cap12-b4; do
    grep -h "LoRA set" "$WORK/$n.log" | sed "s/^/$n: /" | tee -a "$OUT/summary.txt"
    python3 - "$WORK/$n/report.json" "$n" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
r = json.load(open(sys.argv[1])); m = r["memory"]; l = r.get("lora", {})
left = (m["limit_bytes"] - m["peak_reserved_bytes"]) / 2**20
print(f"{sys.argv[2]}: peak reserved {m['peak_reserved_bytes']} of limit {m['limit_bytes']} bytes ({left:+.1f} MiB left); "
      f"LoRA merge {l.get('merge_s', 0):.2f} s over {l.get('switches', 0)} switches; OOM {sum(d.get('oom', 0) for d in r['devices'])}")
PY
  done
  wrap_up
elif [ "$MODE" = wscap ]; then
  # Under --vram-limit 12GiB the mixed batch's images stopped matching the
  # uncapped ones once the LoRA cache had grown (call 1 of 2026-11-30, sixth
  # session: 15/32 identical at batch 1, all the later ones differing by 1
  # level): cuDNN falls back to convolution algorithms whose workspace fits.
  # Capping cuDNN's workspace everywhere (CUDNN_CONV_WSCAP_DBG, MiB) would make
  # the choice the same under any cap that leaves that much. Two pairs, each
  # run alone on its GPU: without the workspace cap, then with WSCAP (512).
  need_loras
  mkbatch "$WORK/mixed.json" 16 16 "$WORK/loras"
  GPU=0 run b1 "$WORK/mixed.json" --max-batch 1 &
  GPU=1 run cap12-b1 "$WORK/mixed.json" --max-batch 1 --vram-limit 12GiB &
  wait
  export CUDNN_CONV_WSCAP_DBG=${WSCAP:-512}
  echo "CUDNN_CONV_WSCAP_DBG=$CUDNN_CONV_WSCAP_DBG from here" | tee -a "$OUT/summary.txt"
  GPU=0 run ws-b1 "$WORK/mixed.json" --max-batch 1 &
  GPU=1 run ws-cap12-b1 "$WORK/mixed.json" --max-batch 1 --vram-limit 12GiB &
  wait
  compare b1 cap12-b1
  compare ws-b1 ws-cap12-b1
  compare b1 ws-b1
  wrap_up
elif [ "$MODE" = alloc ]; then
  # Issue 6: the caching allocator's settings by measurement. The mixed batch
  # at --max-batch 4, uncapped and under 24 / 12 GiB, with the default
  # allocator and with expandable segments (PYTORCH_CUDA_ALLOC_CONF, read by
  # libtorch's allocator in the C++ program too): images/hour, peak reserved
  # and fragmentation (reserved - allocated) per region, OOM count.
  need_loras
  mkbatch "$WORK/mixed.json" 16 16 "$WORK/loras"
  # ALLOC_CAPS ("none 24GiB 12GiB"): the caps to run, each with both allocators.
  caps=(${ALLOC_CAPS:-none 24GiB 12GiB})
  for conf in default expandable; do
    for cap in "${caps[@]}"; do
      flags=(--max-batch 4); [ $cap = none ] || flags+=(--vram-limit $cap)
      if [ $conf = expandable ]; then
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True run "alloc-$conf-$cap" "$WORK/mixed.json" "${flags[@]}"
      else
        run "alloc-$conf-$cap" "$WORK/mixed.json" "${flags[@]}"
      fi
    done
  done
  for cap in "${caps[@]}"; do compare "alloc-default-$cap" "alloc-expandable-$cap"; done
  wrap_up
fi
