#!/usr/bin/env bash
# Bringing a model in, on the GPU machine (repository root):
#   OUT=DIR bash bench/runtime/models.sh single-file     (or bench/gpu_runtime.sh single-file)
# single-file: the full-size random SDXL (fp16, exported with its diffusers copy) is
#        written as one original-layout .safetensors file (reference.single_file_fixture
#        --from-diffusers), exported again with export_sdxl.py --from FILE --device cuda
#        (--check none; wall time, host max RSS, GPU peak: the export's last lines), its tensors compared
#        with the first export's (must be identical), and one 1024² image generated
#        from each export with the same seed (must be the same pixels; the PNG's parameters differ: the model's name and hash).
# vae-switch: the full-size VAE exported alone as an fp16-safe VAE folder (its config's
#        force_upcast set false: stored and decoded in fp16), then 8 images at 1024²
#        (--max-batch 4) with the model's VAE, and the same 8 with every second task
#        naming the folder ("vae"): images/hour, decode seconds, the VAE cache's
#        counters, the load log line, and whether the model-VAE images stay the same.
# controlnet: a random full-size SDXL ControlNet (reference.controlnet_fixture from the
#        export's UNet, its zero convolutions re-drawn small) exported with
#        export_sdxl.py --controlnet (fp16, cuda, --check quick), then 8 images at 1024²
#        (--max-batch 4) without it, with it on every step (strength 0.8, each task its
#        own 1024² control image), with it for the first half of the steps (end 0.5),
#        and with it at --max-batch 1 (within 1 level of the batched images), with and without
#        CUDA graphs (must be identical): s/image,
#        sampling seconds, peak memory, the ControlNet cache's counters and MiB.
# ip-adapter: random full-size SDXL IP-Adapters (reference.ip_adapter_fixture --size full: plus
#        with a ViT-H encoder and a 1280-wide Resampler, plain with a ViT-bigG encoder) exported
#        with export_sdxl.py --ip-adapter (fp16, cuda, --check quick), then 8 images at 1024²
#        (--max-batch 4) without an adapter, with plus (scale 0.6, 3 references shared by the 8
#        tasks), with plain, with plus at --max-batch 1 (must be within 1 level of b4) with and
#        without CUDA graphs (must be identical), and plain at --max-batch 1: s/image,
#        sampling seconds, peak memory, the adapter and reference caches' counters.
# Results: $OUT/summary.txt (+ the logs).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-}
case "$MODE" in single-file | vae-switch | controlnet | ip-adapter) ;; *) echo "usage: [OUT=DIR] bash bench/runtime/models.sh single-file|vae-switch|controlnet|ip-adapter" >&2; exit 2 ;; esac
export SDXL_SAVE_DIFFUSERS=1
source bench/lib/gpu_prepare.sh  # build + export (+ $WORK/full-diffusers); sets OUT WORK SDXL MODEL
source bench/lib/runtime.sh

if [ "$MODE" = controlnet ]; then
  # The ControlNet lives in $WORK/controlnets/ (a run named cn would remove $WORK/cn); kept between calls.
  if [ ! -f "$WORK/controlnets/pose/model.json" ]; then
    t0=$(date +%s)
    python3 -m reference.controlnet_fixture --diffusers "$WORK/full-diffusers" --out "$WORK/cn-src" --seed 3 \
      --std-scale 0.02 --diffusers-only --name full-random-controlnet > "$OUT/cn-fixture.log" 2>&1
    echo "random full-size ControlNet (from_unet): $(( $(date +%s) - t0 )) s; $(tail -1 "$OUT/cn-fixture.log")" | tee -a "$OUT/summary.txt"
    t0=$(date +%s)
    python3 scripts/export_sdxl.py --controlnet "$WORK/cn-src/diffusers" --dtype fp16 --device cuda --check quick \
      --out "$WORK/controlnets/pose" --force > "$OUT/export-cn.log" 2>&1
    echo "export --controlnet (cuda, --check quick): $(( $(date +%s) - t0 )) s; $(tail -1 "$OUT/export-cn.log")" | tee -a "$OUT/summary.txt"
  fi
  python3 - "$WORK" <<'PY'
