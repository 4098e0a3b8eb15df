#!/usr/bin/env bash
# On the GPU machine: the AOTInductor UNet backend (--unet-backend aoti) on the
# full-size SDXL architecture, fp16, against the TorchScript UNet.
#   1. build (cmake --preset gpu) and export $WORK/full-aoti with --aoti (AOTInductor
#      compiles the UNet for cuda; compile time and package size in export.log);
#   2. the same batch (1024x1024, 28 steps, CFG 7: one cold image, two warm) with
#      --unet-backend torchscript, aoti, and aoti without CUDA graphs;
#   3. PSNR of the aoti seed-1 image against the torchscript one, and the same with a
#      rank-64 LoRA (make_test_loras.py --full) applied: both backends share the weights;
#   4. AOTI_B4_IMAGES (16; 0 skips) images of 1024x1024 at --max-batch 4 with each
#      backend: the sustained rate (model load excluded) and sampling s/image.
# Extra arguments go to the export (e.g. --aoti-size 1024x1024, --aoti-config max_autotune=True).
# Results in $OUT (default bench/tmp): summary.txt, build.log, export.log, run-*.log, *.png.
set -euo pipefail
cd "$(dirname "$0")/.."
SDXL_MODEL_NAME=full-aoti SDXL_EXPORT_DONE_FILE=unet.pt2 SDXL_EXPORT_ARGS="--aoti $*"
source bench/lib/gpu_prepare.sh  # wheels, build, export with --aoti into $WORK/full-aoti (log: export.log)
grep -E "torch.export unet|aoti_compile_and_package|check unet.pt2" "$OUT/export.log" | tee -a "$OUT/summary.txt" || true
[ -f "$WORK/loras/full_a.safetensors" ] || python3 -m reference.make_test_loras --full --out "$WORK/loras" > "$OUT/lora-make.log" 2>&1

cat > "$WORK/aoti-batch.json" <<JSON
{"version": 1,
 "defaults": {"negative": "blurry, lowres", "steps": 28, "cfg": 7.0, "width": 1024, "height": 1024},
 "tasks": [
  {"id": "cold", "prompt": "comic panel, a lighthouse keeper in a storm, bold ink lines", "seed": 0},
  {"id": "warm", "prompt": "comic panel, a lighthouse keeper in a storm, bold ink lines", "seed": 1, "count": 2},
  {"id": "lora", "prompt": "comic panel, a lighthouse keeper in a storm, bold ink lines", "seed": 1,
   "loras": [{"path": "$WORK/loras/full_a.safetensors", "weight": 0.8}]}]}
JSON
for v in "torchscript" "aoti" "aoti --no-cuda-graphs"; do
  tag=$(echo "$v" | tr ' ' '_' | tr -d '-')
  rm -rf "$WORK/run-$tag"
  $SDXL run "$WORK/aoti-batch.json" --model "$WORK/full-aoti" --device cuda --order file --out "$WORK/run-$tag" \
    --unet-backend $v > "$OUT/run-$tag.log" 2>&1 || { tail -30 "$OUT/run-$tag.log"; exit 1; }
  cp "$WORK/run-$tag/warm-0-1.png" "$OUT/$tag-seed1.png"
  cp "$WORK/run-$tag/lora-0-1.png" "$OUT/$tag-lora-seed1.png"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); w=[i for i in r['images'] if i['task']=='warm']; c=[i for i in r['images'] if i['task']=='cold']; e=[d.get(\"engine\", {}) for d in r.get(\"devices\", [])]; print(f'{sys.argv[2]:24s} load {r[\"load_s\"]:.1f} s, cold {c[0][\"total_s\"]:.3f} s, warm s/image {min(i[\"total_s\"] for i in w):.3f} (sample {min(i[\"sample_s\"] for i in w):.3f}), peak {r[\"peak_memory_bytes\"]/2**30:.2f} GiB; graph captures {sum(x.get(\"unet_graph_captures\", 0) for x in e):.0f}, replays {sum(x.get(\"unet_graph_replays\", 0) for x in e):.0f}, aoti calls {sum(x.get(\"unet_aoti_calls\", 0) for x in e):.0f}')" \
    "$WORK/run-$tag/report.json" "$v" | tee -a "$OUT/summary.txt"
done
for s in seed1 lora-seed1; do
  echo "aoti vs torchscript ($s):" | tee -a "$OUT/summary.txt"
  python3 -m reference.compare_images "$OUT/aoti-$s.png" "$OUT/torchscript-$s.png" --min-psnr 0 | tee -a "$OUT/summary.txt"
done
echo "the LoRA's change (torchscript, then aoti): base vs lora" | tee -a "$OUT/summary.txt"
python3 -m reference.compare_images "$OUT/torchscript-seed1.png" "$OUT/torchscript-lora-seed1.png" --min-psnr 0 | tee -a "$OUT/summary.txt"
python3 -m reference.compare_images "$OUT/aoti-seed1.png" "$OUT/aoti-lora-seed1.png" --min-psnr 0 | tee -a "$OUT/summary.txt"
N4=${AOTI_B4_IMAGES:-16}
if (( N4 > 0 )); then
  python3 - "$WORK/aoti-b4.json" "$N4" <<'PY'
import json, sys
tasks = [{"id": f"b4_{i:02d}", "prompt": f"comic panel {i}, a lighthouse keeper in a storm, bold ink lines", "seed": 3000 + i}
         for i in range(int(sys.argv[2]))]
json.dump({"version": 1, "defaults": {"negative": "blurry, lowres", "steps": 28, "cfg": 7.0, "width": 1024, "height": 1024},
           "tasks": tasks}, open(sys.argv[1], "w"), indent=1)
PY
  for v in torchscript aoti; do
    rm -rf "$WORK/b4-$v"
    $SDXL run "$WORK/aoti-b4.json" --model "$WORK/full-aoti" --device cuda --out "$WORK/b4-$v" --max-batch 4 --no-progress \
      --unet-backend $v > "$OUT/b4-$v.log" 2>&1 || { tail -30 "$OUT/b4-$v.log"; continue; }
    cp "$WORK/b4-$v/report.json" "$OUT/report-b4-$v.json"
    python3 - "$WORK/b4-$v/report.json" "$v" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"b4 {sys.argv[2]:12s}: {r['images_done']} images, {r['images_per_hour']:.0f} images/hour = {3600 / r['images_per_hour']:.3f} s/image "
      f"(load {r['load_s']:.1f} s excluded); peak {r['memory']['peak_allocated_bytes'] / 2**30:.2f} GiB; "
      f"engine {[d.get('engine') for d in r.get('devices', [])]}")
PY
    python3 bench/steady_sampling.py "$WORK/b4-$v/report.json" | tee -a "$OUT/summary.txt"
  done
  python3 -m reference.compare_images "$WORK/b4-aoti/b4_00-0-3000.png" "$WORK/b4-torchscript/b4_00-0-3000.png" --min-psnr 0 2>/dev/null | tee -a "$OUT/summary.txt" || true
fi

