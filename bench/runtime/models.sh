#!/usr/bin/env bash
# Bringing a model in, on the GPU machine (repository root):
#   OUT=DIR bash bench/runtime/models.sh single-file     (or bench/gpu_runtime.sh single-file)
# single-file: the full-size random SDXL (fp16, exported with its diffusers copy) is
#        written as one original-layout .safetensors file (reference.single_file_fixture
#        --from-diffusers), exported again with export_sdxl.py --from FILE --device cuda
#        (--check none; wall time, host max RSS, GPU peak: the export's last lines), its tensors compared
#        with the first export's (must be identical), and one 1024² image generated
#        from each export with the same seed (must be the same pixels; the PNG's parameters differ: the model's name and hash).
# Results: $OUT/summary.txt (+ the logs).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-}
case "$MODE" in single-file) ;; *) echo "usage: [OUT=DIR] bash bench/runtime/models.sh single-file" >&2; exit 2 ;; esac
export SDXL_SAVE_DIFFUSERS=1
source bench/lib/gpu_prepare.sh  # build + export (+ $WORK/full-diffusers); sets OUT WORK SDXL MODEL

t0=$(date +%s)
python3 -m reference.single_file_fixture --from-diffusers "$WORK/full-diffusers" --out "$WORK/single" --dtype fp16 \
  | tee -a "$OUT/summary.txt"
echo "wrote the single file: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null && echo "page cache dropped" | tee -a "$OUT/summary.txt" || true
t0=$(date +%s.%N)
python3 scripts/export_sdxl.py --from "$WORK/single/checkpoint.safetensors" --dtype fp16 --device cuda \
  --out "$WORK/from-file" --check none --force > "$OUT/export-from-file.log" 2>&1
python3 -c "import sys,time; print(f'export --from FILE (cuda, --check none): {time.time()-float(sys.argv[1]):.1f} s wall')" "$t0" \
  | tee -a "$OUT/summary.txt"
grep -E "^  (build|peak memory)|tensors \(unet" "$OUT/export-from-file.log" | tee -a "$OUT/summary.txt"
python3 - "$MODEL" "$WORK/from-file" <<'PY' | tee -a "$OUT/summary.txt"
import sys, torch
a, b = sys.argv[1], sys.argv[2]
for f in ("text_encoder.ts", "text_encoder_2.ts", "unet.ts", "vae_decoder.ts", "vae_encoder.ts"):
    pa = dict(torch.jit.load(f"{a}/{f}").named_parameters()); pb = dict(torch.jit.load(f"{b}/{f}").named_parameters())
    same = set(pa) == set(pb) and all(torch.equal(pa[k], pb[k]) for k in pa)
    print(f"{f}: {len(pa)} tensors, identical to the folder export: {same}")
PY
for m in full from-file; do
  t0=$(date +%s.%N)
  "$SDXL" --log-level warn generate --model "$WORK/$m" --device cuda --prompt "comic panel, a lighthouse in a storm" \
    --seed 5 --out "$WORK/$m.png" > "$WORK/gen-$m.log" 2>&1 || echo "generate $m: exit $?" >> "$OUT/summary.txt"
  python3 -c "import sys,time; print(f'generate 1024² 28 steps on {sys.argv[2]} (cold start): {time.time()-float(sys.argv[1]):.1f} s wall')" \
    "$t0" "$m" | tee -a "$OUT/summary.txt"
done
python3 -c "import sys,numpy as np; from PIL import Image; a,b=(np.asarray(Image.open(p).convert('RGB')) for p in sys.argv[1:]); print('same pixels from both exports:', a.shape==b.shape and bool((a==b).all()))" \
  "$WORK/full.png" "$WORK/from-file.png" | tee -a "$OUT/summary.txt"
python3 -c "import sys; from PIL import Image; p=Image.open(sys.argv[1]).info.get('parameters',''); print('from-file PNG:', [i.strip() for i in p.split(',') if 'hash' in i])" \
  "$WORK/from-file.png" | tee -a "$OUT/summary.txt"
