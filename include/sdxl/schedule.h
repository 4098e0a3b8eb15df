// Sigma/timestep schedules of the diffusers schedulers sdxl-batch follows.
// Pure functions of the scheduler config and the step count; torch-free.
#pragma once

#include <vector>

#include "sdxl/model_config.h"

namespace sdxl {

struct Schedule {
  std::vector<double> timesteps;  // model timesteps fed to the UNet, one per step
  std::vector<double> sigmas;     // one per step plus the final 0
  double init_noise_sigma = 1.0;  // initial noise is scaled by this
};

// Training noise levels sqrt((1 - alphas_cumprod) / alphas_cumprod), in float32
// arithmetic as diffusers computes them (num_train_timesteps entries).
std::vector<float> train_sigmas(const SchedulerConfig& cfg);

// EulerDiscreteScheduler.set_timesteps(steps) with "linear" interpolation,
// no Karras/exponential sigmas (diffusers 0.42, scheduling_euler_discrete.py).
// Throws UsageError when steps < 1 or > num_train_timesteps.
Schedule euler_discrete_schedule(const SchedulerConfig& cfg, int steps);

}  // namespace sdxl
