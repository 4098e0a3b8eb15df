"""The for-loop a user would otherwise write: diffusers' StableDiffusionXLPipeline
run over an sdxl-batch batch file one image at a time, in file order, with no
queue, no batching and no overlap. It is the baseline of issue 6's "users
report +50% from a queue": the same tasks, seeds, sizes and LoRA sets as
sdxl-batch gets, so images/hour compare directly (bench/gpu_runtime.sh loop).

Per image it does what sdxl-batch does for the same task, so the images can be
compared as well as timed (tests/parity/parity_loop.py):
  - the prompt's <lora:NAME:WEIGHT> tags are removed from the text and their
    LoRAs added to the task's "loras" (names from the batch's registry);
  - the conditioning follows A1111's prompt rules (reference_sdxl.a1111_embeds);
  - the noise comes from torch.Generator("cpu").manual_seed(seed + i);
  - the sampler / schedule are the batch's (reference.a1111_schedulers).
A LoRA set is fused into the weights when it differs from the previous image's
(reference.lora_reference), after the weights it touched before are restored
from a copy: the careful for-loop, which fuses once per run of equal sets.

    PYTHONPATH=tests python -m reference.diffusers_loop --diffusers DIR --batch FILE --out DIR
        [--model SDXL_MODEL_DIR] [--device cuda --dtype fp16 --threads N]

--model: an sdxl-batch model directory whose model.json "defaults" fill in the
steps / cfg / width / height a batch leaves out (as sdxl-batch does).
Writes DIR/<task>-<i>.png, DIR/manifest.jsonl (task, index, file, sha256, seed,
seconds; the fields bench/gpu_runtime.sh compares) and DIR/report.json:
images, run_s (first image to last PNG written; the pipeline load is load_s),
images_per_hour over run_s, lora_s (restores and fuses), switches, peak memory.
Tasks this loop cannot run (img2img, the hires fix, a random seed) are refused
up front with the task's id and the field, before anything is generated.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
SIZE_KEYS = ("steps", "cfg", "width", "height")
UNSUPPORTED = ("init_image", "hires", "strength")


def split_tags(prompt: str) -> tuple[str, list[tuple[str, float]]]:
    """The prompt without its <lora:NAME[:WEIGHT]> tags, and the tags (as sdxl-batch's extract_lora_tags)."""
    text, tags, i = "", [], 0
    while True:
        open_ = prompt.find("<lora:", i)
        close = prompt.find(">", open_) if open_ >= 0 else -1
        if open_ < 0 or close < 0:
            break
        parts = prompt[open_ + 6:close].split(":")
        name, weight = parts[0].strip(), (parts[1].strip() if len(parts) > 1 else "")
        if not name:
            raise ValueError(f"prompt tag '{prompt[open_:close + 1]}' has no name")
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"prompt tag '{prompt[open_:close + 1]}': weight '{weight}' is not a number") from None
        text += prompt[i:open_]
        tags.append((name, w))
        i = close + 1
    return text + prompt[i:], tags


