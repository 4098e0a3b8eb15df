// SDXL text conditioning as diffusers' StableDiffusionXLPipeline.encode_prompt
// builds it: penultimate hidden states of both encoders concatenated (context),
// encoder 2's projected pooled output, and zeros for an empty negative prompt
// (force_zeros_for_empty_prompt). Throws TaskError when an encoder fails.
#pragma once

#include <torch/types.h>

#include <string>

#include "model/sdxl_model.h"

namespace sdxl {

struct PromptEmbeds {
  torch::Tensor context;  // [1, 77, H1 + H2], model dtype, on the model's device
  torch::Tensor pooled;   // [1, P]
};

PromptEmbeds encode_prompt(SdxlModel& model, const std::string& text);
// Zeros shaped like `like` (SDXL's empty negative prompt).
PromptEmbeds zero_embeds(const PromptEmbeds& like);
// time_ids = (original h, w, crop top, left, target h, w), crop (0, 0): [1, 6].
torch::Tensor sdxl_time_ids(int width, int height, torch::Dtype dtype, const torch::Device& device);

}  // namespace sdxl
