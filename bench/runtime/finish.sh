#!/usr/bin/env bash
# The last mile of a panel, on the GPU machine (repository root):
#   OUT=DIR bash bench/runtime/finish.sh inpaint     (or bench/gpu_runtime.sh inpaint)
# inpaint: the cost of inpainting on the full-size random SDXL (fp16, 1024², 28 steps, CFG 7,
#        strength 0.75, --max-batch 4): 8 panels as plain img2img, the same 8 with a mask each
#        (the whole picture, mask_blur 4) and "only masked" (inpaint_area masked, padding 32):
#        s/image, sampling and decode seconds, peak memory; and, for only-masked, whether every
#        pixel outside the padded crop equals the init image's.
# upscale: a full-size 4x RRDBNet (23 blocks, 64 features, random weights, Real-ESRGAN's layout) exported
#        with export_sdxl.py --upscaler, then 8 panels of 1024² to 2048² (the model's 4x pass, LANCZOS
#        down): `sdxl-batch upscale` (s/image from its report, process wall, GPU memory used at most,
#        sampled by nvidia-smi) against spandrel + ComfyUI's tile-by-tile loop (bench/upscale_bench.py)
#        in fp32 (ComfyUI's default) and fp16; the frames of ours vs the loop's (PSNR).
# frames: the comic short's frames end to end: 16 panels of 768x1344 (28 steps, CFG 7, --max-batch 8), each
#        written as a 1080x1920 frame by the full-size 4x RRDBNet (per-task "upscale": model pass, LANCZOS,
#        "fit": "crop"), against the same panels without the upscale: images/hour after load, GPU busy
#        fraction, peak memory (the upscale's share of the run).
# detect: `sdxl-batch detect` with an ADetailer-size detector (DETECTOR, default .deps/det/face640: made
#        here by bench/tools/make_detector.py + export_sdxl.py --detector, carried) on 48 panels of 1024²
#        and on 1 of them, on cuda and on the CPU: s/image from the difference (the load cancels out).
# detailer: the detailer's cost on the full-size random SDXL (1024², 28 steps, CFG 7, --max-batch 8): 50 panels
#        without and with a per-task "detailer" (DETECTOR as in detect; "max" 1, 2, 3 in turn: 1-3 regions a
#        panel at confidence 0.01, ADetailer's other defaults: denoise 0.4, padding 32, only masked): the report's regions and
#        detailer batches (UNet batches shared across panels), and the run's extra seconds per region and
#        per panel (run_s of the report, after load, the same panels in both runs).
# regions: regional prompts (attention couple) on the full-size random SDXL (1024², 28 steps, CFG 7,
#        --max-batch 8, unet.ts: regions run on its forward_regional methods): PANELS (64) panels without
#        regions, the same with 2 box regions each, and with 3; s/image (warm) and peak memory of each, and
#        the ratio to the plain panels (goal: at most 1.15x); then 16 panels with 0, 2 and 3 regions in turn
#        sharing UNet calls (the report's regions.panels and regions.batches).
# Results: $OUT/summary.txt (+ the logs and reports).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-}
case "$MODE" in inpaint | upscale | frames | detect | detailer | regions) ;;
  *) echo "usage: [OUT=DIR] bash bench/runtime/finish.sh inpaint|upscale|frames|detect|detailer|regions" >&2; exit 2 ;; esac
source bench/lib/gpu_prepare.sh  # build + export; sets OUT WORK SDXL MODEL
source bench/lib/runtime.sh

if [ "$MODE" = frames ]; then
  python3 bench/upscale_bench.py --make-rrdbnet "$WORK/rrdbnet_x4.pth"
  python3 scripts/export_sdxl.py --upscaler "$WORK/rrdbnet_x4.pth" --out "$WORK/up" --force > "$OUT/export-up.log" 2>&1
  python3 - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
scenes = ["the keeper climbs the lighthouse stairs", "a storm over the harbour", "two kids on the pier at dawn",
          "the lamp room, close-up on the keeper's hands"]
