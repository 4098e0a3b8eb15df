#!/usr/bin/env bash
# Runtime measurements on the GPU machine (full-size random SDXL, fp16, 28 steps,
# CFG 7), one command, from the repository root:
#   OUT=DIR bash bench/gpu_runtime.sh check   # CUDA graphs on/off, batching, 12 GiB cap
#   OUT=DIR bash bench/gpu_runtime.sh mixed   # the 32-image mixed batch, serial vs runtime, caps
#   OUT=DIR bash bench/gpu_runtime.sh pipeline  # the mixed batch: serial, runtime without / with stage overlap
#   OUT=DIR bash bench/gpu_runtime.sh multi   # 64 images on GPU 0, then on GPUs 0 and 1 (a 2-GPU machine)
#   OUT=DIR bash bench/gpu_runtime.sh order   # same 3 images in two orders, graphs on/off: identical PNGs?
#   OUT=DIR bash bench/gpu_runtime.sh x2      # pipeline + caps + multi in one call on a 2-GPU machine
#                                               # (single-GPU runs go two at a time, one per GPU)
#   OUT=DIR bash bench/gpu_runtime.sh scale   # 2-GPU machine: 64 images on GPU 0 alone, on GPUs 0,1 in
#                                               # one process, and as two processes (--shard 0/2, 1/2);
#                                               # then the mixed batch: serial vs runtime (batch 1 and 4)
#   OUT=DIR bash bench/gpu_runtime.sh single  # 1 H200: UNet profile (gpu_unet_profile.py), the mixed
#                                               # batch serial vs runtime b1/b4, 64 images at b4 and b1
#   OUT=DIR bash bench/gpu_runtime.sh trace   # per-step UNet times of 2+2 images (SDXL_TRACE_STEPS=1)
#   OUT=DIR bash bench/gpu_runtime.sh defaults  # 2-GPU machine: the mixed batch with the program's
#                                               # defaults, serial vs runtime b1/b4, b4 under 24 / 12 GiB,
#                                               # two runs at a time; PNGs across caps; idle gaps
#   OUT=DIR bash bench/gpu_runtime.sh capmerge  # 2-GPU machine: the mixed batch at b4 under 24 and 12 GiB,
#                                               # info logs (each LoRA switch's merge), peak vs cap; then
#                                               # uncapped, PNGs compared
#   OUT=DIR bash bench/gpu_runtime.sh loop    # 2-GPU machine: the mixed batch by the for-loop a user would
#                                               # write with diffusers (reference.diffusers_loop) beside
#                                               # sdxl-batch serial, then the runtime at b1 and b4, and at
#                                               # b4 under 24 and 12 GiB
#   OUT=DIR bash bench/gpu_runtime.sh wscap   # 2-GPU machine: the mixed batch at b1 uncapped and under
#                                               # 12 GiB, without and with a cuDNN workspace cap (WSCAP MiB)
#   OUT=DIR bash bench/gpu_runtime.sh alloc   # the mixed batch at b4, uncapped / 24 / 12 GiB, default
#                                               # allocator vs expandable segments (ALLOC_CAPS picks caps)
# check: the same 3 images with and without CUDA graphs (identical PNGs? s/image),
#        4 images at --max-batch 4 against the same seeds at batch 1 (PSNR),
#        4 images at --max-batch 4 under --vram-limit 12GiB (admission, OOM count).
# mixed: 32 images (1024x1024 and 832x1216, priorities high/mid/low, three LoRA
#        sets: none and two rank-64 LoRAs from reference.make_test_loras --full) run
#        serially (--max-batch 1, no CUDA graphs, one writer) and by the runtime
#        (graphs, --max-batch 1), then at --max-batch 4 under 24 GiB and 12 GiB
#        caps; images/hour, GPU busy fraction (nvidia-smi, 100 ms), peaks; then
#        bench/bench_lora.sh (load / cached switch / restore of rank-64 LoRAs).
# pipeline: the mixed batch serially (file order, one batch at a time, no graphs,
#        --no-overlap), by the runtime with --no-overlap, and by the runtime
#        (stages overlapping: text / sample / decode on three streams); PNGs
#        compared; per-device busy and overlap seconds from report.json.
# multi: 64 images (the mixed batch twice over) with --devices 0 and with
#        --devices 0,1; the scaling ratio; PNGs compared (noise is drawn on
#        the CPU, so they must match).
# Results: $OUT/summary.txt (+ build/export logs and the reports as JSON).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-check}
if [ "$MODE" = loop ]; then  # diffusers needs the export's diffusers copy: export again if a warm machine lacks it
  export SDXL_SAVE_DIFFUSERS=1
  [ -f "${WORK:-/tmp/sdxl-gpu}/full-diffusers/model_index.json" ] || rm -f "${WORK:-/tmp/sdxl-gpu}/${SDXL_MODEL_NAME:-full}/model.json"
