// Euler sampler (diffusers EulerDiscreteScheduler, s_churn = 0), one step at a
// time so the caller can check timeouts and cancellation between steps.
// Ref: diffusers 0.42 scheduling_euler_discrete.py (scale_model_input, step);
// k-diffusion sample_euler.
#pragma once

#include <torch/types.h>

namespace sdxl {

// sample / sqrt(sigma^2 + 1), in the sample's dtype.
torch::Tensor euler_scale_model_input(const torch::Tensor& sample, double sigma);

// x_{i+1} = x_i + (x_i - x0) / sigma * (sigma_next - sigma) with x0 = x_i - sigma * eps,
// computed in float32 and returned in eps's dtype, as diffusers does.
torch::Tensor euler_step(const torch::Tensor& eps, const torch::Tensor& sample, double sigma, double sigma_next);

}  // namespace sdxl
