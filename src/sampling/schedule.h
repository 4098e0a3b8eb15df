// Sigma/timestep schedules of the diffusers schedulers sdxl-batch follows.
// Pure functions of the scheduler config and the step count; torch-free.
#pragma once

#include <string>
#include <vector>

#include "model/model_config.h"

namespace sdxl {

struct Schedule {
  std::vector<double> timesteps;  // model timesteps fed to the UNet, one per step
  std::vector<double> sigmas;     // one per step plus the final 0
  double init_noise_sigma = 1.0;  // initial noise is scaled by this
};

// Training noise levels sqrt((1 - alphas_cumprod) / alphas_cumprod), in float32
// arithmetic as diffusers computes them (num_train_timesteps entries).
std::vector<float> train_sigmas(const SchedulerConfig& cfg);

// alphas_cumprod = cumprod(1 - betas) in float32 (num_train_timesteps entries); with
// cfg.rescale_betas_zero_snr the betas are rescaled first and the last entry is 0, as
// DDIMScheduler, LCMScheduler and TCDScheduler keep it.
std::vector<float> train_alphas_cumprod(const SchedulerConfig& cfg);

// diffusers' rescale_zero_terminal_snr (Lin et al. 2023, algorithm 1) in float32: betas
// whose alphas_cumprod ends at 0 and keeps its first value.
std::vector<float> rescale_zero_terminal_snr(const std::vector<float>& betas);

// numpy helpers with numpy's float64 arithmetic, for mirroring set_timesteps.
// np.linspace(start, stop, num) (endpoint included).
std::vector<double> np_linspace(double start, double stop, int num);
// np.arange(start, stop, step) for a negative step (length ceil((stop-start)/step)).
std::vector<double> np_arange_down(double start, double stop, double step);

// The three diffusers timestep spacings of n values (descending, float64 before
// the caller's cast). `extra` is 1 for the multistep solvers, which space n + 1
// points and drop the last (DPMSolverMultistep / UniPC), 0 for Euler-style ones.
std::vector<double> spaced_timesteps(const SchedulerConfig& cfg, const std::string& spacing, int n, int extra);

// np.interp(t, arange(N), table) with numpy's clamping at both ends.
double interp_table(const std::vector<float>& table, double t);

// SchedulerMixin._convert_to_karras (rho = 7) and _convert_to_exponential:
// n sigmas from sigma_max down to sigma_min, float64.
std::vector<double> karras_sigmas(double sigma_min, double sigma_max, int n);
std::vector<double> exponential_sigmas(double sigma_min, double sigma_max, int n);

// EulerDiscreteScheduler._sigma_to_t: the fractional training timestep of a sigma,
// by linear interpolation in log-sigma (log_sigmas are float32 as in diffusers).
double sigma_to_t(double sigma, const std::vector<float>& log_sigmas);
std::vector<float> log_of(const std::vector<float>& v);

// EulerDiscreteScheduler.set_timesteps(steps) with "linear" interpolation,
// no Karras/exponential sigmas (diffusers 0.42, scheduling_euler_discrete.py).
// Throws UsageError when steps < 1 or > num_train_timesteps.
Schedule euler_discrete_schedule(const SchedulerConfig& cfg, int steps);

}  // namespace sdxl
