#!/usr/bin/env bash
# FP8 UNet (--precision fp8) against the exact fp16 UNet (GPU machine, repository root)
#   OUT=DIR bash bench/runtime/precision.sh fp8|fp8-aoti     (or bench/gpu_runtime.sh MODE)
# fp8:      exports the full-size random model with --fp8 (unet_fp8.ts, scales calibrated on
#           configs/fp8-calibration-prompts.txt) and its diffusers copy; the fidelity of the FP8
#           UNet (bench/fp8_fidelity.py: per-step relative L2 on the fp16 trajectory, PSNR/SSIM of
#           the final images); then 16 images at 1024², --max-batch 4, TorchScript UNet, fp16 vs
#           fp8 (s/image, memory, PSNR between them).
# fp8-aoti: exports the same model with unet_fp8.pt2 and vae_decoder.pt2 (AOTInductor, 1024x1024,
#           rows 1..16; export
#           and compile time reported, and the package's check against the eager FP8 UNet), then
#           32 images at --max-batch 4 and 8 at 28 steps CFG 7, at MLPerf's settings (20 steps,
#           CFG 8), and 12 images with three LoRA sets (switch and merge seconds in the report,
#           FP8 weights whose scale a LoRA grew in the log); PSNR against the fp16 TorchScript
#           images when the fp8 mode ran before on this machine ($WORK kept).
#           BENCH_LONG_PANELS=N adds N panels at b8 (a sustained rate).
#           BENCH_BATCH_MAX=N (above 8) exports the model for N images per UNet call (--batch-max N:
#           packages of 1..2N rows) and first runs 64 panels at --max-batch N and 8, at 28 steps
#           CFG 7 and at MLPerf's settings (64 panels: batches of N after the first of each shape).
# fp16-aoti: the same for the exact fp16 UNet (unet.pt2).
# fp8-tiny: the tiny model's FP8 UNet through AOTInductor on the GPU (a few minutes: the whole
#           path of unet_fp8.pt2, export check to PNG): 8 images with the FP8 package twice
#           (repeatable?), with unet_fp8.ts and with the fp16 UNet, and with a LoRA whose merge
#           grows FP8 scales through the package and unet_fp8.ts; PSNR between them.
# Every part is skipped when its result is in $WORK already, and parts stop starting
# once BENCH_DEADLINE_S (540 s from the start) is near, so calling the mode again on a
# warm machine goes on where the last call stopped.
# Results: $OUT/summary.txt, $OUT/fp8-fidelity.{json,md}, the reports as JSON.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-}
case "$MODE" in fp8|fp8-aoti|fp16-aoti|fp8-tiny) ;; *) echo "usage: [OUT=DIR] bash bench/runtime/precision.sh fp8|fp8-aoti|fp16-aoti|fp8-tiny" >&2; exit 2 ;; esac
T_START=$(date +%s)
DEADLINE=$(( T_START + ${BENCH_DEADLINE_S:-540} ))
# The export (bench/lib/gpu_prepare.sh): the same seeded random weights in every mode, so the
# images of one mode compare with another's on the same machine.
# BENCH_AOTI_CONFIG="KEY=VALUE ...": more Inductor settings for the package (e.g.
# force_layout_optimization=True: Inductor skips channels-last convolutions for dynamic shapes);
# the export folder is named after them, so a warm machine keeps both packages.
AOTI_ARGS="--aoti --aoti-size 1024x1024 --aoti-config aot_inductor.compile_wrapper_opt_level=O0"
AOTI_TAG=
for kv in ${BENCH_AOTI_CONFIG:-}; do AOTI_ARGS+=" --aoti-config $kv"; AOTI_TAG+="-${kv%%=*}"; done
BM=${BENCH_BATCH_MAX:-8}
[ "$BM" -ne 8 ] && { AOTI_ARGS+=" --batch-max $BM"; AOTI_TAG+="-bm$BM"; }
case "$MODE" in
  fp8) export SDXL_MODEL_NAME=full-fp8 SDXL_EXPORT_ARGS="--fp8" SDXL_SAVE_DIFFUSERS=1 ;;
  fp8-aoti) export SDXL_MODEL_NAME=full-fp8-aoti$AOTI_TAG SDXL_EXPORT_ARGS="--fp8 --aoti-variants fp8,vae $AOTI_ARGS" ;;
  fp16-aoti) export SDXL_MODEL_NAME=full-aoti$AOTI_TAG SDXL_EXPORT_ARGS="$AOTI_ARGS" ;;
  fp8-tiny) export SDXL_MODEL_NAME=tiny-fp8-aoti SDXL_EXPORT_SOURCE=--tiny SDXL_EXPORT_ARGS="--fp8 --aoti --aoti-variants fp8" ;;
