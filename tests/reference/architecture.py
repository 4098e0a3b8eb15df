"""The SDXL architecture as scripts/export_sdxl.py exports it (its diffusers /
transformers configs and the scheduler config), for the references whose files
must fit what it exports: the test LoRAs' shapes, the schedule goldens' config.

The product is asked as a program (`export_sdxl.py --print-config ARCH`, JSON),
as the tests run it to make the tiny model; nothing under scripts/ is imported.
Tuples in the configs come back as lists, which diffusers and transformers take.
"""
from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

EXPORT_SDXL = Path(__file__).resolve().parents[2] / "scripts" / "export_sdxl.py"


@functools.cache
def sdxl_configs(arch: str) -> dict:
    """arch "tiny" (the CI model), "tiny-aoti" (the AOTI test's) or "full" (SDXL base 1.0) ->
    {"scheduler", "text_encoder", "text_encoder_2", "unet", "vae"}: keyword arguments of
    EulerDiscreteScheduler, CLIPTextConfig (both encoders), UNet2DConditionModel and AutoencoderKL."""
    r = subprocess.run([sys.executable, str(EXPORT_SDXL), "--print-config", arch], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{EXPORT_SDXL.name} --print-config {arch} failed ({r.returncode}):\n{r.stderr}")
    return json.loads(r.stdout)
