// SDXL text conditioning, as diffusers' StableDiffusionXLPipeline builds it —
// penultimate hidden states (or the layer clip skip picks) of both encoders
// concatenated (context), encoder 2's projected pooled output, zeros for an
// empty negative prompt — extended with A1111's prompt rules: emphasis weights
// multiply each encoder's hidden states, then the chunk is rescaled to its mean
// before weighting; long prompts are encoded in chunks of 75 tokens
// concatenated along the sequence (77·k tokens); the pooled output comes from
// the first chunk. Throws TaskError when an encoder fails.
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "model/sdxl_model.h"
#include "text/prompt_chunks.h"

namespace sdxl {

struct PromptEmbeds {
  torch::Tensor context;  // [1, 77·k, H1 + H2], model dtype, on the model's device
  torch::Tensor pooled;   // [1, P]
};

// Both tokenizers' chunks of one prompt, padded to the same count.
struct SdxlPromptTokens {
  std::vector<PromptChunk> te1, te2;
  std::vector<PromptWarning> warnings;
  size_t chunk_count() const { return te1.size(); }
};

SdxlPromptTokens tokenize_sdxl_prompt(const SdxlModel& model, const std::string& text);
// Appends empty chunks to both encoders' lists until there are `count`.
void pad_sdxl_prompt(const SdxlModel& model, SdxlPromptTokens& tokens, size_t count);

// clip_skip (GenerationParams::clip_skip): 0, 1 and 2 take the penultimate
// hidden states (forward); N >= 3 takes hidden_states[-N] of both encoders from
// their hidden_states() method, before the emphasis weights. Throws UsageError
// when N exceeds the encoders' hidden states, TaskError when the model was
// exported without hidden_states().
PromptEmbeds encode_prompt_tokens(SdxlModel& model, const SdxlPromptTokens& tokens, int clip_skip = 0);
// Zeros shaped like `like` (SDXL's empty negative prompt).
PromptEmbeds zero_embeds(const PromptEmbeds& like);
// time_ids = (original h, w, crop top, left, target h, w), crop (0, 0): [1, 6].
torch::Tensor sdxl_time_ids(int width, int height, torch::Dtype dtype, const torch::Device& device);

}  // namespace sdxl
