#include "sampling/noise.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/script.h>

namespace sdxl {

torch::Tensor initial_noise(std::int64_t seed, int64_t channels, int64_t height, int64_t width, torch::Dtype dtype) {
  // Same draw as diffusers' randn_tensor with a CPU generator: randn in the
  // latents' dtype on the CPU (fp16 draws differ from fp32 ones cast down).
  at::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
  return torch::randn({1, channels, height, width}, gen, torch::TensorOptions().dtype(dtype));
}

}  // namespace sdxl
