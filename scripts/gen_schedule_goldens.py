#!/usr/bin/env python3
"""Golden values of diffusers' EulerDiscreteScheduler with SDXL's config.

For each step count: timesteps, sigmas (including the final 0) and
init_noise_sigma after set_timesteps(n), as float lists (the float64 repr of the
float32 values diffusers holds).

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
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {a.out}: {len(STEPS)} schedules ({', '.join(map(str, STEPS))} steps)")


if __name__ == "__main__":
    main()
