// Initial noise, drawn on the CPU with torch's generator seeded per image, so an
// image never depends on its batch, GPU or run (and equals diffusers with a CPU
// torch.Generator). Thread-safe: each call owns its generator.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace sdxl {

// torch.randn((1, channels, height, width), generator=Generator("cpu").manual_seed(seed), dtype=dtype)
torch::Tensor initial_noise(std::int64_t seed, int64_t channels, int64_t height, int64_t width, torch::Dtype dtype);

}  // namespace sdxl
