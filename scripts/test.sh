#!/usr/bin/env bash
# The test command (README): set up, build, make the fixtures (tiny model and
# goldens, with the project's scripts) and run every test that needs no GPU.
# Extra arguments go to ctest, e.g. scripts/test.sh -L unit
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
preset=default
[ "${CI:-}" = "true" ] && preset=ci   # CI: warnings are errors
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
ctest --preset "$preset" -j2 --timeout 1500 "$@"