tasks = [{"id": f"s{i:02d}", "prompt": f"comic panel {i}, {scenes[i % 4]}, bold ink lines", "seed": 700 + i}
         for i in range(16)]
base = {"version": 1, "defaults": {"steps": 28, "cfg": 7.0, "width": 768, "height": 1344}}
json.dump(dict(base, tasks=tasks), open(f"{w}/story-panels.json", "w"), indent=1)
frames = dict(base, defaults=dict(base["defaults"], upscale={"model": f"{w}/up/rrdbnet_x4", "size": "1080x1920",
                                                                "fit": "crop"}))
json.dump(dict(frames, tasks=tasks), open(f"{w}/story-frames.json", "w"), indent=1)
PY
  run story-panels "$WORK/story-panels.json" --max-batch 8
  run story-frames "$WORK/story-frames.json" --max-batch 8
  python3 - "$WORK" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
from pathlib import Path
from PIL import Image
w = Path(sys.argv[1])
for name in ("story-panels", "story-frames"):
    r = json.loads((w / name / "report.json").read_text())
    sizes = {Image.open(w / name / json.loads(l)["file"]).size for l in (w / name / "manifest.jsonl").read_text().splitlines()}
    print(f"{name}: {r['images_done']} images of {sorted(sizes)}, {r['images_per_hour']:.0f} images/hour after load, "
          f"peak allocated {r['memory']['peak_allocated_bytes'] / 2**30:.2f} GiB")
PY
  log_warnings
  exit 0
fi

if [ "$MODE" = upscale ]; then
  t0=$(date +%s)
  python3 bench/upscale_bench.py --make-rrdbnet "$WORK/rrdbnet_x4.pth"
  python3 bench/upscale_bench.py --make-panels "$WORK/panels" 8 1024
  python3 scripts/export_sdxl.py --upscaler "$WORK/rrdbnet_x4.pth" --out "$WORK/up" --force > "$OUT/export-up.log" 2>&1
  echo "upscale: RRDBNet made and exported in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/export-up.log")" | tee -a "$OUT/summary.txt"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$WORK/up-mem.txt" 2>/dev/null & mpid=$!
  t0=$(date +%s.%N)
  "$SDXL" upscale --upscale-model "$WORK/up/rrdbnet_x4" --upscale 2 --device cuda --out "$WORK/up-ours" "$WORK/panels" \
    > "$OUT/up-ours.log" 2>&1 || echo "upscale: exit $?" | tee -a "$OUT/summary.txt"
  wall=$(python3 -c "import time,sys; print(f'{time.time()-float(sys.argv[1]):.1f}')" "$t0")
  kill $mpid 2>/dev/null || true
  cp "$WORK/up-ours/report.json" "$OUT/report-up-ours.json" 2>/dev/null || true
  python3 - "$WORK" "$wall" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
w, wall = sys.argv[1], sys.argv[2]
r = json.load(open(f"{w}/up-ours/report.json"))
mem = [float(x) for x in open(f"{w}/up-mem.txt").read().split() if x.strip().isdigit()]
print(f"sdxl-batch upscale: {r['written']} frames, {r['seconds'] / max(1, r['written']):.3f} s/image (after load, "
      f"read + model + LANCZOS + PNG), process {wall} s, GPU memory used at most {max(mem, default=0) / 1024:.1f} GiB")
PY
  for dt in fp32 fp16; do
    python3 bench/upscale_bench.py --model "$WORK/rrdbnet_x4.pth" --images "$WORK/panels" --scale 2 --dtype $dt \
      --out "$WORK/up-loop-$dt" --json "$OUT/up-loop-$dt.json" 2>&1 | tail -1 | sed "s/^/loop $dt: /" | tee -a "$OUT/summary.txt"
  done
  python3 - "$WORK" <<'PY' | tee -a "$OUT/summary.txt"
