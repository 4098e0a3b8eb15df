#!/usr/bin/env bash
# Installs what sdxl-batch needs on Debian 12, idempotently:
#  - Debian packages (only the missing ones): compiler, CMake, Ninja, ccache and the
#    C++ libraries CLI11, nlohmann/json, spdlog + fmt, stb, GoogleTest, zlib; ffmpeg,
#    fontconfig and the Noto CJK fonts for `sdxl-batch video`;
#  - the Python venv .venv with torch==2.11.0 (libtorch for the C++ build) and the
#    export/reference packages of requirements.txt (only if missing or out of date).
# The CUDA toolkit (nvcc, 13.0) must already be installed: the torch wheel's CMake
# config needs it even for CPU-only use; nothing CUDA is compiled.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake ninja-build ccache pkg-config python3 python3-venv
      libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libstb-dev libgtest-dev zlib1g-dev
      clang libclang-rt-dev
      libgl1 libglib2.0-0  # opencv-python (an ultralytics dependency) loads libGL and GLib at import
      ffmpeg fontconfig fonts-noto-cjk  # `sdxl-batch video`: the ffmpeg program (libx264, libass), CJK captions
      slurmd slurmctld slurm-client munge)  # e2e_slurm: a one-node Slurm cluster started by the test
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: warning: no CUDA toolkit found (nvcc). The torch wheel's CMake config needs it;" >&2
  echo "       install CUDA 13.0 from NVIDIA's packages before building." >&2
fi

py=${SDXL_SETUP_PYTHON:-python3}
want=$(cat requirements.txt | sha256sum | cut -d' ' -f1)
stamp=.venv/.requirements.sha256
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: creating .venv with requirements.txt (torch 2.11.0 and friends, ~5 GB, a few minutes)"
  [ -x .venv/bin/python ] || "$py" -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
  echo "$want" > "$stamp"
fi
echo "setup: ok ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
