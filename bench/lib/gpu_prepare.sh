#!/usr/bin/env bash
# Sourced by the GPU scripts (bench/gpu_*.sh, bench/bench_speed.sh,
# bench/runtime/*.sh) from the repository root on the GPU machine: installs the
# carried wheels (.whl), puts tests/ on PYTHONPATH (python3 -m reference.X: the
# test LoRAs, image comparisons, the diffusers loop), builds sdxl-batch against
# python3's libtorch (cmake --preset gpu) while exporting the full-size SDXL
# architecture with random weights (fp16, traced on cuda) to $WORK/full (and
# its diffusers copy to $WORK/full-diffusers when SDXL_SAVE_DIFFUSERS=1;
# SDXL_EXPORT_CHECK=quick|full compares the traces with eager, default none).
# SDXL_PREPARE_KEEP_GOING=1: a failed build sets SDXL_BUILD_FAILED=1 instead of exiting.
# SDXL_EXPORT_SOURCE (--random-full) may name --tiny instead.
# SDXL_MODEL_NAME (full) names the export folder under $WORK; SDXL_EXPORT_ARGS
# adds export arguments (e.g. --aoti), and then the export is redone unless
# SDXL_EXPORT_DONE_FILE (model.json) is already there.
# Logs: $OUT/build.log, $OUT/export.log; times appended to $OUT/summary.txt.
set -euo pipefail
OUT=${OUT:-$PWD/bench/tmp}
WORK=${WORK:-/tmp/sdxl-gpu}
mkdir -p "$OUT" "$WORK"
# SDXL_WHEELS_INSTALLED=1: the caller installed them (and has a process using /tmp/site already).
if [ -z "${SDXL_WHEELS_INSTALLED:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"
# A compiler with only a static libstdc++ (the GPU machine's /opt/gcc g++ 13) would
# give sdxl-batch its own copy next to libtorch's shared libstdc++.so.6, and an
# AOTInductor package's .so a third one, which crashes at load
# (scripts/export/aoti_toolchain.py). Link the shared one, the one torch loads.
LINK_ARGS=()
if [[ "$(${CXX:-g++} -print-file-name=libstdc++.so)" != /* ]]; then
  libstdcxx=$(cd scripts && python3 -c "import torch; from export.aoti_toolchain import loaded_libstdcxx; print(loaded_libstdcxx() or '')")
  if [ -n "$libstdcxx" ]; then
    mkdir -p /tmp/sdxl-libstdcxx && ln -sf "$libstdcxx" /tmp/sdxl-libstdcxx/libstdc++.so
    LINK_ARGS=(-DCMAKE_EXE_LINKER_FLAGS=-L/tmp/sdxl-libstdcxx -DCMAKE_SHARED_LINKER_FLAGS=-L/tmp/sdxl-libstdcxx)
    echo "${CXX:-g++} has no shared libstdc++: linking sdxl-batch against $libstdcxx" | tee -a "$OUT/summary.txt"
  fi
fi
( cmake --preset gpu -DCMAKE_CXX_COMPILER_LAUNCHER= "${LINK_ARGS[@]}" && cmake --build --preset gpu -j "$(nproc)" ) > "$OUT/build.log" 2>&1 &
build_pid=$!
t0=$(date +%s)
MODEL_NAME=${SDXL_MODEL_NAME:-full}
if [ ! -f "$WORK/$MODEL_NAME/${SDXL_EXPORT_DONE_FILE:-model.json}" ]; then
  python3 scripts/export_sdxl.py ${SDXL_EXPORT_SOURCE:---random-full} --dtype fp16 --device cuda --out "$WORK/$MODEL_NAME" ${SDXL_EXPORT_ARGS:-} \
    ${SDXL_SAVE_DIFFUSERS:+--save-diffusers "$WORK/full-diffusers"} --check "${SDXL_EXPORT_CHECK:-none}" --force \
    --json-report "$WORK/export-checks.json" > "$OUT/export.log" 2>&1
fi
echo "export: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
SDXL_BUILD_FAILED=
if ! wait $build_pid; then
  tail -30 "$OUT/build.log"
  # SDXL_PREPARE_KEEP_GOING=1: the caller measures what it can without the binary.
  [ -n "${SDXL_PREPARE_KEEP_GOING:-}" ] || exit 1
  SDXL_BUILD_FAILED=1
  echo "build failed (see build.log); going on without sdxl-batch" | tee -a "$OUT/summary.txt"
fi
echo "build+export wall: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
SDXL=$PWD/build/gpu/sdxl-batch
[ -n "$SDXL_BUILD_FAILED" ] || echo "sdxl-batch links: $(ldd "$SDXL" | grep -o 'libstdc++[^ ]* => [^ ]*' || echo 'no shared libstdc++')" | tee -a "$OUT/summary.txt"
MODEL=$WORK/$MODEL_NAME
