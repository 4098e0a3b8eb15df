"""A1111 sampler / schedule names -> the diffusers scheduler that diffusers'
documentation (api/schedulers/overview) maps them to. One source for the parity
reference (reference_sdxl.py) and the schedule goldens (gen_schedule_goldens.py).

SDXL's published scheduler config also has clip_sample=False and
set_alpha_to_one=False (DDIM, LCM); the tiny fixture's config does not list
them, so they are set here as the real model has them.
"""
from __future__ import annotations

from diffusers import (DDIMScheduler, DPMSolverMultistepScheduler, DPMSolverSinglestepScheduler,
                       EulerAncestralDiscreteScheduler, EulerDiscreteScheduler, HeunDiscreteScheduler, LCMScheduler,
                       TCDScheduler, UniPCMultistepScheduler)

SAMPLERS = {
    "Euler": (EulerDiscreteScheduler, {}),
    "Euler a": (EulerAncestralDiscreteScheduler, {}),
    "Heun": (HeunDiscreteScheduler, {}),
    "DPM++ 2M": (DPMSolverMultistepScheduler, {}),
    "DPM++ 2M SDE": (DPMSolverMultistepScheduler, {"algorithm_type": "sde-dpmsolver++"}),
    "DPM++ SDE": (DPMSolverSinglestepScheduler, {}),
    "DDIM": (DDIMScheduler, {}),
    "UniPC": (UniPCMultistepScheduler, {}),
    "LCM": (LCMScheduler, {}),
    "TCD": (TCDScheduler, {}),
}

SCHEDULES = {
    "Automatic": {},
    "Karras": {"use_karras_sigmas": True},
    "Exponential": {"timestep_spacing": "linspace", "use_exponential_sigmas": True},
    "SGM Uniform": {"timestep_spacing": "trailing"},
}

# What sdxl-batch accepts (sampler_plan.cpp); the rest is an error there. TCD (Automatic only) is
# left out: its eta is a task key, which parity_vpred.py compares.
VALID = {
    "Euler": ["Automatic", "Karras", "Exponential", "SGM Uniform"],
    "Euler a": ["Automatic", "SGM Uniform"],
    "Heun": ["Automatic", "Karras", "Exponential", "SGM Uniform"],
    "DPM++ 2M": ["Automatic", "Karras", "Exponential", "SGM Uniform"],
    "DPM++ 2M SDE": ["Automatic", "Karras", "Exponential", "SGM Uniform"],
    "DPM++ SDE": ["Automatic", "Karras", "Exponential"],
    "DDIM": ["Automatic", "SGM Uniform"],
    "UniPC": ["Automatic", "Karras", "Exponential", "SGM Uniform"],
    "LCM": ["Automatic"],
}


def make_scheduler(base_config: dict, sampler: str, schedule: str):
    cls, extra = SAMPLERS[sampler]
    kwargs = dict(extra)
    kwargs.update(SCHEDULES[schedule])
    kwargs.update(clip_sample=False, set_alpha_to_one=False)
    config = {k: v for k, v in dict(base_config).items() if not k.startswith("_")}
    config.update(kwargs)
    return cls.from_config(config)
