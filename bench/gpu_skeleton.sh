#!/usr/bin/env bash
# On the GPU machine (H200, CUDA 13, python3 with torch 2.11.0+cu130, no network),
# from the repository root, after scripts/gather_deps.sh ran on a networked machine
# and .deps + .whl were carried:
#   1. build sdxl-batch against that python3's libtorch (cmake --preset gpu),
#      while exporting the full-size SDXL architecture with random weights
#      (fp16, traced on cuda) plus its diffusers copy;
#   2. sdxl-batch: 3 images of 1024x1024, 28 steps, CFG 7 in one process
#      (the first is the cold one; report.json has the per-stage split);
#   3. diffusers on the same weights and settings (eager, batch 1, after warm-up);
#   4. PSNR of sdxl-batch's seed-1 image against diffusers' seed-1 image.
# Results go to $OUT (default bench/tmp), eight files: summary.txt, build.log, export.log,
# run.log, report.json (sdxl-batch), diffusers.json, sdxl-seed1.png, diffusers-seed1.png.
set -euo pipefail
cd "$(dirname "$0")/.."
SDXL_SAVE_DIFFUSERS=1 SDXL_EXPORT_CHECK=quick source bench/lib/gpu_prepare.sh

cat > "$WORK/batch.json" <<'JSON'
{"version": 1,
 "defaults": {"negative": "blurry, lowres", "steps": 28, "cfg": 7.0, "width": 1024, "height": 1024},
 "tasks": [
  {"id": "cold", "prompt": "comic panel, a lighthouse keeper in a storm, bold ink lines", "seed": 0},
  {"id": "warm", "prompt": "comic panel, a lighthouse keeper in a storm, bold ink lines", "seed": 1, "count": 2}]}
JSON
rm -rf "$WORK/run"
build/gpu/sdxl-batch run "$WORK/batch.json" --model "$WORK/full" --device cuda --out "$WORK/run" 2>&1 | tee "$OUT/run.log"
cp "$WORK/run/report.json" "$OUT/report.json"
cp "$WORK/run/warm-0-1.png" "$OUT/sdxl-seed1.png"
# Variants: TorchScript fusion and cuDNN autotuning (speed vs reproducibility).
for v in "--jit-optimize" "--cudnn-benchmark" "--jit-optimize --cudnn-benchmark"; do
  rm -rf "$WORK/run-v"
  build/gpu/sdxl-batch --log-level warn run "$WORK/batch.json" --model "$WORK/full" --device cuda --out "$WORK/run-v" $v
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); w=[i for i in r['images'] if i['task']=='warm']; print(sys.argv[2], 'warm s/image', round(min(i['total_s'] for i in w),3), 'sample', round(min(i['sample_s'] for i in w),3))" "$WORK/run-v/report.json" "$v" | tee -a "$OUT/summary.txt"
done
python3 bench/bench_diffusers_sdxl.py --diffusers "$WORK/full-diffusers" --out "$OUT/diffusers.json" \
  --png "$OUT/diffusers-seed1.png" --seed 1 --images 2 2>&1 | tail -3
python3 -m reference.compare_images "$OUT/sdxl-seed1.png" "$OUT/diffusers-seed1.png" --min-psnr 0 | tee -a "$OUT/summary.txt"
python3 - "$OUT" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
out = sys.argv[1]
r = json.load(open(f"{out}/report.json")); d = json.load(open(f"{out}/diffusers.json"))
for im in r["images"]:
    print(f"sdxl-batch {im['task']}-{im['index']}: total {im['total_s']:.3f} s = text {im['text_s']:.3f} + sample {im['sample_s']:.3f} + decode {im['decode_s']:.3f} + write {im['write_s']:.3f}")
warm = min(im["total_s"] for im in r["images"] if im["task"] == "warm")
print(f"sdxl-batch: {warm:.3f} s/image warm, load {r['load_s']:.1f} s, peak allocated {r['peak_memory_bytes']/2**30:.2f} GiB")
print(f"diffusers eager b1: {d['s_per_image']:.3f} s/image, peak allocated {d['peak_allocated_bytes']/2**30:.2f} GiB (calls {d['call_s']})")
print(f"ratio diffusers/sdxl-batch: {d['s_per_image']/warm:.2f}x")
PY
