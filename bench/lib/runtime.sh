#!/usr/bin/env bash
# What the runtime modes (bench/runtime/*.sh) share; sourced after
# bench/lib/gpu_prepare.sh, which sets OUT, WORK, SDXL and MODEL.
#   run NAME BATCH ARGS...      one sdxl-batch run into $WORK/NAME, a summary line, its report
#                               copied to $OUT (GPU=N: on that GPU only; RUN_TIMEOUT 400 s,
#                               RUN_LOG_LEVEL warn)
#   compare A B                 $WORK/A's PNGs against $WORK/B's: identical? else the worst PSNR
#   vs_serial RUN...            each run's images/hour against the serial run's
#   stage_summary / sample_steady / log_warnings, and wrap_up (the three)
#   need_loras                  the two rank-64 LoRAs of the mixed batches in $WORK/loras
#   mkbatch FILE N_1024 N_PORTRAIT [LORA_DIR]   the mixed batch (with LORA_DIR: three LoRA sets)
#   busy_start FILE             samples GPU utilisation into FILE every 100 ms; prints the pid

busy_start() { nvidia-smi ${GPU:+-i $GPU} --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 > "$1" 2>/dev/null & echo $!; }
# run NAME BATCHFILE ARGS...: one sdxl-batch run into $WORK/NAME, a summary line, report copied to $OUT.
# GPU=N: on that GPU only (--devices N), so two runs can go side by side on a 2-GPU machine.
run() {
  local name=$1 batch=$2; shift 2
  rm -rf "$WORK/$name"
  local util="$WORK/$name.util"
  local upid; upid=$(busy_start "$util")
  local t0; t0=$(date +%s.%N)
  timeout "${RUN_TIMEOUT:-400}" "$SDXL" --log-level "${RUN_LOG_LEVEL:-warn}" run "$batch" --model "$MODEL" --device "${RUN_DEVICE:-cuda}" ${GPU:+--devices $GPU} \
    --out "$WORK/$name" --no-progress "$@" \
    > "$WORK/$name.log" 2>&1 || echo "$name: exit $?" | tee -a "$OUT/summary.txt"
  local wall; wall=$(python3 -c "import time,sys; print(time.time()-float(sys.argv[1]))" "$t0")
  kill "$upid" 2>/dev/null || true
  # with --shard K/N the report is report-shard-K-of-N.json: link it as report.json
  local rep; rep=$(ls "$WORK/$name"/report*.json 2>/dev/null | head -1)
  [ -z "$rep" ] || [ "$rep" = "$WORK/$name/report.json" ] || cp "$rep" "$WORK/$name/report.json"
  cp "$WORK/$name/report.json" "$OUT/report-$name.json" 2>/dev/null || true
  python3 - "$WORK/$name/report.json" "$util" "$name" "$wall" "$*" <<'PY' | tee -a "$OUT/summary.txt" || true
import json, sys
r = json.load(open(sys.argv[1])); name, wall, args = sys.argv[3], float(sys.argv[4]), sys.argv[5]
u = [float(x) for x in open(sys.argv[2]).read().split() if x.strip().replace('.', '', 1).isdigit()]
busy = sum(1 for x in u if x > 0) / len(u) if u else float('nan')
ims = r["images"]; n = r["images_done"]
b = r["batches"]
warm = b[1:] if len(b) > 1 else b  # after the first batch (cold: cuDNN/cuBLAS set-up, graph capture)
warm_s = sum(x["seconds"] for x in warm) / max(1, sum(x["size"] for x in warm if "error" not in x))
m = r["memory"]; q = r["queue"]
sizes = [b["size"] for b in r["batches"]]
print(f"{name:>14}: {n} images in {r['run_s']:.1f} s (+load {r['load_s']:.1f} s, process {wall:.1f} s) = "
      f"{r['images_per_hour']:.0f} images/hour after load; warm {warm_s:.3f} s/image (generation, batches after the first); GPU busy {busy:.0%}; "
      f"peak allocated {m['peak_allocated_bytes']/2**30:.2f} GiB, reserved {m['peak_reserved_bytes']/2**30:.2f} GiB, "
      f"limit {m['limit_bytes']/2**30:.1f} GiB; batches {len(sizes)} (sizes {sorted(set(sizes))}); OOM {q['oom_recoveries']}; "
      f"failed {r['images_failed']} [{args}]")
PY
}
# same_pngs A B: identical files? else PSNR per image
compare() {
  python3 - "$WORK/$1" "$WORK/$2" "$1 vs $2" <<'PY' | tee -a "$OUT/summary.txt" || true
import json, sys, hashlib, math
from pathlib import Path
import numpy as np
from PIL import Image
a, b, label = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
def manifest(d):  # the plain run's manifest.jsonl and each shard's manifest-shard-K-of-N.jsonl
    return {(l["task"], l["index"]): l for m in sorted(d.glob("manifest*.jsonl"))
            for l in map(json.loads, m.read_text().splitlines())}
ma, mb = manifest(a), manifest(b)
same, worst, maxd = 0, float("inf"), 0
common = [k for k in ma if k in mb]  # shards hold part of the images
reseeded = [k for k in common if ma[k]["seed"] != mb[k]["seed"]]  # seed -1 tasks drawn anew (--force, a fresh folder)
common = [k for k in common if k not in reseeded]
for k in common:
    la, lb = ma[k], mb[k]
    if la["sha256"] == lb["sha256"]:
        same += 1; continue
    x = np.asarray(Image.open(a / la["file"])).astype(np.float64); y = np.asarray(Image.open(b / lb["file"])).astype(np.float64)
    mse = ((x - y) ** 2).mean(); maxd = max(maxd, np.abs(x - y).max())
    worst = min(worst, 10 * math.log10(255 ** 2 / mse))
print(f"{label}: {same}/{len(common)} PNGs identical; others: worst PSNR {worst:.1f} dB, max pixel diff {maxd:.0f}"
      + (f" ({len(reseeded)} with another random seed left out)" if reseeded else ""))
PY
}