fi
source bench/lib/gpu_prepare.sh

busy_start() { nvidia-smi ${GPU:+-i $GPU} --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 > "$1" 2>/dev/null & echo $!; }
# run NAME BATCHFILE ARGS...: one sdxl-batch run into $WORK/NAME, a summary line, report copied to $OUT.
# GPU=N: on that GPU only (--devices N), so two runs can go side by side on a 2-GPU machine.
run() {
  local name=$1 batch=$2; shift 2
  rm -rf "$WORK/$name"
  local util="$WORK/$name.util"
  local upid; upid=$(busy_start "$util")
  local t0; t0=$(date +%s.%N)
  timeout "${RUN_TIMEOUT:-400}" "$SDXL" --log-level "${RUN_LOG_LEVEL:-warn}" run "$batch" --model "$MODEL" --device cuda ${GPU:+--devices $GPU} \
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
ma = {(l["task"], l["index"]): l for l in map(json.loads, (a / "manifest.jsonl").read_text().splitlines())}
mb = {(l["task"], l["index"]): l for l in map(json.loads, (b / "manifest.jsonl").read_text().splitlines())}
same, worst, maxd = 0, float("inf"), 0
common = [k for k in ma if k in mb]  # shards hold part of the images
for k in common:
    la, lb = ma[k], mb[k]
    if la["sha256"] == lb["sha256"]:
        same += 1; continue
    x = np.asarray(Image.open(a / la["file"])).astype(np.float64); y = np.asarray(Image.open(b / lb["file"])).astype(np.float64)
    mse = ((x - y) ** 2).mean(); maxd = max(maxd, np.abs(x - y).max())
    worst = min(worst, 10 * math.log10(255 ** 2 / mse))
print(f"{label}: {same}/{len(common)} PNGs identical; others: worst PSNR {worst:.1f} dB, max pixel diff {maxd:.0f}")
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
  python3 bench/steady_sampling.py "$WORK"/*/report.json | tee -a "$OUT/summary.txt" || true
}

# The runs' warnings and errors, counted.
log_warnings() {
  { grep -h "warn\|error" "$WORK"/*.log || true; } | sort | uniq -c | sort -rn | head -20 | tee -a "$OUT/summary.txt"
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
need_loras() {
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
elif [ "$MODE" = caps ]; then  # the mixed batch's serial baseline, the capped runs and the LoRA bench only
  need_loras
  mkbatch "$WORK/mixed.json" 16 16 "$WORK/loras"
  [ -n "${SKIP_SERIAL:-}" ] || run serial "$WORK/mixed.json" --order file --max-batch 1 --no-cuda-graphs --writer-threads 1
  run cap24-b4 "$WORK/mixed.json" --max-batch 4 --vram-limit 24GiB
  run cap12-b4 "$WORK/mixed.json" --max-batch 4 --vram-limit 12GiB
  for n in serial cap24-b4 cap12-b4; do [ -f "$WORK/$n.log" ] && tail -3 "$WORK/$n.log" | sed "s/^/$n: /" >> "$OUT/summary.txt"; done
  [ -n "${SKIP_LORA_BENCH:-}" ] || OUT=$OUT WORK=$WORK BIN=$SDXL bash bench/bench_lora.sh 20 > "$OUT/lora-bench-run.log" 2>&1 || echo "bench_lora failed" | tee -a "$OUT/summary.txt"
  tail -12 "$OUT/lora-bench.txt" 2>/dev/null | tee -a "$OUT/summary.txt"
elif [ "$MODE" = mixed ]; then
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
elif [ "$MODE" = capmerge ]; then
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
elif [ "$MODE" = loop ]; then
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
elif [ "$MODE" = trace ]; then
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
elif [ "$MODE" = multi ]; then
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
else
  echo "mode: check | mixed | caps | pipeline | multi | order | x2 | scale | single | trace | defaults | capmerge | loop | wscap | alloc" >&2; exit 2
fi
