// A task against what the model can run: its sizes (the image's and, with the hires fix, its second
// pass's) and, on an inpainting UNet, its mask. The same checks for `validate`, `run`
// (check/batch_check.h) and the generator. torch-free.
#pragma once

#include <string>

#include "batch/generation_params.h"
#include "model/model_config.h"

namespace sdxl {

// check_generation_size for the image and, with the hires fix, for its second
// pass (the message then names the hires size). Throws UsageError. Returns the
// unchecked_size_note of the first size outside the checked range ("" if none).
std::string check_task_size(const ModelConfig& model, const GenerationParams& p);

// Why a task without a mask cannot run on `model`, a 9-channel inpainting UNet
// (its input is the latents, a mask and the masked image's latents, as in
// diffusers' StableDiffusionXLInpaintPipeline, which needs an image and a mask).
std::string unmasked_task_on_inpainting_unet(const ModelConfig& model);

// Why a task's regions cannot run on `model` ("" when they can, or it has none): an export without the
// regional methods (unet.regions), more regions than it allows, the FP8 UNet (no regional methods),
// an IP-Adapter on an export without forward_regional_ip.
std::string regions_problem(const ModelConfig& model, const GenerationParams& p);


}  // namespace sdxl