# Per device from every report of this call: busy fraction and overlapping stage seconds.
stage_summary() {
  python3 - "$WORK" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys, glob, os
for p in sorted(glob.glob(os.path.join(sys.argv[1], "*", "report.json"))):
    r = json.load(open(p)); name = os.path.basename(os.path.dirname(p))
    for d in r.get("devices", []):
        reg = d.get("memory", {}).get("regions", {})
        print(f"{name:>14} {d['name']}: {d['images']} images, {d['images_per_hour']:.0f}/h, busy {d['busy_fraction']:.0%}, "
              f"stages text {d['text_s']:.1f} s sample {d['sample_s']:.1f} s decode {d['decode_s']:.1f} s, overlapping {d['overlap_s']:.1f} s; "
              f"weights {d['memory']['weights_bytes']/2**30:.2f} GiB, sample peak {reg.get('sample',{}).get('peak_work_bytes',0)/2**30:.2f} GiB "
              f"(frag {reg.get('sample',{}).get('max_fragmentation_bytes',0)/2**30:.2f}), decode peak {reg.get('decode',{}).get('peak_work_bytes',0)/2**30:.2f} GiB "
              f"(frag {reg.get('decode',{}).get('max_fragmentation_bytes',0)/2**30:.2f}), LoRA cache {reg.get('lora_cache',{}).get('bytes_held',0)/2**30:.2f} GiB"
              + (f"; FAILED: {d.get('failure')}" if d.get('failed') else ""))
PY
}

# Per run and device: sampling seconds per image over all batches, and the
# steady state (batches after the first of each size: no cold shape).
sample_steady() {
  compgen -G "$WORK/*/report.json" > /dev/null || return 0  # no run finished (e.g. a call that only exported)
  python3 bench/steady_sampling.py "$WORK"/*/report.json | tee -a "$OUT/summary.txt" || true
}

# The runs' warnings and errors, counted.
log_warnings() {
  { grep -hs "warn\|error" "$WORK"/*.log || true; } | sort | uniq -c | sort -rn | head -20 | tee -a "$OUT/summary.txt"
}

# The closing figures of a mode: steady sampling, per-device stages, the logs' warnings.
wrap_up() {
  sample_steady
  stage_summary
  log_warnings
}

# vs_serial RUN...: each run's images/hour against the serial run's ($WORK/NAME/report.json).
vs_serial() {
  python3 - "$WORK" "$@" <<'PY' | tee -a "$OUT/summary.txt" || true
import json, os, sys
work, names = sys.argv[1], sys.argv[2:]
def load(name):
    return json.load(open(os.path.join(work, name, "report.json")))
s = load("serial")
for name in names:
    r = load(name)
    print(f"{name} vs serial: {r['images_per_hour']:.0f} / {s['images_per_hour']:.0f} = {r['images_per_hour'] / s['images_per_hour']:.2f}x; "
          f"batch sizes {sorted(set(b['size'] for b in r['batches']))}; allocator {r['memory'].get('allocator')}; "
          f"engine {[d.get('engine') for d in r.get('devices', [])]}")
PY
}

# The two rank-64 LoRAs of the mixed batches, made once per machine.
need_loras() {  # reference.make_test_loras (tests/ is on PYTHONPATH: gpu_prepare.sh)
  mkdir -p "$WORK/loras"
  [ -f "$WORK/loras/full_b.safetensors" ] || python3 -m reference.make_test_loras --full --out "$WORK/loras" > "$OUT/lora-make.log" 2>&1
}

mkbatch() {  # mkbatch FILE N_1024 N_PORTRAIT [LORA_DIR]: with LORA_DIR, three LoRA sets (none, a, b) in turn
  python3 - "$@" <<'PY'
import json, sys
path, n1, n2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lora_dir = sys.argv[4] if len(sys.argv) > 4 else ""
prios = ["high", "mid", "low"]
sets = ["", " <lora:a:0.8>", " <lora:b:0.8>"] if lora_dir else [""]
tasks = []
for i in range(n1):
    tasks.append({"id": f"sq{i:02d}", "prompt": f"comic panel {i}, a lighthouse keeper in a storm, bold ink lines{sets[i % len(sets)]}",
                  "seed": 1000 + i, "priority": prios[i % 3]})
for i in range(n2):
    tasks.append({"id": f"pt{i:02d}", "prompt": f"comic panel {i}, a girl with a red umbrella in the rain, portrait{sets[(i + 2) % len(sets)]}",
                  "seed": 2000 + i, "width": 832, "height": 1216, "priority": prios[(i + 1) % 3]})
batch = {"version": 1, "defaults": {"negative": "blurry, lowres", "steps": 28, "cfg": 7.0, "width": 1024, "height": 1024},
         "tasks": tasks}
if lora_dir:
    batch["loras"] = {"a": {"path": f"{lora_dir}/full_a.safetensors", "pin": True}, "b": {"path": f"{lora_dir}/full_b.safetensors"}}
json.dump(batch, open(path, "w"), indent=1)
PY
}
