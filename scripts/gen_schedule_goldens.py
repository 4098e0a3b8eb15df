#!/usr/bin/env python3
"""Golden values of diffusers' EulerDiscreteScheduler with SDXL's config.

For each step count: timesteps, sigmas (including the final 0) and
init_noise_sigma after set_timesteps(n), as float lists (the float64 repr of the
float32 values diffusers holds).

"plans": the same for every A1111 sampler x schedule that sdxl-batch accepts
(scripts/a1111_schedulers.py: Karras, exponential, SGM uniform sigmas of each
scheduler), for sampler_plan.cpp; schedulers without sigmas (DDIM, LCM) give
their timesteps only.

    python scripts/gen_schedule_goldens.py --out tests/fixtures/euler_sdxl_schedule.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import diffusers
import torch
from diffusers import EulerDiscreteScheduler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_sdxl import SDXL_SCHEDULER  # noqa: E402  (one source of SDXL's scheduler config)
from a1111_schedulers import VALID, make_scheduler  # noqa: E402


STEPS = [1, 2, 5, 8, 20, 25, 28, 30, 50, 100]


def as_floats(x) -> list[float]:
    t = torch.as_tensor(x).detach().cpu()
    return [float(v) for v in t.to(torch.float32).tolist()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    sched = EulerDiscreteScheduler(**SDXL_SCHEDULER)
    config = {k: v for k, v in dict(sched.config).items() if not k.startswith("_")}
    out = {
        "scheduler": "EulerDiscreteScheduler",
        "diffusers_version": diffusers.__version__,
        "torch_version": torch.__version__,
        "config": config,
        "schedules": [],
    }
    for n in STEPS:
        sched = EulerDiscreteScheduler(**SDXL_SCHEDULER)
        sched.set_timesteps(n, device="cpu")
        ins = sched.init_noise_sigma
        out["schedules"].append({
            "steps": n,
            "timesteps": as_floats(sched.timesteps),
            "sigmas": as_floats(sched.sigmas),
            "init_noise_sigma": float(torch.as_tensor(ins).to(torch.float32)),
        })
        assert len(out["schedules"][-1]["sigmas"]) == n + 1 and out["schedules"][-1]["sigmas"][-1] == 0.0
    out["plans"] = []
    for sampler, schedules in VALID.items():
        for schedule in schedules:
            for n in (1, 4, 7, 8, 20, 28, 50):
                sched = make_scheduler(EulerDiscreteScheduler(**SDXL_SCHEDULER).config, sampler, schedule)
                sched.set_timesteps(n, device="cpu")
                sigmas = getattr(sched, "sigmas", None)
                out["plans"].append({
                    "sampler": sampler, "schedule": schedule, "steps": n,
                    "timesteps": as_floats(sched.timesteps),
                    "sigmas": as_floats(sigmas) if sigmas is not None and sampler not in ("DDIM", "LCM") else [],
                    "init_noise_sigma": float(torch.as_tensor(sched.init_noise_sigma).to(torch.float32)),
                })
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {a.out}: {len(STEPS)} schedules ({', '.join(map(str, STEPS))} steps), {len(out['plans'])} sampler plans")


if __name__ == "__main__":
    main()
