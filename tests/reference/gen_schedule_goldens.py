"""Golden values of diffusers' EulerDiscreteScheduler with SDXL's config.

For each step count: timesteps, sigmas (including the final 0) and
init_noise_sigma after set_timesteps(n), as float lists (the float64 repr of the
float32 values diffusers holds).

"plans": the same for every A1111 sampler x schedule that sdxl-batch accepts
(reference.a1111_schedulers: Karras, exponential, SGM uniform sigmas of each
scheduler), for sampler_plan.cpp; schedulers without sigmas (DDIM, LCM) give
their timesteps only.

SDXL's scheduler config is the one scripts/export_sdxl.py exports (reference.architecture).

    PYTHONPATH=tests python -m reference.gen_schedule_goldens --out schedule.json
"""
from __future__ import annotations

import argparse
import json

import diffusers
import torch
from diffusers import EulerDiscreteScheduler

from reference.a1111_schedulers import VALID, make_scheduler
from reference.architecture import sdxl_configs


STEPS = [1, 2, 5, 8, 20, 25, 28, 30, 50, 100]


def as_floats(x) -> list[float]:
    t = torch.as_tensor(x).detach().cpu()
    return [float(v) for v in t.to(torch.float32).tolist()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    sdxl_scheduler = sdxl_configs("tiny")["scheduler"]  # the same for "full"
    sched = EulerDiscreteScheduler(**sdxl_scheduler)
    config = {k: v for k, v in dict(sched.config).items() if not k.startswith("_")}
    out = {
        "scheduler": "EulerDiscreteScheduler",
        "diffusers_version": diffusers.__version__,
        "torch_version": torch.__version__,
        "config": config,
        "schedules": [],
    }
    for n in STEPS:
        sched = EulerDiscreteScheduler(**sdxl_scheduler)
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
                sched = make_scheduler(EulerDiscreteScheduler(**sdxl_scheduler).config, sampler, schedule)
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