import sys
from pathlib import Path
import numpy as np
from PIL import Image
w = Path(sys.argv[1])
for dt in ("fp32", "fp16"):
    ps = []
    for f in sorted((w / "up-ours").glob("*.png")):
        a = np.asarray(Image.open(f).convert("RGB"), np.float64); b = np.asarray(Image.open(w / f"up-loop-{dt}" / f.name).convert("RGB"), np.float64)
        ps.append(10 * np.log10(255 ** 2 / max(((a - b) ** 2).mean(), 1e-12)))
    print(f"frames: ours vs the loop in {dt}: PSNR {min(ps):.1f}..{max(ps):.1f} dB over {len(ps)}")
PY
  exit 0
fi

if [ "$MODE" = regions ]; then
  python3 - "$WORK" "${PANELS:-64}" <<'PY'
import json, sys
w, n = sys.argv[1], int(sys.argv[2])
base = {"version": 1, "defaults": {"steps": 28, "cfg": 7.0, "width": 1024, "height": 1024,
                                   "negative": "blurry, lowres"}}
tasks = [{"id": f"p{i:02d}", "prompt": f"comic panel {i}, two people talking on a pier, bold ink lines", "seed": 700 + i}
         for i in range(n)]
two = [{"box": [0, 0, 0.5, 1], "prompt": "a girl with a red scarf, waving", "negative": "hat"},
       {"box": [0.5, 0, 1, 1], "prompt": "an old lighthouse keeper, grey beard"}]
three = [{"box": [0, 0, 0.4, 1], "prompt": "a girl with a red scarf, waving"},
         {"box": [0.3, 0, 0.7, 1], "prompt": "a small orange fox", "weight": 1.5},
         {"box": [0.6, 0, 1, 1], "prompt": "an old lighthouse keeper, grey beard"}]
for name, regions in (("plain", None), ("two", two), ("three", three)):
    ts = [dict(t, regions=regions) if regions else t for t in tasks]
    json.dump(dict(base, tasks=ts), open(f"{w}/regions-{name}.json", "w"), indent=1)
mixed = [dict(t, regions=[None, two, three][i % 3]) if i % 3 else t for i, t in enumerate(tasks[:16])]
json.dump(dict(base, tasks=mixed), open(f"{w}/regions-mixed.json", "w"), indent=1)
PY
  for name in plain two three mixed; do
    run "regions-$name" "$WORK/regions-$name.json" --max-batch 8 --unet-backend torchscript
  done
  python3 - "$WORK" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
from pathlib import Path
w = Path(sys.argv[1])
def warm(r):
    b = r["batches"][1:] or r["batches"]
    return sum(x["seconds"] for x in b) / max(1, sum(x["size"] for x in b))
rep = {n: json.loads((w / f"regions-{n}" / "report.json").read_text()) for n in ("plain", "two", "three", "mixed")}
p = warm(rep["plain"])
for n in ("plain", "two", "three"):
    r = rep[n]
    print(f"regions {n}: {r['images_done']} panels, warm {warm(r):.3f} s/image ({warm(r) / p:.3f}x plain), "
          f"peak allocated {r['memory']['peak_allocated_bytes'] / 2**30:.2f} GiB, regions {r.get('regions')}")
m = rep["mixed"]
print(f"regions mixed (0, 2, 3 regions in turn): {m['images_done']} panels in {len(m['batches'])} batches "
      f"(sizes {[b['size'] for b in m['batches']]}), report regions {m.get('regions')}")
PY
  log_warnings
  exit 0
fi

if [ "$MODE" = detailer ]; then
  det=$(realpath "${DETECTOR:-.deps/det/face640}")
  python3 - "$WORK" "$det" <<'PY'
import json, sys
w, det = sys.argv[1], sys.argv[2]
scenes = ["the keeper's face at the window", "two kids laughing on the pier", "a fisherman's weathered face",
          "the keeper and the girl, close-up"]
tasks = [{"id": f"p{i:02d}", "prompt": f"comic panel {i}, {scenes[i % 4]}, bold ink lines", "seed": 900 + i}
         for i in range(50)]