import json, sys
from pathlib import Path
import numpy as np
from PIL import Image, ImageDraw
w = Path(sys.argv[1]); (w / "poses").mkdir(exist_ok=True)
rng = np.random.default_rng(4)
for i in range(8):  # stick figures: white lines on black, as pose maps are drawn
    im = Image.new("RGB", (1024, 1024)); d = ImageDraw.Draw(im)
    pts = rng.integers(100, 924, size=(12, 2))
    for a, b in zip(pts[:-1], pts[1:]):
        d.line([tuple(a), tuple(b)], fill=tuple(int(c) for c in rng.integers(80, 256, 3)), width=12)
    im.save(w / "poses" / f"p{i}.png")
tasks = [{"id": f"p{i}", "prompt": f"comic panel {i}, a lighthouse keeper in a storm, bold ink lines", "seed": 300 + i}
         for i in range(8)]
base = {"version": 1, "defaults": {"steps": 28, "cfg": 7.0, "width": 1024, "height": 1024}}
json.dump(dict(base, tasks=tasks), open(w / "plain.json", "w"), indent=1)
for name, extra in (("cn", {}), ("cn-half", {"end": 0.5})):
    cn = [dict(t, controlnets=[dict({"model": "controlnets/pose", "image": f"poses/p{i}.png", "strength": 0.8}, **extra)])
          for i, t in enumerate(tasks)]
    json.dump(dict(base, tasks=cn), open(w / f"{name}.json", "w"), indent=1)
PY
  run plain "$WORK/plain.json" --max-batch 4
  RUN_LOG_LEVEL=info run cn "$WORK/cn.json" --max-batch 4
  run cn-half "$WORK/cn-half.json" --max-batch 4
  run cn-b1 "$WORK/cn.json" --max-batch 1
  run cn-b1-nog "$WORK/cn.json" --max-batch 1 --no-cuda-graphs
  grep -h "ControlNet '" "$WORK/cn.log" | sed 's/^/cn: /' | tee -a "$OUT/summary.txt"
  compare cn cn-b1
  compare cn-b1 cn-b1-nog
  python3 - "$WORK" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
from pathlib import Path
import numpy as np
from PIL import Image
w = Path(sys.argv[1])
for name in ("plain", "cn", "cn-half", "cn-b1", "cn-b1-nog"):
    r = json.loads((w / name / "report.json").read_text()); d = r["devices"][0]
    n = max(1, r["images_done"])
    eng = {k: round(v, 1) for k, v in d.get("engine", {}).items() if k.startswith("controlnet") or "graph_captures" in k}
    print(f"{name}: {r['images_done']} images, {r['images_per_hour']:.0f} images/h, sample {d['sample_s'] / n:.3f} s/image, "
          f"peak allocated {r['memory']['peak_allocated_bytes'] / 2**30:.2f} GiB, fp32 VAE re-decodes: "
          f"{(w / (name + '.log')).read_text().count('decoding it again in fp32')}, {eng}")
def files(name):
    return {json.loads(l)["task"]: w / name / json.loads(l)["file"] for l in (w / name / "manifest.jsonl").read_text().splitlines()}
a, b = files("plain"), files("cn")
px = lambda p: np.asarray(Image.open(p).convert("RGB")).astype(np.float64)
ps = [10 * np.log10(255 ** 2 / max(((px(a[t]) - px(b[t])) ** 2).mean(), 1e-12)) for t in sorted(a)]
print(f"plain vs cn (the ControlNet acts): PSNR {min(ps):.1f}..{max(ps):.1f} dB")
p = Image.open(sorted(b.values())[0]).info.get("parameters", "")
print("cn PNG:", [i.strip() for i in p.split(", ") if "ControlNet" in i or "Guidance" in i][:2])
PY
  log_warnings
  exit 0
fi