esac
source bench/lib/gpu_prepare.sh  # build + export; sets OUT WORK SDXL MODEL
[ -f "$MODEL/model.json" ] || { echo "export failed (see export.log)" | tee -a "$OUT/summary.txt"; tail -8 "$OUT/export.log"; exit 1; }
grep -h "aoti_compile_and_package\|fp8: \|check unet" "$OUT/export.log" 2>/dev/null | tee -a "$OUT/summary.txt" || true
source bench/lib/runtime.sh

# time_for SECONDS PART: whether PART may start (enough time left), else a line saying it was left out.
time_for() {
  local left=$(( DEADLINE - $(date +%s) ))
  if [ "$left" -lt "$1" ]; then echo "not run (${left} s left, needs ~$1 s): $2" | tee -a "$OUT/summary.txt"; return 1; fi
}
# mkpanels FILE N [STEPS CFG]: N comic panels at 1024², fixed seeds.
mkpanels() {
  python3 - "$@" <<'PY'
import json, sys
path, n = sys.argv[1], int(sys.argv[2])
extra = {"steps": int(sys.argv[3]), "cfg": float(sys.argv[4])} if len(sys.argv) > 4 else {}
scenes = ["a lighthouse keeper in a storm", "two kids racing bicycles downhill", "a robot reading under a tree",
          "a detective in a neon alley"]
tasks = [{"id": f"p{i:02d}", "prompt": f"comic panel {i}, {scenes[i % 4]}, bold ink lines", "seed": 500 + i, **extra}
         for i in range(n)]
json.dump({"version": 1, "tasks": tasks}, open(path, "w"), indent=1)
PY
}

if [ "$MODE" = fp8-tiny ]; then
  # tiny8: 8 panels; tiny8-lora: the same with the strong test LoRA kohya_unet at 0.8, which makes
  # every FP8 weight it patches grow its scale (the package must see the shared weight_scale buffers).
  python3 -m reference.make_test_loras --arch tiny --out "$WORK/tiny-loras" > "$OUT/lora-make.log" 2>&1
  python3 - "$WORK/tiny8.json" "$WORK/tiny8-lora.json" "$WORK/tiny-loras" <<'PY'
import json, sys
for path, lora in ((sys.argv[1], ""), (sys.argv[2], " <lora:kohya_unet:0.8>")):
    tasks = [{"id": f"t{i}", "prompt": f"a comic panel {i}, a robot in the rain{lora}", "seed": 40 + i, "width": 256,
              "height": 256, "steps": 8, "cfg": 5.0} for i in range(8)]
    batch = {"version": 1, "tasks": tasks}
    if lora:
        batch["loras"] = {"kohya_unet": {"path": f"{sys.argv[3]}/kohya_unet.safetensors"}}
    json.dump(batch, open(path, "w"))
PY
  for spec in "tiny-aoti-fp8 tiny8 aoti fp8" "tiny-aoti-fp8-again tiny8 aoti fp8" "tiny-ts-fp8 tiny8 torchscript fp8" \
              "tiny-ts-default tiny8 torchscript default" "tiny-aoti-fp8-lora tiny8-lora aoti fp8" \
              "tiny-ts-fp8-lora tiny8-lora torchscript fp8"; do
    set -- $spec
    run "$1" "$WORK/$2.json" --max-batch 4 --unet-backend "$3" --precision "$4" || true
  done
  compare tiny-aoti-fp8 tiny-aoti-fp8-again
  compare tiny-ts-fp8 tiny-aoti-fp8
  compare tiny-ts-default tiny-aoti-fp8
  compare tiny-ts-fp8-lora tiny-aoti-fp8-lora  # as near as without the LoRA: the package uses the grown scales
  compare tiny-aoti-fp8 tiny-aoti-fp8-lora     # the LoRA acts
  grep -h "beyond their export range" "$WORK/tiny-aoti-fp8-lora.log" 2>/dev/null | head -2 | tee -a "$OUT/summary.txt" || true
  exit 0