def plan(batch_path: Path, model_defaults: dict) -> list[dict]:
    """One dict per image, in file order, with everything the pipeline call needs; ValueError names the task and field."""
    batch = json.loads(batch_path.read_text())
    base = batch_path.parent
    registry = {name: (base / e["path"]) for name, e in batch.get("loras", {}).items()}
    defaults = batch.get("defaults", {})
    if not batch.get("tasks"):
        raise ValueError("no \"tasks\"")
    images = []
    for n, task in enumerate(batch["tasks"]):
        tid = task.get("id", f"#{n}")
        where = f"task '{tid}' (tasks[{n}])"
        if "prompt" not in task:
            raise ValueError(f"{where}: no 'prompt'")
        for key in UNSUPPORTED:
            if key in task or key in defaults:
                raise ValueError(f"{where}: '{key}' is not covered by this loop (txt2img only)")
        seed = task.get("seed", -1)
        if seed < 0:
            raise ValueError(f"{where}: 'seed' must be set (>= 0) so both tools draw the same noise")
        s = {k: task.get(k, defaults.get(k, model_defaults.get(k))) for k in SIZE_KEYS}
        missing = [k for k, v in s.items() if v is None]
        if missing:
            raise ValueError(f"{where}: no {', '.join(missing)} in the task, the batch defaults or --model's model.json")
        text, tags = split_tags(task["prompt"])
        loras = []
        for e in task.get("loras", defaults.get("loras", [])) + [{"name": t, "weight": w} for t, w in tags]:
            if "path" not in e and "name" not in e:
                raise ValueError(f"{where}: a LoRA entry has neither 'name' nor 'path'")
            if "path" in e:
                path = base / e["path"]
            elif e["name"] in registry:
                path = registry[e["name"]]
            else:
                raise ValueError(f"{where}: unknown LoRA '{e['name']}' (not in the batch file's \"loras\" registry)")
            if not path.is_file():
                raise ValueError(f"{where}: LoRA file '{path}' does not exist")
            loras.append((str(path), float(e.get("weight", 1.0))))
        for i in range(task.get("count", 1)):
            images.append({"task": tid, "index": i, "seed": seed + i, "prompt": text,
                           "negative": task.get("negative", defaults.get("negative", "")),
                           "sampler": task.get("sampler", defaults.get("sampler", "Euler")),
                           "schedule": task.get("schedule", defaults.get("schedule", "Automatic")),
                           "guidance_rescale": task.get("guidance_rescale", defaults.get("guidance_rescale", 0.0)),
                           "loras": loras, **s})
    return images


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--diffusers", required=True, help="a diffusers SDXL directory (export_sdxl.py --save-diffusers)")
    ap.add_argument("--batch", required=True, help="an sdxl-batch batch file")
    ap.add_argument("--out", required=True, help="output directory (PNGs, manifest.jsonl, report.json)")
    ap.add_argument("--model", help="sdxl-batch model directory: model.json defaults for what the batch leaves out")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    a = ap.parse_args()

    model_defaults = {}
    if a.model:
        model_defaults = json.loads((Path(a.model) / "model.json").read_text()).get("defaults", {})
    try:
        images = plan(Path(a.batch), model_defaults)
    except (ValueError, json.JSONDecodeError) as e:
        print(f"error: {a.batch}: {e}", file=sys.stderr)
        return 2
    except KeyError as e:  # a required field (tasks, a task's prompt, a LoRA entry's name or path)
        print(f"error: {a.batch}: missing field {e}", file=sys.stderr)
        return 2
    cuda = a.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        ap.error(f"--device {a.device}: no CUDA device visible to torch")
    if a.threads:
        torch.set_num_threads(a.threads)

    from diffusers import StableDiffusionXLPipeline

    from reference.a1111_schedulers import make_scheduler
    from reference.lora_reference import fuse_lora_files, restore_originals
    from reference.reference_sdxl import a1111_embeds

    t0 = time.perf_counter()
    pipe = StableDiffusionXLPipeline.from_pretrained(a.diffusers, dtype=DTYPES[a.dtype], local_files_only=True,
                                                     add_watermarker=False).to(a.device)
    pipe.set_progress_bar_config(disable=True)
    base_scheduler_config = pipe.scheduler.config
    load_s = time.perf_counter() - t0

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    originals: dict = {}
    current: list = []
    lora_s, switches = 0.0, 0
    rows = []
    t_run = time.perf_counter()
    with torch.inference_mode(), open(out / "manifest.jsonl", "w") as manifest:
        for im in images:
            t_img = time.perf_counter()
            if im["loras"] != current:
                t = time.perf_counter()
                restore_originals(originals)
                fuse_lora_files(pipe, im["loras"], originals=originals)
                if cuda:
                    torch.cuda.synchronize()
                lora_s += time.perf_counter() - t
                switches += 1
                current = im["loras"]
            pipe.scheduler = make_scheduler(base_scheduler_config, im["sampler"], im["schedule"])
            kwargs = a1111_embeds(pipe, im["prompt"], im["negative"], im["cfg"] > 1.0)
            img = pipe(**kwargs, num_inference_steps=im["steps"], guidance_scale=im["cfg"], width=im["width"],
                       height=im["height"], guidance_rescale=im["guidance_rescale"],
                       generator=[torch.Generator("cpu").manual_seed(im["seed"])]).images[0]
            name = f"{im['task']}-{im['index']}.png"
            img.save(out / name)
            sha = hashlib.sha256((out / name).read_bytes()).hexdigest()
            row = {"task": im["task"], "index": im["index"], "file": name, "sha256": sha, "seed": im["seed"],
                   "seconds": time.perf_counter() - t_img,
                   "loras": [[Path(p).stem, w] for p, w in im["loras"]]}
            manifest.write(json.dumps(row) + "\n")
            manifest.flush()
            rows.append(row)
    run_s = time.perf_counter() - t_run
    report = {"tool": "diffusers-loop", "torch": torch.__version__, "dtype": a.dtype,
              "gpu": torch.cuda.get_device_name() if cuda else "cpu", "images": len(rows), "load_s": load_s,
              "run_s": run_s, "images_per_hour": 3600.0 * len(rows) / run_s, "lora_s": lora_s, "lora_switches": switches,
              "s_per_image": [r["seconds"] for r in rows]}
    if cuda:
        report["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        report["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    (out / "report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "s_per_image"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