if [ "$MODE" = ip-adapter ]; then
  # The adapters live in $WORK/ipadapters/ (a run named ip-* would remove $WORK/ip-*); kept between calls.
  # IP_VARIANTS="plus" skips the ViT-bigG plain adapter (its fixture and export are most of the set-up).
  IP_VARIANTS=${IP_VARIANTS:-plus plain}
  if [ ! -f "$WORK/ipadapters/plus/model.json" ]; then
    t0=$(date +%s)
    python3 -m reference.ip_adapter_fixture --diffusers "$WORK/full-diffusers" --out "$WORK/ipa-src" --size full \
      --variants $IP_VARIANTS > "$OUT/ip-fixture.log" 2>&1
    echo "random full-size IP-Adapters + encoders: $(( $(date +%s) - t0 )) s; $(tail -1 "$OUT/ip-fixture.log")" | tee -a "$OUT/summary.txt"
    for v in $IP_VARIANTS; do
      t0=$(date +%s)
      python3 scripts/export_sdxl.py --ip-adapter "$WORK/ipa-src/$v/ip-adapter-$v.safetensors" \
        --image-encoder "$WORK/ipa-src/$v/image_encoder" --dtype fp16 --device cuda --check quick \
        --out "$WORK/ipadapters/$v" --force > "$OUT/export-ip-$v.log" 2>&1
      echo "export --ip-adapter $v (cuda, --check quick): $(( $(date +%s) - t0 )) s; $(tail -1 "$OUT/export-ip-$v.log")" | tee -a "$OUT/summary.txt"
    done
  fi
  python3 - "$WORK" <<'PY'
