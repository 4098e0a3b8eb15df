#!/usr/bin/env bash
# Gathers ComfyUI for the GPU machine (no network) into the git-ignored folder .comfy/:
#   .comfy/src   the pinned release's source, from a local git mirror of its public repository
#                (git archive), without its tests, CI files and the tokenizers of models other than
#                SDXL (SDXL's two CLIPs use comfy/sd1_tokenizer, which is kept)
#   .comfy/whl   the Python 3.12 wheels its headless path needs that the GPU machine's python3 lacks
# Usage (repository root, networked machine): bash bench/comfyui/gather.sh MIRROR_GIT_DIR
# The frontend package (comfyui-frontend-package), the workflow templates and the embedded docs
# are left out: they serve the browser UI, and the in-process PromptExecutor (bench/comfyui/
# comfy_bench.py) never starts the web server. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."
MIRROR=${1:?usage: bash bench/comfyui/gather.sh MIRROR_GIT_DIR (a git directory holding the pinned commit)}
# ComfyUI v0.8.0: the commit "ComfyUI v0.8.0" (comfyui_version.py 0.8.0), 2026-01-07.
COMMIT=${COMFY_COMMIT:-fc0cb10bcbee6e73ed3caf34c27f7bde4559a07f}

rm -rf .comfy/src && mkdir -p .comfy/src .comfy/whl
# The pinned commit's files, each read from the mirror (git archive reads every blob of the tree,
# and the mirror lacks files of 4 MiB and more), less what the headless SDXL path never reads.
skip='^(tests/|tests-unit/|\.github/|\.ci/|comfy/text_encoders/[a-z0-9_]+_tokenizer/)'
git --git-dir "$MIRROR" ls-tree -r "$COMMIT" | while read -r mode type hash path; do
  [[ $type == blob && ! $path =~ $skip ]] || continue
  if ! git --git-dir "$MIRROR" cat-file -e "$hash" 2>/dev/null; then echo "not in the mirror, left out: $path"; continue; fi
  mkdir -p ".comfy/src/$(dirname "$path")"
  git --git-dir "$MIRROR" cat-file blob "$hash" > ".comfy/src/$path"
  [ "$mode" != 100755 ] || chmod +x ".comfy/src/$path"
done
echo "$COMMIT" > .comfy/src/COMMIT
# The headless path's imports (main.py's server, nodes.py, comfy_extras/nodes_upscale_model.py) that
# the GPU machine's python3 may lack: run.sh installs those whose module python3 cannot import.
# Not carried: scipy (35 MB; python3 has it, jax needs it), kornia (only other extras nodes),
# SQLAlchemy and alembic (the optional asset database), comfy-kitchen (68 MB: fp8 / fp4 kernels,
# imported in a try), the frontend, templates and docs packages (the browser UI). spandrel comes
# with the project's .whl.
wheels=(av==19.0.2 torchsde==0.2.6 trampoline==0.1.2 aiohttp==3.14.5 yarl==1.25.1 multidict==7.2.1
  propcache==0.5.4 frozenlist==1.8.0 aiosignal==1.4.0 aiohappyeyeballs==2.7.1 attrs==26.1.0 idna==3.11
  pydantic-settings==2.16.3 python-dotenv==1.2.4 pydantic==2.12.5 pydantic-core==2.41.5
  typing-inspection==0.4.2 annotated-types==0.7.0)
for w in "${wheels[@]}"; do
  name=${w%%==*}; ver=${w##*==}
  ls .comfy/whl | grep -qi "^${name//-/_}-${ver}-" && continue
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d .comfy/whl "$w"
done
# The source travels packed (about a fifth of its size): run.sh unpacks it.
tar -cJf .comfy/src.tar.xz -C .comfy/src .
du -sh .comfy/src.tar.xz .comfy/whl
