// VAE decode as diffusers' SDXL pipeline does it: latents cast to the VAE's
// dtype, divided by the scaling factor, decoded, then (x / 2 + 0.5).clamp(0, 1),
// * 255, rounded half to even, to uint8 HWC RGB. Throws TaskError on NaN output.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "model/sdxl_model.h"

namespace sdxl {

// latents [1, 4, h, w] -> RGB8 bytes of size 8h * 8w * 3 (row-major).
std::vector<std::uint8_t> vae_decode_rgb8(SdxlModel& model, const torch::Tensor& latents);

}  // namespace sdxl