import json, sys
from pathlib import Path
import numpy as np
from PIL import Image
w = Path(sys.argv[1]); (w / "refs").mkdir(exist_ok=True)
rng = np.random.default_rng(5)
for i, size in enumerate(((768, 1024), (1024, 768), (512, 512))):  # character sheets of several shapes
    px = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    px[: size[1] // 2] = np.linspace(0, 255, size[0], dtype=np.uint8)[None, :, None]
    Image.fromarray(px, "RGB").save(w / "refs" / f"r{i}.png")
tasks = [{"id": f"p{i}", "prompt": f"comic panel {i}, a lighthouse keeper in a storm, bold ink lines", "seed": 300 + i}
         for i in range(8)]
base = {"version": 1, "defaults": {"steps": 28, "cfg": 7.0, "width": 1024, "height": 1024}}
json.dump(dict(base, tasks=tasks), open(w / "plain.json", "w"), indent=1)
for v in ("plus", "plain"):
    ip = [dict(t, ip_adapter={"model": f"ipadapters/{v}", "images": [f"refs/r{i % 3}.png"], "scale": 0.6})
          for i, t in enumerate(tasks)]
    json.dump(dict(base, tasks=ip), open(w / f"ip-{v}.json", "w"), indent=1)
PY
  run plain "$WORK/plain.json" --max-batch 4
  RUN_LOG_LEVEL=info run ipplus "$WORK/ip-plus.json" --max-batch 4
  [[ " $IP_VARIANTS " == *" plain "* ]] && RUN_LOG_LEVEL=info run ipplain "$WORK/ip-plain.json" --max-batch 4
  run ipplus-b1 "$WORK/ip-plus.json" --max-batch 1
  run ipplus-b1-nog "$WORK/ip-plus.json" --max-batch 1 --no-cuda-graphs
  run plain-b1 "$WORK/plain.json" --max-batch 1
  { grep -h "IP-Adapter '" "$WORK"/ipplus.log "$WORK"/ipplain.log 2>/dev/null || true; } | sed 's/^/ip: /' | tee -a "$OUT/summary.txt"
  compare ipplus ipplus-b1
  compare ipplus-b1 ipplus-b1-nog
  python3 - "$WORK" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
from pathlib import Path
import numpy as np
from PIL import Image
w = Path(sys.argv[1])
for name in ("plain", "ipplus", "ipplain", "ipplus-b1", "ipplus-b1-nog", "plain-b1"):
    if not (w / name / "report.json").exists():
        continue
    r = json.loads((w / name / "report.json").read_text()); d = r["devices"][0]
    n = max(1, r["images_done"])
    eng = {k: round(v, 2) for k, v in d.get("engine", {}).items() if k.startswith("ip_") or "graph_captures" in k}
    print(f"{name}: {r['images_done']} images, {r['images_per_hour']:.0f} images/h, text {d['text_s'] / n:.3f} s/image, "
          f"sample {d['sample_s'] / n:.3f} s/image, peak allocated {r['memory']['peak_allocated_bytes'] / 2**30:.2f} GiB, "
          f"peak reserved {r['memory']['peak_reserved_bytes'] / 2**30:.2f} GiB, {eng}")
def files(name):
    return {json.loads(l)["task"]: w / name / json.loads(l)["file"] for l in (w / name / "manifest.jsonl").read_text().splitlines()}
px = lambda p: np.asarray(Image.open(p).convert("RGB")).astype(np.float64)
a = files("plain")
for name in ("ipplus", "ipplain"):
    if not (w / name / "manifest.jsonl").exists():
        continue
    b = files(name)
    ps = [10 * np.log10(255 ** 2 / max(((px(a[t]) - px(b[t])) ** 2).mean(), 1e-12)) for t in sorted(a)]
    print(f"plain vs {name} (the adapter acts): PSNR {min(ps):.1f}..{max(ps):.1f} dB")
p = Image.open(sorted(files("ipplus").values())[0]).info.get("parameters", "")
print("ipplus PNG:", [i.strip() for i in p.split(", ") if "IP-Adapter" in i])
PY
  log_warnings
  exit 0
fi

if [ "$MODE" = vae-switch ]; then
  rm -rf "$WORK/vae-fp16-src" && cp -r "$WORK/full-diffusers/vae" "$WORK/vae-fp16-src"
  python3 - "$WORK/vae-fp16-src/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["force_upcast"] = False; json.dump(c, open(sys.argv[1], "w"), indent=1)
PY
  t0=$(date +%s)
  python3 scripts/export_sdxl.py --vae-only --vae "$WORK/vae-fp16-src" --dtype fp16 --device cuda \
    --out "$WORK/vaes/fp16" --force > "$OUT/export-vae.log" 2>&1
  echo "export --vae-only: $(( $(date +%s) - t0 )) s; $(tail -1 "$OUT/export-vae.log")" | tee -a "$OUT/summary.txt"
  python3 - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
tasks = [{"id": f"p{i}", "prompt": f"comic panel {i}, a lighthouse keeper in a storm, bold ink lines", "seed": 300 + i}
         for i in range(8)]
base = {"version": 1, "defaults": {"steps": 28, "cfg": 7.0, "width": 1024, "height": 1024}}
json.dump(dict(base, tasks=tasks), open(f"{w}/own-vae.json", "w"), indent=1)
mixed = [dict(t, vae="vaes/fp16") if i % 2 else t for i, t in enumerate(tasks)]
json.dump(dict(base, tasks=mixed), open(f"{w}/mixed-vae.json", "w"), indent=1)
PY
  RUN_LOG_LEVEL=info run own-vae "$WORK/own-vae.json" --max-batch 4
  RUN_LOG_LEVEL=info run mixed-vae "$WORK/mixed-vae.json" --max-batch 4
  grep -h "VAE '" "$WORK/mixed-vae.log" | sed 's/^/mixed-vae: /' | tee -a "$OUT/summary.txt"
  python3 - "$WORK" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
from pathlib import Path
import numpy as np
from PIL import Image
w = Path(sys.argv[1])
for name in ("own-vae", "mixed-vae"):
    r = json.loads((w / name / "report.json").read_text()); d = r["devices"][0]
    print(f"{name}: {r['images_done']} images, {r['images_per_hour']:.0f} images/h, decode {d['decode_s']:.2f} s, "
          f"engine VAE counters {({k: v for k, v in d.get('engine', {}).items() if k.startswith('vae')})}")
def files(name):
    return {json.loads(l)["task"]: w / name / json.loads(l)["file"] for l in (w / name / "manifest.jsonl").read_text().splitlines()}
a, b = files("own-vae"), files("mixed-vae")
px = lambda p: np.asarray(Image.open(p).convert("RGB")).astype(np.float64)
for t in sorted(a):
    mse = ((px(a[t]) - px(b[t])) ** 2).mean()
    print(f"{t}: {'other VAE' if int(t[1:]) % 2 else 'model VAE'} vs the own-VAE run: "
          + ("identical" if mse == 0 else f"PSNR {10 * np.log10(255 ** 2 / mse):.1f} dB"))
PY
  log_warnings
  exit 0
fi

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
