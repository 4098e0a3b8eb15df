#!/usr/bin/env bash
# What --verify-model costs: the sha256 of every model file, read once.
# Copies a model folder, adds a file of SIZE_GIB GiB of random bytes listed in
# model.json with its sha256 (standing in for the fp16 SDXL export's ~7 GB),
# and times `run --dry-run --verify-model` on it (the dry run loads no weights).
#   bench/verify_model.sh MODEL_DIR [SIZE_GIB]      (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1
size_gib=${2:-2}
bin=${SDXL_BATCH:-build/default/sdxl-batch}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$model" "$work/model"
head -c $((size_gib << 30)) /dev/urandom > "$work/model/weights.bin"
.venv/bin/python - "$work/model" <<'PY'
import hashlib, json, sys, time
from pathlib import Path
d = Path(sys.argv[1])
t0 = time.time()
h = hashlib.sha256()
with open(d / "weights.bin", "rb") as f:
    for block in iter(lambda: f.read(1 << 24), b""):
        h.update(block)
dt = time.time() - t0
meta = json.loads((d / "model.json").read_text())
meta["files"]["weights.bin"] = {"bytes": (d / "weights.bin").stat().st_size, "sha256": h.hexdigest()}
(d / "model.json").write_text(json.dumps(meta, indent=1))
size = (d / "weights.bin").stat().st_size
print(f"python hashlib (export side): {size / 2**30:.2f} GiB in {dt:.2f} s = {size / dt / 2**20:.0f} MiB/s")
PY
echo '{"version": 1, "tasks": [{"id": "a", "prompt": "x", "seed": 1}]}' > "$work/b.json"
sync
start=$(date +%s.%N)
"$bin" run "$work/b.json" --model "$work/model" --out "$work/out" --dry-run --verify-model 2>&1 | grep -- "--verify-model"
end=$(date +%s.%N)
python3 -c "import sys; s=float(sys.argv[2])-float(sys.argv[1]); g=$size_gib; print(f'sdxl-batch --verify-model: {s:.2f} s wall for {g} GiB + the model = {g*1024/s:.0f} MiB/s')" "$start" "$end"
nproc; lscpu | grep "Model name" || true
