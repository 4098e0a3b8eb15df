#!/usr/bin/env python3
"""Parity (ctest label parity): reference.diffusers_loop, the for-loop baseline
that bench/gpu_runtime.sh's loop mode times sdxl-batch against, makes the images
sdxl-batch makes for the same batch file (tiny model, CPU, fp32).

The batch has two sizes, LoRA sets from the registry, from a prompt tag and
none, a task with count 2, and a last task equal to the first, after two LoRA
sets: the loop must restore the weights exactly (its PNG equal to the first
one's, byte for byte). Each image of `sdxl-batch run` must be within --min-psnr
(40 dB) of the loop's, and each LoRA image must differ from the same task
without LoRA (else the LoRA part proves nothing). A batch the loop cannot run
(img2img) must be refused with the task's id before anything is written.

    PYTHONPATH=tests parity_loop.py --binary B --model TINY --diffusers TINY_DIFFUSERS --loras LORA_DIR --work DIR
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from parity_common import finish, parse_args

from reference.compare_images import load_rgb, psnr

PROMPT = "comic panel {}, a lighthouse keeper in a storm, bold ink lines"


def main() -> int:
    a, work = parse_args(__doc__, lambda ap: ap.add_argument("--loras", required=True,
                                                              help="reference.make_test_loras output (tiny arch)"))

    loras = Path(a.loras).resolve()
    tasks = [
        {"id": "plain", "prompt": PROMPT.format(0), "seed": 7},
        {"id": "reg", "prompt": PROMPT.format(0), "seed": 7, "loras": [{"name": "u", "weight": 0.9}]},
        {"id": "tag", "prompt": PROMPT.format(0) + " <lora:p:0.8>", "seed": 7, "width": 320, "count": 2},
        {"id": "plain-wide", "prompt": PROMPT.format(0), "seed": 7, "width": 320},
        {"id": "again", "prompt": PROMPT.format(0), "seed": 7},
    ]
    batch = {"version": 1, "defaults": {"negative": "blurry", "steps": 4, "cfg": 5.0, "width": 256, "height": 256},
             "loras": {"u": {"path": str(loras / "kohya_unet.safetensors")}, "p": {"path": str(loras / "peft.safetensors")}},
             "tasks": tasks}
    bfile = work / "batch.json"
    bfile.write_text(json.dumps(batch, indent=1))
    ours_dir, loop_dir = work / "sdxl-batch", work / "loop"
    for d in (ours_dir, loop_dir):
        subprocess.run(["rm", "-rf", str(d)], check=True)
    r = subprocess.run([a.binary, "run", str(bfile), "--model", a.model, "--out", str(ours_dir), "--threads", "1",
                        "--no-progress"], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"sdxl-batch run failed ({r.returncode}):\n{r.stderr}")
    loop = [sys.executable, "-m", "reference.diffusers_loop", "--diffusers", a.diffusers, "--model", a.model,
            "--device", "cpu", "--dtype", "fp32", "--threads", "1"]
    r = subprocess.run(loop + ["--batch", str(bfile), "--out", str(loop_dir)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"diffusers_loop.py failed ({r.returncode}):\n{r.stderr}")
    report = json.loads((loop_dir / "report.json").read_text())

    def manifest(d: Path) -> dict:
        return {(m["task"], m["index"]): m for m in map(json.loads, (d / "manifest.jsonl").read_text().splitlines())}

    mo, ml = manifest(ours_dir), manifest(loop_dir)
    rows, failed = [], False
    no_lora = {"reg": ("plain", 0), "tag": ("plain-wide", 0)}
    for key in sorted(ml):
        if key not in mo:
            rows.append({"image": f"{key[0]}-{key[1]}", "psnr_db": 0.0, "vs_no_lora_db": 0.0, "ok": False})
            failed = True
            continue
        ia, ib = load_rgb(str(ours_dir / mo[key]["file"])), load_rgb(str(loop_dir / ml[key]["file"]))
        p = psnr(ia, ib)
        base = no_lora.get(key[0]) if key[1] == 0 else None
        p_base = psnr(ia, load_rgb(str(ours_dir / mo[base]["file"]))) if base else float("nan")
        ok = p >= a.min_psnr and (base is None or p_base < a.min_psnr)
        failed |= not ok
        rows.append({"image": f"{key[0]}-{key[1]}", "psnr_db": p, "vs_no_lora_db": p_base, "ok": ok})
    # The restore: the last task repeats the first after two LoRA sets were fused.
    restored = ml[("again", 0)]["sha256"] == ml[("plain", 0)]["sha256"]
    rows.append({"image": "loop restore (again = plain)", "psnr_db": float("inf") if restored else 0.0,
                 "vs_no_lora_db": float("nan"), "ok": restored})
    failed |= not restored
    if report["images"] != 6 or report["lora_switches"] != 3:
        print(f"FAIL: report counts {report['images']} images, {report['lora_switches']} LoRA switches; expected 6 and 3")
        failed = True
    # Refused up front: img2img names the task and the field; nothing generated.
    bad = dict(batch, tasks=[tasks[0], {"id": "i2i", "prompt": "x", "seed": 1, "init_image": "a.png"}])
    (work / "bad.json").write_text(json.dumps(bad))
    r = subprocess.run(loop + ["--batch", str(work / "bad.json"), "--out", str(work / "bad-out")],
                       capture_output=True, text=True)
    refused = r.returncode == 2 and "task 'i2i'" in r.stderr and "init_image" in r.stderr and not (work / "bad-out").exists()
    rows.append({"image": "img2img refused", "psnr_db": float("nan"), "vs_no_lora_db": float("nan"), "ok": refused})
    if not refused:
        print(f"img2img batch: exit {r.returncode}, stderr: {r.stderr.strip()}")
    failed |= not refused
    return finish(rows, [("image", "image", "<30"), ("PSNR dB", "psnr_db", ">8.2f"), ("vs no-LoRA", "vs_no_lora_db", ">10.2f")],
                  work / "parity_loop.json", failed,
                  "an image is below {min_psnr} dB of sdxl-batch's, a LoRA changed nothing, or the loop did not restore",
                  ", LoRAs change the images, the loop restores its weights and refuses img2img", a.min_psnr)


if __name__ == "__main__":
    sys.exit(main())
