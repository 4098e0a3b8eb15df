#include "sdxl/schedule.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "sdxl/error.h"

namespace sdxl {

// Mirrors diffusers' float32 arithmetic: betas = linspace(sqrt(b0), sqrt(b1), N)^2
// (torch.linspace fills the second half backwards from the end), alphas_cumprod
// = cumprod(1 - betas), sigma = sqrt((1 - ac) / ac).
std::vector<float> train_sigmas(const SchedulerConfig& cfg) {
  const int n = cfg.num_train_timesteps;
  std::vector<float> betas(static_cast<size_t>(n));
  auto linspace = [n](float start, float end, int i) -> float {
    if (n == 1) return start;
    const float step = (end - start) / static_cast<float>(n - 1);
    return i < n / 2 ? start + step * static_cast<float>(i) : end - step * static_cast<float>(n - i - 1);
  };
  for (int i = 0; i < n; ++i) {
    if (cfg.beta_schedule == "scaled_linear") {
      const float b = linspace(std::sqrt(static_cast<float>(cfg.beta_start)), std::sqrt(static_cast<float>(cfg.beta_end)), i);
      betas[static_cast<size_t>(i)] = b * b;
    } else {
      betas[static_cast<size_t>(i)] = linspace(static_cast<float>(cfg.beta_start), static_cast<float>(cfg.beta_end), i);
    }
  }
  std::vector<float> sigmas(static_cast<size_t>(n));
  float ac = 1.0f;
  for (size_t i = 0; i < sigmas.size(); ++i) {
    ac *= 1.0f - betas[i];
    sigmas[i] = std::sqrt((1.0f - ac) / ac);
  }
  return sigmas;
}

// Ref: diffusers 0.42 EulerDiscreteScheduler.set_timesteps (timestep_spacing,
// steps_offset, interpolation_type="linear") and init_noise_sigma.
Schedule euler_discrete_schedule(const SchedulerConfig& cfg, int steps) {
  const int n = cfg.num_train_timesteps;
  if (steps < 1 || steps > n)
    throw UsageError("steps " + std::to_string(steps) + " must be in 1.." + std::to_string(n));
  std::vector<double> ts(static_cast<size_t>(steps));
  if (cfg.timestep_spacing == "leading") {
    const int ratio = n / steps;
    for (int i = 0; i < steps; ++i) ts[static_cast<size_t>(i)] = static_cast<double>((steps - 1 - i) * ratio + cfg.steps_offset);
  } else if (cfg.timestep_spacing == "trailing") {
    const double ratio = static_cast<double>(n) / steps;
    for (int i = 0; i < steps; ++i) ts[static_cast<size_t>(i)] = std::nearbyint(n - i * ratio) - 1.0;
  } else if (cfg.timestep_spacing == "linspace") {
    for (int i = 0; i < steps; ++i) {
      const double v = steps == 1 ? 0.0 : (n - 1) * static_cast<double>(i) / (steps - 1);
      ts[static_cast<size_t>(steps - 1 - i)] = static_cast<double>(static_cast<float>(v));
    }
  } else {
    throw UsageError("unknown timestep_spacing '" + cfg.timestep_spacing + "'");
  }

  const std::vector<float> train = train_sigmas(cfg);
  Schedule s;
  s.timesteps = ts;
  s.sigmas.reserve(ts.size() + 1);
  for (double t : ts) {
    // np.interp(t, arange(n), sigmas), clamped at both ends like numpy.
    double v;
    if (t <= 0) {
      v = train.front();
    } else if (t >= n - 1) {
      v = train.back();
    } else {
      const auto lo = static_cast<size_t>(std::floor(t));
      const double frac = t - static_cast<double>(lo);
      v = static_cast<double>(train[lo]) + frac * (static_cast<double>(train[lo + 1]) - static_cast<double>(train[lo]));
    }
    s.sigmas.push_back(static_cast<double>(static_cast<float>(v)));
  }
  s.sigmas.push_back(0.0);
  const float max_sigma = static_cast<float>(*std::max_element(s.sigmas.begin(), s.sigmas.end()));
  s.init_noise_sigma = (cfg.timestep_spacing == "linspace" || cfg.timestep_spacing == "trailing")
                           ? max_sigma
                           : static_cast<double>(std::sqrt(max_sigma * max_sigma + 1.0f));
  return s;
}

}  // namespace sdxl
