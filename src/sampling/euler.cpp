#include "sampling/euler.h"

#include <torch/script.h>

#include <cmath>

namespace sdxl {

torch::Tensor euler_scale_model_input(const torch::Tensor& sample, double sigma) {
  const float s = static_cast<float>(sigma);
  return sample / static_cast<double>(std::sqrt(s * s + 1.0f));
}

torch::Tensor euler_step(const torch::Tensor& eps, const torch::Tensor& sample, double sigma, double sigma_next) {
  const float s = static_cast<float>(sigma);
  const float dt = static_cast<float>(sigma_next) - s;
  const torch::Tensor x = sample.to(torch::kFloat32);
  // sigma * eps stays in eps's dtype (a 0-d float32 tensor does not promote it in diffusers).
  const torch::Tensor denoised = x - eps * static_cast<double>(s);
  const torch::Tensor derivative = (x - denoised) / static_cast<double>(s);
  return (x + derivative * static_cast<double>(dt)).to(eps.scalar_type());
}

}  // namespace sdxl
