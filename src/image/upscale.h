// Hires fix upscaling (A1111's upscalers that can be reproduced exactly):
// latent space through torch.nn.functional.interpolate, pixel space through a
// nearest-neighbour resize of the 8-bit image that equals PIL's Image.NEAREST
// (image/resize.h).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sdxl {

bool is_latent_upscaler(const std::string& canonical_name);

// interpolate(latents, size=(h, w), mode, antialias) as A1111's latent upscale
// modes: "Latent" bilinear, "(antialiased)", "(bicubic)", "(bicubic antialiased)",
// "(nearest)", "(nearest-exact)"; align_corners false.
torch::Tensor upscale_latents(const torch::Tensor& latents, int64_t out_h, int64_t out_w, const std::string& upscaler);

}  // namespace sdxl
