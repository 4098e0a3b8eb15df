#!/usr/bin/env bash
# A CPU dry run of bench/comfyui/run.sh, end to end, before a GPU call is spent on it (networked
# machine, repository root, after bench/comfyui/gather.sh and a build of build/default/sdxl-batch):
#   bash bench/comfyui/dry_run.sh [FIXTURES]     FIXTURES: build/default/fixtures (tiny-model, tiny-diffusers)
# sdxl-batch runs the tiny model; ComfyUI (--cpu, the diffusion model in bf16 to halve its memory)
# runs a full-size random SDXL single file made here (ComfyUI recognises SDXL by its shapes, so
# the tiny model is no checkpoint for it), with full-size rank-64 kohya LoRAs, a full-size random
# ControlNet and a small RRDBNet (2 blocks, 16 features, growth 32) for both. 128², 1 step, W1 of 1 panel (ComfyUI batch 1),
# a mixed batch of 1 + 1, a finished night of 2. ComfyUI's wheels for this machine's python go to
# /tmp/comfy-site-dry (pip, PyPI). Scratch: DRY_WORK (/tmp/comfy-dry); results: bench/tmp/comfy-dry.
# About 15 minutes and 16 GB of memory on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
FIX=$(realpath "${1:-build/default/fixtures}")
PY=${PY:-.venv/bin/python}
D=${DRY_WORK:-/tmp/comfy-dry}
export WORK=$D/work OUT=${OUT:-$PWD/bench/tmp/comfy-dry}
mkdir -p "$WORK" "$OUT" "$D"
PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")  # absolute, the venv's link kept
export PATH=$(dirname "$PY"):$PATH  # python3 in run.sh is the venv's
[ -d /tmp/comfy-site-dry ] || "$PY" -m pip install -q --no-deps --no-compile --target /tmp/comfy-site-dry \
  av torchsde trampoline aiohttp yarl multidict propcache frozenlist aiosignal aiohappyeyeballs attrs \
  pydantic-settings python-dotenv scipy
ln -sfn /tmp/comfy-site-dry /tmp/comfy-site  # run.sh's ComfyUI path (it installs nothing when DRY)
export PYTHONPATH=$PWD/tests
# A full-size random SDXL (fp16) as diffusers, then as one original-layout file, for ComfyUI.
if [ ! -f "$WORK/single/checkpoint.safetensors" ]; then
  "$PY" - "$D/full-diffusers" <<'PY'
import sys, tempfile
from pathlib import Path
sys.path.insert(0, "scripts")
import torch
torch.set_grad_enabled(False)
from export.sdxl_sources import build_random_pipeline
pipe = build_random_pipeline("random-full", "cpu", torch.float16, 0, Path(tempfile.mkdtemp()))
pipe.save_pretrained(sys.argv[1], safe_serialization=True)
PY
  "$PY" -m reference.single_file_fixture --from-diffusers "$D/full-diffusers" --out "$WORK/single" --dtype fp16
fi
M=$WORK/models58 B=$WORK/comfy-base
mkdir -p "$M/lora" "$M/controlnets" "$M/up" "$B/models/loras"
# LoRAs: full-size kohya for ComfyUI, the tiny model's kohya file under the same names for sdxl-batch.
[ -f "$D/loras/full_b.safetensors" ] || "$PY" -m reference.make_test_loras --full --out "$D/loras"
for f in full_a full_b; do
  ln -sf "$D/loras/$f.safetensors" "$B/models/loras/"
  cp "$FIX/loras/kohya_unet.safetensors" "$M/lora/$f.safetensors"  # a copy: sdxl-batch follows no link out
done
# ControlNet: full-size (diffusers layout) for ComfyUI; the tiny model's, exported, for sdxl-batch.
[ -f "$WORK/cn-src/diffusers/diffusion_pytorch_model.safetensors" ] || "$PY" -m reference.controlnet_fixture \
  --diffusers "$D/full-diffusers" --out "$WORK/cn-src" --seed 3 --std-scale 0.02 --diffusers-only
if [ ! -f "$M/controlnets/pose/model.json" ]; then
  "$PY" -m reference.controlnet_fixture --diffusers "$FIX/tiny-diffusers" --out "$D/cn-tiny" --seed 3 --diffusers-only
  "$PY" scripts/export_sdxl.py --controlnet "$D/cn-tiny/diffusers" --dtype fp32 --check none --out "$M/controlnets/pose" \
    --force
fi
# A small RRDBNet in Real-ESRGAN's layout for both (ComfyUI's .pth; sdxl-batch's export).
if [ ! -f "$M/up/rrdbnet_x4/model.json" ]; then
  "$PY" -c "import sys, torch; from reference.upscaler_fixtures import realesrgan
torch.save({'params_ema': realesrgan(16, 32, 2, 3, torch.Generator().manual_seed(1))}, sys.argv[1])" "$WORK/rrdbnet_x4.pth"
  "$PY" scripts/export_sdxl.py --upscaler "$WORK/rrdbnet_x4.pth" --out "$M/up" --force
fi
rm -f "$WORK"/stage58-*.done
SIZE=128 STEPS=1 LORAS=$M/lora DRY=1 SDXL=$PWD/build/default/sdxl-batch MODEL=$FIX/tiny-model W1_PANELS=1 BEST_BATCH=1 MIXED=1 FINISH=2 \
  COMFY_DEVICE_FLAGS="--cpu --bf16-unet" COMFY_FAST_FLAGS="--fast" DEADLINE_S=3000 RUN_TIMEOUT=900 bash bench/comfyui/run.sh
