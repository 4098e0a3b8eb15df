// The weights regions (attention couple, docs/story-tools.md#regions) give the UNet: for each
// attention grid of the model (model.json unet.regions.downscales), how much each of a row's prompts
// counts in each cell, and how much each reference picture of the row acts there. The rules are the
// issue's, and the parity reference's (tests/reference/regions_reference.py):
// - a box covers a cell when the cell's centre is inside it (x0 <= cx < x1, y0 <= cy < y1, fractions
//   of the panel); a mask PNG's grey levels / 255 are area-averaged onto the grid
//   (F.interpolate(mode="area"));
// - raw weights: weight_i * m_i for region i, 1 - (1 - region_base) * max_i m_i for the task's prompt;
//   normalised to sum to 1 in each cell;
// - a reference picture's mask is diffusers' ip_adapter_masks: the region at the panel's pixel size
//   (box: pixel centres inside it; PNG: grey, PIL Lanczos to the panel, binarised at 0.5), then
//   IPAdapterMaskProcessor.downsample's bicubic resize to each attention layer's token count.
// The grid of downscale d for a latent of h x w is residual_size(h, d) x residual_size(w, d) (stride-2
// convolutions: each halving rounds up), its cells in the row-major order of the attention's tokens.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "batch/generation_params.h"

namespace sdxl {

// A latent side of n after log2(downscale) stride-2 convolutions (kernel 3, padding 1).
std::int64_t attention_grid_side(std::int64_t n, int downscale);

// Each prompt's weight in each cell, per downscale: [prompts, n_d] float32 on the CPU, prompts = 1 +
// regions padded with zero rows to `prompts` (at least 1 + p.regions.size()). Without regions the task's
// prompt weighs 1 everywhere. Throws UsageError when a mask PNG cannot be read.
std::vector<torch::Tensor> region_prompt_weights(const GenerationParams& p, const std::vector<int>& downscales,
                                                 std::int64_t latent_h, std::int64_t latent_w, std::int64_t prompts);

// A reference picture's mask at the panel's pixel size (width x height), 0 or 1, [height, width]
// float32: the whole panel when `region` is null.
torch::Tensor reference_pixel_mask(const RegionUse* region, int width, int height);

// IPAdapterMaskProcessor.downsample of a [height, width] pixel mask to `tokens` queries: bicubic to
// mask_h x mask_w (mask_h from the token count and the mask's aspect ratio, as diffusers computes it),
// flattened, zero-padded or cut to `tokens`. [tokens] float32.
torch::Tensor downsample_reference_mask(const torch::Tensor& pixel_mask, std::int64_t tokens);

}  // namespace sdxl