elif [ "$MODE" = fp8 ]; then
  if [ ! -f "$WORK/fp8-fidelity.json" ] && time_for 150 "fidelity (bench/fp8_fidelity.py)"; then
    t0=$(date +%s)
    python3 bench/fp8_fidelity.py --model "$MODEL" --diffusers "$WORK/full-diffusers" --device cuda \
      --json "$WORK/fp8-fidelity.json" > "$WORK/fp8-fidelity.md" 2> "$OUT/fp8-fidelity.log" \
      || echo "fp8_fidelity.py: exit $? (see fp8-fidelity.log)" | tee -a "$OUT/summary.txt"
    echo "fidelity: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
  fi
  cp "$WORK"/fp8-fidelity.{json,md} "$OUT/" 2>/dev/null || true
  mkpanels "$WORK/panels16.json" 16
  for p in default fp8; do
    [ -f "$WORK/ts-$p/report.json" ] || { time_for 90 "ts-$p" && run "ts-$p" "$WORK/panels16.json" --max-batch 4 \
      --unet-backend torchscript --precision "$p"; } || true
  done
  [ -f "$WORK/ts-fp8/report.json" ] && compare ts-default ts-fp8 || true
else
  p=default; [ "$MODE" = fp8-aoti ] && p=fp8
  tag=$p$AOTI_TAG  # run names
  mkpanels "$WORK/panels32.json" 32
  mkpanels "$WORK/panels32-mlperf.json" 32 20 8
  # BENCH_LONG_PANELS=N (default 0: none): one more run of N panels at b8, for a sustained rate
  # in which the three first batches of a 32-panel run weigh little.
  LONG=${BENCH_LONG_PANELS:-0} long=
  [ "$LONG" -gt 0 ] && { mkpanels "$WORK/panels$LONG.json" "$LONG"; long="aoti-$tag-b8-long panels$LONG 8"; }
  # With BENCH_BATCH_MAX above 8: N images per UNet call against 8, on 64 panels.
  wide=()
  if [ "$BM" -gt 8 ]; then
    mkpanels "$WORK/panels64.json" 64
    mkpanels "$WORK/panels64-mlperf.json" 64 20 8
    wide=("aoti-$tag-b$BM-64 panels64 $BM" "aoti-$tag-b8-64 panels64 8" "aoti-$tag-mlperf-b$BM-64 panels64-mlperf $BM"
          "aoti-$tag-mlperf-b8-64 panels64-mlperf 8")
  fi
  # Most telling first: a call cut short by the device budget still has the b8 and MLPerf rows.
  for spec in "${wide[@]}" "aoti-$tag-b8 panels32 8" "aoti-$tag-mlperf-b8 panels32-mlperf 8" "aoti-$tag-b4 panels32 4" \
              "aoti-$tag-lora lora12 4" "aoti-$tag-mlperf-b4 panels32-mlperf 4" ${long:+"$long"}; do
    set -- $spec
    [ -f "$WORK/$1/report.json" ] && continue
    need=60; [ "$1" = "aoti-$tag-b8-long" ] && need=$(( 30 + LONG ))
    case "$2" in panels64*) need=110 ;; esac
    time_for "$need" "$1" || continue
    [ "$2" = lora12 ] && { need_loras; mkbatch "$WORK/lora12.json" 12 0 "$WORK/loras"; }
    run "$1" "$WORK/$2.json" --max-batch "$3" --unet-backend aoti --precision "$p" || true
  done
  grep -h "beyond their export range" "$WORK/aoti-$tag-lora.log" 2>/dev/null | head -3 | tee -a "$OUT/summary.txt" || true
  # The same 16 panels as the fp8 mode's TorchScript runs (same seeds): how far from fp16 TorchScript?
  if [ -f "$WORK/ts-default/report.json" ] && [ ! -f "$WORK/aoti-$tag-16/report.json" ] && time_for 60 "aoti-$tag-16"; then
    run "aoti-$tag-16" "$WORK/panels16.json" --max-batch 4 --unet-backend aoti --precision "$p"
    compare ts-default "aoti-$tag-16"
    [ -f "$WORK/ts-fp8/report.json" ] && [ "$p" = fp8 ] && compare ts-fp8 "aoti-$tag-16" || true
  fi
  # With BENCH_AOTI_CONFIG, against the package without it when that ran on this machine.
  [ -n "$AOTI_TAG" ] && [ -f "$WORK/aoti-$p-b8/report.json" ] && compare "aoti-$p-b8" "aoti-$tag-b8" || true
fi
wrap_up
