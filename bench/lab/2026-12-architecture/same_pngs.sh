#!/usr/bin/env bash
# Do two sdxl-batch binaries make the same PNGs? Runs each config below on one tiny model folder with
# both binaries (at --max-batch 1 and 4), then compares every PNG byte for byte (those of a task with
# "seed": -1 draw another seed in each run: they are counted, not compared).
#   bash bench/lab/2026-12-architecture/same_pngs.sh OLD_BINARY NEW_BINARY MODEL_DIR WORK_DIR
set -euo pipefail
old=$1 new=$2 model=$3 work=$4
cd "$(dirname "$0")/../../.."
rm -rf "$work" && mkdir -p "$work"
same=0 differ=0 drawn=0
for cfg in example-batch nightly-story priorities; do  # the configs e2e_cli runs on the tiny model
  for b in 1 4; do
    for tag in old new; do
      bin=$old; [ "$tag" = new ] && bin=$new
      "$bin" --log-level warn run "configs/$cfg.json" --model "$model" --out "$work/$tag/$cfg-b$b" --max-batch "$b" \
        --no-progress >/dev/null 2>"$work/$tag-$cfg-b$b.log" || echo "$tag $cfg b$b: exit $?"
    done
    while IFS= read -r f; do
      rel=${f#"$work/old/"}
      if [ ! -f "$work/new/$rel" ]; then drawn=$((drawn + 1)); continue; fi  # a seed drawn at run time (its name differs)
      if cmp -s "$f" "$work/new/$rel"; then same=$((same + 1)); else differ=$((differ + 1)); echo "differs: $rel"; fi
    done < <(find "$work/old/$cfg-b$b" -name '*.png' | sort)
    n_old=$(find "$work/old/$cfg-b$b" -name '*.png' | wc -l); n_new=$(find "$work/new/$cfg-b$b" -name '*.png' | wc -l)
    [ "$n_old" = "$n_new" ] || echo "$cfg b$b: $n_old PNGs before, $n_new after"
  done
done
echo "PNGs byte-identical: $same; different: $differ; with a seed drawn at run time (not compared): $drawn"
