#!/usr/bin/env bash
# Builds the libFuzzer targets of the torch-free core with clang (address +
# undefined-behaviour sanitizers) and runs each for SECONDS (default 300).
#   scripts/fuzz.sh [SECONDS] [TARGET...]     targets: batch_file clip_tokenizer prompt_parser safetensors report
# Needs: clang, libclang-rt-dev (Debian), .venv (to make the tokenizer files).
# Exit non-zero on any crash, leak, sanitizer report or timeout; the input that
# broke it is left in build/fuzz/<target>/: add it to tests/fuzz/regressions/<target>/
# with the fix, so every later run replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-300}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(batch_file clip_tokenizer prompt_parser safetensors report)
CXX=${CXX_FUZZ:-clang++}
command -v "$CXX" >/dev/null || { echo "fuzz: $CXX not found (apt-get install clang libclang-rt-dev)" >&2; exit 1; }
out=build/fuzz
mkdir -p "$out/obj"
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Isrc)
# Each source is compiled once for all targets (they share most of them), two at a time,
# through ccache when it is installed (a rerun on unchanged sources compiles nothing).
compile=("$CXX")
if command -v ccache >/dev/null; then compile=(ccache "$CXX"); fi
declare -A srcs=(
  [batch_file]="src/batch/batch_file.cpp src/batch/generation_params.cpp src/batch/wildcards.cpp src/batch/story.cpp src/batch/priority.cpp src/batch/lora_ref.cpp src/batch/output_names.cpp src/batch/batch_strings.cpp src/batch/regions.cpp src/batch/task_keys.cpp src/batch/json_fields.cpp src/batch/video_spec.cpp src/core/error.cpp src/core/units.cpp src/core/input_file.cpp src/core/json_shape.cpp src/core/input_text.cpp src/core/sha256.cpp"
  [clip_tokenizer]="src/text/clip_tokenizer.cpp src/text/unicode_data.cpp"
  [prompt_parser]="src/text/prompt_parser.cpp src/text/prompt_chunks.cpp src/text/prompt_schedule.cpp src/text/clip_tokenizer.cpp src/text/unicode_data.cpp"
  [safetensors]="src/lora/safetensors.cpp src/lora/lora_keys.cpp src/core/sha256.cpp src/core/input_file.cpp"
  [report]="src/scheduler/night_report.cpp src/scheduler/output_folder.cpp src/report/report_html.cpp src/image/png_reader.cpp src/image/png_writer.cpp src/batch/manifest.cpp src/batch/generation_params.cpp src/batch/regions.cpp src/batch/task_keys.cpp src/batch/lora_ref.cpp src/core/error.cpp src/core/input_file.cpp src/core/json_shape.cpp src/core/input_text.cpp src/core/atomic_file.cpp src/core/run_lock.cpp"
)
# Libraries a target links beyond the sanitizers (the report target: zlib for PNGs, fmt for spdlog).
declare -A libs=([report]="-lz -lfmt")
if [ ! -f "$out/tokenizer/vocab.json" ]; then
  .venv/bin/python scripts/export/clip_vocab.py "$out/tokenizer" --pad-token '!' >/dev/null
fi
export SDXL_FUZZ_TOKENIZER_DIR=$PWD/$out/tokenizer
obj_of() { local o=${1//\//_}; echo "$out/obj/${o%.cpp}.o"; }
declare -A wanted=()
for t in "${targets[@]}"; do
  [ -n "${srcs[$t]:-}" ] || { echo "fuzz: unknown target $t" >&2; exit 2; }
  for f in tests/fuzz/fuzz_$t.cpp ${srcs[$t]}; do wanted[$f]=1; done
done
echo "fuzz: compiling ${#wanted[@]} sources"
printf '%s\n' "${!wanted[@]}" | sort | while read -r f; do echo "$f $(obj_of "$f")"; done |
  xargs -P 2 -n 2 bash -c 'n=$#; "${@:1:n-2}" -c "${@:n-1:1}" -o "${@:n:1}"' _ "${compile[@]}" "${flags[@]}" || {
  echo "fuzz: compiling failed" >&2; exit 1; }
for t in "${targets[@]}"; do
  bin="$out/fuzz_$t"
  echo "fuzz: linking $t"
  objs=()
  for f in tests/fuzz/fuzz_$t.cpp ${srcs[$t]}; do objs+=("$(obj_of "$f")"); done
  $CXX "${flags[@]}" "${objs[@]}" ${libs[$t]:-} -o "$bin"
  mkdir -p "$out/$t/corpus"
  seed_dir=$out/$t/seeds
  mkdir -p "$seed_dir"
  cp configs/*.json "$seed_dir/" 2>/dev/null || true
  # Inputs that once crashed or hung a parser stay as seeds: each run replays them first.
  if [ -d "tests/fuzz/regressions/$t" ]; then cp "tests/fuzz/regressions/$t"/* "$seed_dir/"; fi
  printf 'a photo of (a cat:1.2), [dog], 一只猫 <|endoftext|> !!' > "$seed_dir/prompt.txt"
  # Small real LoRA files as seeds for the safetensors target (made by make_test_loras.py
  # when the build has them; the fuzzer also starts from nothing).
  if [ "$t" = safetensors ]; then
    rm -f "$seed_dir"/*.json "$seed_dir/prompt.txt"
    for f in build/default/fixtures/loras/{kohya_te,sd15,nan}.safetensors; do
      if [ -f "$f" ]; then cp "$f" "$seed_dir/"; fi
    done
    printf '\x36\x00\x00\x00\x00\x00\x00\x00{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}\x00\x00\x80\x3f' > "$seed_dir/min.safetensors"
  fi
  # The report target starts from run reports and manifests (tests/fuzz/regressions/report holds them).
  if [ "$t" = report ]; then rm -f "$seed_dir"/*.json "$seed_dir/prompt.txt"; cp tests/fuzz/regressions/report/* "$seed_dir/"; fi
  echo "fuzz: running $t for ${secs}s"
  (cd "$out/$t" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "../fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 corpus seeds 2>&1 | tail -15)
done
echo "fuzz: all targets ran clean"
