#!/usr/bin/env bash
# `sdxl-batch video` timing (docs/video.md): a 60-clip, 3-minute 1080x1920 30 fps video made from
# existing PNGs (cycled), each clip 3.5 s with a zoom or pan, 0.5 s crossfades (60 x 3.5 - 59 x 0.5
# = 180.5 s, 5415 frames), captions burned in, no audio. Prints the wall time and the speed
# against real time (> 1: faster than real time). A second, unchanged run shows the resume cost.
#
#   bench/video_bench.sh PNG_DIR [WORK_DIR] [BINARY]
# PNG_DIR: a folder of PNGs (a run's output folder does: out/example). WORK_DIR (default
# /tmp/video-bench) is emptied first.
set -euo pipefail
src=${1:?usage: video_bench.sh PNG_DIR [WORK_DIR] [BINARY]}
work=${2:-/tmp/video-bench}
bin=${3:-build/default/sdxl-batch}
rm -rf "$work" && mkdir -p "$work/cards" "$work/out"
mapfile -t pngs < <(find "$src" -maxdepth 1 -name '*.png' | sort)
((${#pngs[@]})) || { echo "no PNG in $src" >&2; exit 2; }
# Copies, not links: a link out of the batch file's folder is refused (docs/video.md).
for i in "${!pngs[@]}"; do cp "${pngs[$i]}" "$work/cards/$i.png"; done
python3 - "$work" "${#pngs[@]}" <<'PY'
import json, sys
work, n = sys.argv[1], int(sys.argv[2])
motions = ["zoom-in", "zoom-out", "pan-left", "pan-right", "pan-up", "pan-down"]
clips = [{"image": f"cards/{i % n}.png", "motion": motions[i % 6], "caption": f"Panel {i + 1}"} for i in range(60)]
batch = {"version": 1, "tasks": [{"id": "unused", "prompt": "x"}],
         "video": {"size": "1080x1920", "fps": 30,
                   "default": {"duration": 3.5, "transition": {"kind": "crossfade", "seconds": 0.5}},
                   "clips": clips, "captions": {"size": 54, "burn_in": True}}}
json.dump(batch, open(f"{work}/batch.json", "w"), indent=1)
PY
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(ffmpeg -version | head -1)"
for pass in clean resume; do
  start=$(date +%s.%N)
  "$bin" video "$work/batch.json" --out "$work/out" 2>/dev/null | head -1
  end=$(date +%s.%N)
  python3 -c "w = $end - $start; print(f'$pass: {w:.1f} s wall for 180.5 s of video: {180.5 / w:.2f}x real time')"
done