base = {"version": 1, "defaults": {"steps": 28, "cfg": 7.0, "width": 1024, "height": 1024}}
json.dump(dict(base, tasks=tasks), open(f"{w}/det-plain.json", "w"), indent=1)
# confidence 0.01: the detector's random weights must find regions in random-weight panels; "max" then
# fixes the count (1-3 a panel, 100 in all), and a region's cost does not depend on its box (it is
# inpainted at the task's size).
detailed = [dict(t, detailer=[{"detector": det, "prompt": "[PROMPT], detailed face", "confidence": 0.01,
                               "max": 1 + i % 3}])
            for i, t in enumerate(tasks)]
json.dump(dict(base, tasks=detailed), open(f"{w}/det-detailed.json", "w"), indent=1)
PY
  run det-plain "$WORK/det-plain.json" --max-batch 8
  run det-detailed "$WORK/det-detailed.json" --max-batch 8
  python3 - "$WORK" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
from pathlib import Path
w = Path(sys.argv[1])
plain, det = (json.loads((w / n / "report.json").read_text()) for n in ("det-plain", "det-detailed"))
d = det.get("detailer", {})
regions, batches = d.get("regions", 0), d.get("batches", 0)
extra = det["run_s"] - plain["run_s"]
per_panel = {}
for im in det.get("images", []):
    per_panel[len(im.get("detailer", []))] = per_panel.get(len(im.get("detailer", [])), 0) + 1
print(f"detailer: {det['images_done']} panels, {regions} regions in {batches} detailer batches "
      f"(panels by regions: {dict(sorted(per_panel.items()))}); run {plain['run_s']:.1f} s without, "
      f"{det['run_s']:.1f} s with -> +{extra:.1f} s: {extra / max(1, regions):.3f} s per region, "
      f"{extra / max(1, det['images_done']):.3f} s per panel; peak allocated "
      f"{plain['memory']['peak_allocated_bytes'] / 2**30:.2f} / {det['memory']['peak_allocated_bytes'] / 2**30:.2f} GiB")
PY
  log_warnings
  exit 0
fi

