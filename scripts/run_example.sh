#!/usr/bin/env bash
# The example (README's first command): set up, build, export the tiny model
# (random weights, seconds on the CPU) with a tiny random IP-Adapter and ControlNet for its
# dialogue panel (regions, a pose map, the characters' reference pictures), and generate
# configs/example-batch.json into out/example, then its 20-second video (out/example/video.mp4, docs/video.md). Images of a tiny random model look like coloured noise; the
# same command with a real model (scripts/export_sdxl.py --from DIR) makes art.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset default >/dev/null
cmake --build --preset default --target sdxl-batch
if [ ! -f models/tiny/model.json ] || [ ! -f models/tiny-diffusers/unet/config.json ]; then
  .venv/bin/python scripts/export_sdxl.py --tiny --out models/tiny --save-diffusers models/tiny-diffusers --force
fi
[ -f models/tiny-ip-adapter/model.json ] ||
  .venv/bin/python scripts/export_sdxl.py --tiny-ip-adapter models/tiny-diffusers --seed 31 --out models/tiny-ip-adapter
[ -f models/tiny-controlnet/model.json ] ||
  .venv/bin/python scripts/export_sdxl.py --tiny-controlnet models/tiny-diffusers --seed 21 --out models/tiny-controlnet
build/default/sdxl-batch run configs/example-batch.json --model models/tiny --out out/example "$@"
build/default/sdxl-batch video configs/example-batch.json --out out/example
echo "images, report.json and video.mp4 are in out/example"
