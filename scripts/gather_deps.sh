#!/usr/bin/env bash
# Gathers what the GPU machine (no network) lacks, into ignored folders that the
# device tool carries:
#   .deps/include  header-only C++ deps from Debian's packages (fmt, spdlog, CLI11,
#                  nlohmann/json, stb_image_write, stb_image) -> cmake --preset gpu uses them
#   .whl/          Python 3.12 wheels missing there (diffusers, importlib_metadata,
#                  open-clip-torch for its CLIP merges file; nvidia-cudnn-frontend for
#                  bench/lab/2026-12-fp8-unet/cudnn_fp8_probe.py, which drives the cuDNN torch loads;
#                  spandrel and einops for export_sdxl.py --upscaler and bench/upscale_bench.py)
# Run here after scripts/setup.sh; idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .deps && mkdir -p .deps/include/stb
for d in fmt spdlog CLI nlohmann; do cp -rL "/usr/include/$d" .deps/include/; done
cp /usr/include/stb/stb_image_write.h /usr/include/stb/stb_image.h .deps/include/stb/
mkdir -p .whl
for w in diffusers==0.42.1 importlib_metadata==8.7.0 open-clip-torch==3.3.0 nvidia-cudnn-frontend==1.23.0 \
    spandrel==0.4.2 einops==0.8.2; do
  name=${w%%==*}; ver=${w##*==}
  ls .whl | grep -qi "^${name//-/_}-${ver}-" && continue
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl "$w"
done
du -sh .deps .whl