if [ "$MODE" = detect ]; then
  det=${DETECTOR:-.deps/det/face640}
  python3 bench/upscale_bench.py --make-panels "$WORK/det-panels" 48 1024
  for dev in cuda cpu; do
    for n in 1 48; do
      files=$(ls "$WORK"/det-panels/*.png | head -n $n)
      t0=$(date +%s.%N)
      # shellcheck disable=SC2086
      "$SDXL" detect --detector "$det" --device $dev $files > "$OUT/detect-$dev-$n.jsonl" 2> "$OUT/detect-$dev-$n.log"
      python3 -c "import time,sys; print(f'{time.time()-float(sys.argv[1]):.3f}')" "$t0" > "$WORK/detect-$dev-$n.s"
    done
    python3 - "$WORK" "$OUT" "$dev" <<'PY' | tee -a "$OUT/summary.txt"
import sys
from pathlib import Path
w, out, dev = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
t1, t48 = (float((w / f"detect-{dev}-{n}.s").read_text()) for n in (1, 48))
boxes = sum(1 for _ in open(out / f"detect-{dev}-48.jsonl"))
print(f"detect on {dev}: 1 image {t1:.2f} s, 48 images {t48:.2f} s (process walls) -> {(t48 - t1) / 47 * 1000:.1f} ms/image "
      f"after load; {boxes} boxes in the 48")
PY
  done
  cmp -s "$OUT/detect-cuda-48.jsonl" "$OUT/detect-cpu-48.jsonl" && echo "detect: cuda and cpu print the same lines" | tee -a "$OUT/summary.txt" \
    || echo "detect: cuda and cpu lines differ (see the .jsonl files)" | tee -a "$OUT/summary.txt"
  exit 0
fi

python3 - "$WORK" <<'PY'
import json, sys
from pathlib import Path
import numpy as np
from PIL import Image, ImageDraw
w = Path(sys.argv[1]); (w / "inits").mkdir(exist_ok=True); (w / "masks").mkdir(exist_ok=True)
rng = np.random.default_rng(6)
boxes = {}
for i in range(8):  # a panel-like init (gradient + blocks) and an ellipse mask over a fifth of it
    px = np.zeros((1024, 1024, 3), np.uint8)
    px[:] = np.linspace(40, 220, 1024, dtype=np.uint8)[:, None, None]
    for _ in range(6):
        x, y = rng.integers(0, 900, 2); px[y:y + 120, x:x + 120] = rng.integers(0, 256, 3)
    Image.fromarray(px, "RGB").save(w / "inits" / f"i{i}.png")
    m = Image.new("L", (1024, 1024)); x, y = (int(v) for v in rng.integers(150, 600, 2))
    ImageDraw.Draw(m).ellipse((x, y, x + 300, y + 380), fill=255)
    m.save(w / "masks" / f"m{i}.png")
tasks = [{"id": f"p{i}", "prompt": f"comic panel {i}, the keeper's face, bold ink lines", "seed": 400 + i,
          "init_image": f"inits/i{i}.png", "strength": 0.75} for i in range(8)]
base = {"version": 1, "defaults": {"steps": 28, "cfg": 7.0, "width": 1024, "height": 1024}}
json.dump(dict(base, tasks=tasks), open(w / "img2img.json", "w"), indent=1)
whole = [dict(t, mask=f"masks/m{i}.png", mask_blur=4) for i, t in enumerate(tasks)]
json.dump(dict(base, tasks=whole), open(w / "inpaint-whole.json", "w"), indent=1)
masked = [dict(t, inpaint_area="masked", inpaint_padding=32) for t in whole]
json.dump(dict(base, tasks=masked), open(w / "inpaint-masked.json", "w"), indent=1)
PY
run img2img "$WORK/img2img.json" --max-batch 4
run inpaint-whole "$WORK/inpaint-whole.json" --max-batch 4
run inpaint-masked "$WORK/inpaint-masked.json" --max-batch 4
python3 - "$WORK" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
from pathlib import Path
import numpy as np
from PIL import Image
w = Path(sys.argv[1])
base = None
for name in ("img2img", "inpaint-whole", "inpaint-masked"):
    r = json.loads((w / name / "report.json").read_text()); d = r["devices"][0]; n = max(1, r["images_done"])
    s = 3600 / r["images_per_hour"] if r["images_per_hour"] else float("nan")
    base = base or s
    print(f"{name}: {r['images_done']} images, {s:.3f} s/image after load ({s / base:.3f}x img2img), "
          f"sample {d['sample_s'] / n:.3f} s/image, decode {d['decode_s'] / n:.3f} s/image, "
          f"peak allocated {r['memory']['peak_allocated_bytes'] / 2**30:.2f} GiB")
# only-masked: outside the padded crop (diffusers' own get_crop_region of the mask) the init's pixels, exactly
from diffusers.image_processor import VaeImageProcessor
worst = 0
for l in map(json.loads, (w / "inpaint-masked" / "manifest.jsonl").read_text().splitlines()):
    i = int(l["task"][1:])
    out = np.asarray(Image.open(w / "inpaint-masked" / l["file"]).convert("RGB")).astype(int)
    init = np.asarray(Image.open(w / "inits" / f"i{i}.png").convert("RGB")).astype(int)
    x0, y0, x1, y1 = VaeImageProcessor.get_crop_region(Image.open(w / "masks" / f"m{i}.png"), 1024, 1024, pad=32)
    keep = np.ones(out.shape[:2], bool); keep[y0:y1, x0:x1] = False
    worst = max(worst, int(np.abs(out - init)[keep].max(initial=0)))
print(f"inpaint-masked: largest difference from the init image outside the padded crop: {worst} levels (0 = exact)")
PY
log_warnings
