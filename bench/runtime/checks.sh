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
# embeddings: random SDXL embeddings (clip_l 768, clip_g 1280) with --embedding-dir on the
#        full-size fp16 model: the same seed with and without the name in the prompt,
#        twice each (deterministic? changed by the embedding?).
# vae-fp16: 8 images at 1024² (--max-batch 4) decoded in fp32 (--vae-dtype fp32) and with
#        the default (auto: fp16 on a GPU, fp32 again for an image that overflows):
#        decode seconds, images/hour, PSNR between the two, fp32 re-decodes.
# vae-aoti: the full model exported with vae_decoder.pt2 only (--aoti --aoti-variants vae
#        --aoti-size 1024x1024; UNet on TorchScript + CUDA graphs); 16 images at 1024²
#        (--max-batch 8) decoded by vae_decoder.ts and by vae_decoder.pt2 (--vae-backend),
#        alternating, twice: decode seconds, images/hour, PSNR between them; the export's check.
# Results: $OUT/summary.txt (+ build/export logs and the reports as JSON).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-}
case "$MODE" in check|order|story|embeddings|vae-fp16|vae-aoti) ;; *) echo "usage: [OUT=DIR] bash bench/runtime/checks.sh check|order|story|embeddings|vae-fp16|vae-aoti" >&2; exit 2 ;; esac
[ "$MODE" = vae-aoti ] && export SDXL_MODEL_NAME=full-vae-aoti \
  SDXL_EXPORT_ARGS="--aoti --aoti-variants vae --aoti-size 1024x1024 --aoti-config aot_inductor.compile_wrapper_opt_level=O0"
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
elif [ "$MODE" = embeddings ]; then
  emb=$WORK/embeddings
  python3 - "$emb" <<'PY'
import sys, torch
from pathlib import Path
from safetensors.torch import save_file
d = Path(sys.argv[1]); d.mkdir(parents=True, exist_ok=True)
g = torch.Generator().manual_seed(3)
for name, n in (("inkstyle", 3), ("badhands", 2)):
    save_file({"clip_l": torch.randn(n, 768, generator=g) * 0.02, "clip_g": torch.randn(n, 1280, generator=g) * 0.02},
              str(d / f"{name}.safetensors"))
PY
  gen() {  # NAME PROMPT NEGATIVE
    "$SDXL" --log-level info generate --model "$MODEL" --device cuda --embedding-dir "$emb" --prompt "$2" \
      --negative "$3" --seed 11 --steps 20 --out "$WORK/$1.png" > "$WORK/$1.log" 2>&1 || echo "$1: exit $?" >> "$OUT/summary.txt"
    grep -h "embedding '\|loaded model" "$WORK/$1.log" | sed "s/^/$1: /" | tee -a "$OUT/summary.txt"
  }
  gen with-a "comic panel, a lighthouse, inkstyle" "blurry, badhands"
  gen with-b "comic panel, a lighthouse, inkstyle" "blurry, badhands"
  gen without "comic panel, a lighthouse," "blurry,"
  python3 - "$WORK" <<'PY' | tee -a "$OUT/summary.txt"
import sys, hashlib, math
from pathlib import Path
import numpy as np
from PIL import Image
w = Path(sys.argv[1])
h = {n: hashlib.sha256((w / f"{n}.png").read_bytes()).hexdigest() for n in ("with-a", "with-b", "without")}
a = np.asarray(Image.open(w / "with-a.png")).astype(np.float64); b = np.asarray(Image.open(w / "without.png")).astype(np.float64)
mse = ((a - b) ** 2).mean()
print(f"embeddings: with (twice) identical: {h['with-a'] == h['with-b']}; with vs without: PSNR {10 * math.log10(255**2 / mse):.1f} dB")
PY
elif [ "$MODE" = vae-fp16 ]; then
  mkbatch "$WORK/eight.json" 8 0
  run vae-fp32 "$WORK/eight.json" --max-batch 4 --vae-dtype fp32
  run vae-auto "$WORK/eight.json" --max-batch 4
  run vae-fp32-2 "$WORK/eight.json" --max-batch 4 --vae-dtype fp32
  run vae-auto-2 "$WORK/eight.json" --max-batch 4
  compare vae-fp32 vae-auto
  compare vae-auto vae-auto-2
  python3 - "$WORK" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
from pathlib import Path
w = Path(sys.argv[1])
for name in ("vae-fp32", "vae-auto", "vae-fp32-2", "vae-auto-2"):
    r = json.loads((w / name / "report.json").read_text()); d = r["devices"][0]
    redo = (w / f"{name}.log").read_text().count("decoding it again in fp32")
    print(f"{name}: {r['images_per_hour']:.0f} images/h, decode stage {d['decode_s']:.2f} s for {r['images_done']} images "
          f"({d['decode_s'] / max(r['images_done'], 1):.3f} s/image), fp32 re-decodes {redo}")
PY
elif [ "$MODE" = vae-aoti ]; then
  grep -h "vae_decoder" "$OUT/export.log" | tee -a "$OUT/summary.txt" || true
  mkbatch "$WORK/sixteen.json" 16 0
  for k in 1 2; do
    run "vae-ts-$k" "$WORK/sixteen.json" --max-batch 8 --vae-backend torchscript
    run "vae-aoti-$k" "$WORK/sixteen.json" --max-batch 8 --vae-backend aoti
  done
  compare vae-ts-1 vae-aoti-1
  compare vae-aoti-1 vae-aoti-2
  python3 - "$WORK" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
from pathlib import Path
w = Path(sys.argv[1])
for name in ("vae-ts-1", "vae-aoti-1", "vae-ts-2", "vae-aoti-2"):
    r = json.loads((w / name / "report.json").read_text()); d = r["devices"][0]
    n = max(r["images_done"], 1)
    print(f"{name}: {r['images_per_hour']:.0f} images/h, decode stage {d['decode_s']:.2f} s for {n} images "
          f"({d['decode_s'] / n:.3f} s/image), sampling {d.get('sample_s', 0) / n:.3f} s/image, "
          f"vae_aoti_decodes {d.get('engine', {}).get('vae_aoti_decodes', 0):.0f}")
PY
  sample_steady
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
