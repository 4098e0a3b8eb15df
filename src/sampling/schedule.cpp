#include "sampling/schedule.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace sdxl {

// sigma = sqrt((1 - ac) / ac) in float32, from train_alphas_cumprod below; with zero-SNR the
// sigma schedulers (Euler, DPM-Solver, UniPC) set alphas_cumprod[-1] = 2**-24 so that the
// first sigma is finite.
std::vector<float> train_sigmas(const SchedulerConfig& cfg) {
  std::vector<float> ac = train_alphas_cumprod(cfg);
  if (cfg.rescale_betas_zero_snr) ac.back() = std::ldexp(1.0f, -24);
  std::vector<float> sigmas(ac.size());
  for (size_t i = 0; i < ac.size(); ++i) sigmas[i] = std::sqrt((1.0f - ac[i]) / ac[i]);
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


std::vector<float> rescale_zero_terminal_snr(const std::vector<float>& betas) {
  const size_t n = betas.size();
  std::vector<float> bar_sqrt(n);
  double a = 1.0;  // torch.cumprod on the CPU accumulates float32 in double
  for (size_t i = 0; i < n; ++i) {
    a *= static_cast<double>(1.0f - betas[i]);
    bar_sqrt[i] = std::sqrt(static_cast<float>(a));
  }
  const float first = bar_sqrt.front(), last = bar_sqrt.back();
  const float scale = first / (first - last);
  std::vector<float> bar(n);
  for (size_t i = 0; i < n; ++i) {
    const float v = (bar_sqrt[i] - last) * scale;
    bar[i] = v * v;
  }
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = 1.0f - (i == 0 ? bar[0] : bar[i] / bar[i - 1]);
  return out;
}

// Mirrors diffusers' float32 arithmetic: betas = linspace(sqrt(b0), sqrt(b1), N)^2
// (torch.linspace fills the second half backwards from the end), alphas_cumprod
// = cumprod(1 - betas).
std::vector<float> train_alphas_cumprod(const SchedulerConfig& cfg) {
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
  std::vector<float> ac(static_cast<size_t>(n));
  if (cfg.rescale_betas_zero_snr) {
    // torch.cumprod's double accumulation (the path without zero-SNR below keeps the float32
    // one that its goldens and images were made with).
    betas = rescale_zero_terminal_snr(betas);
    double acc = 1.0;
    for (size_t i = 0; i < ac.size(); ++i) {
      acc *= static_cast<double>(1.0f - betas[i]);
      ac[i] = static_cast<float>(acc);
    }
    return ac;
  }
  float a = 1.0f;
  for (size_t i = 0; i < ac.size(); ++i) {
    a *= 1.0f - betas[i];
    ac[i] = a;
  }
  return ac;
}

std::vector<double> np_linspace(double start, double stop, int num) {
  std::vector<double> out(static_cast<size_t>(std::max(num, 0)));
  if (num == 1) {
    out[0] = start;
    return out;
  }
  const double step = (stop - start) / (num - 1);
  for (int i = 0; i < num; ++i) out[static_cast<size_t>(i)] = start + i * step;
  if (num > 1) out.back() = stop;
  return out;
}

std::vector<double> np_arange_down(double start, double stop, double step) {
  const auto len = static_cast<long>(std::ceil((stop - start) / step));
  std::vector<double> out;
  for (long i = 0; i < len; ++i) out.push_back(start + static_cast<double>(i) * step);
  return out;
}

std::vector<double> spaced_timesteps(const SchedulerConfig& cfg, const std::string& spacing, int n, int extra) {
  const int train = cfg.num_train_timesteps;
  std::vector<double> ts;
  if (spacing == "linspace") {
    if (extra == 0) {
      // np.linspace(0, N-1, n, dtype=float32)[::-1]
      for (double v : np_linspace(0, train - 1, n)) ts.push_back(static_cast<double>(static_cast<float>(v)));
    } else {
      // np.linspace(0, N-1, n+1).round()[::-1][:-1]
      for (double v : np_linspace(0, train - 1, n + 1)) ts.push_back(std::nearbyint(v));
      ts.erase(ts.begin());
    }
    std::reverse(ts.begin(), ts.end());
  } else if (spacing == "leading") {
    const int ratio = train / (n + extra);
    for (int i = n - 1 + extra; i >= extra; --i) ts.push_back(static_cast<double>(i * ratio + cfg.steps_offset));
  } else if (spacing == "trailing") {
    for (double v : np_arange_down(train, 0, -static_cast<double>(train) / n)) ts.push_back(std::nearbyint(v) - 1.0);
  } else {
    throw UsageError("unknown timestep_spacing '" + spacing + "' (valid: leading, trailing, linspace)");
  }
  return ts;
}

double interp_table(const std::vector<float>& table, double t) {
  const double n = static_cast<double>(table.size());
  if (t <= 0) return table.front();
  if (t >= n - 1) return table.back();
  const auto lo = static_cast<size_t>(std::floor(t));
  const double frac = t - static_cast<double>(lo);
  return static_cast<double>(table[lo]) + frac * (static_cast<double>(table[lo + 1]) - static_cast<double>(table[lo]));
}

std::vector<double> karras_sigmas(double sigma_min, double sigma_max, int n) {
  constexpr double kRho = 7.0;
  const double min_inv = std::pow(sigma_min, 1 / kRho), max_inv = std::pow(sigma_max, 1 / kRho);
  std::vector<double> out;
  for (double r : np_linspace(0, 1, n)) out.push_back(std::pow(max_inv + r * (min_inv - max_inv), kRho));
  return out;
}

std::vector<double> exponential_sigmas(double sigma_min, double sigma_max, int n) {
  std::vector<double> out;
  for (double v : np_linspace(std::log(sigma_max), std::log(sigma_min), n)) out.push_back(std::exp(v));
  return out;
}

std::vector<float> log_of(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = std::log(v[i]);
  return out;
}

double sigma_to_t(double sigma, const std::vector<float>& log_sigmas) {
  const double log_sigma = std::log(std::max(sigma, 1e-10));
  // low_idx = last index whose log_sigma_i <= log_sigma (cumsum(dists >= 0).argmax), clipped to N-2.
  const size_t n = log_sigmas.size();
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) count += (log_sigma - static_cast<double>(log_sigmas[i]) >= 0) ? 1 : 0;
  // argmax of the cumsum is the first index reaching its maximum: count - 1 (0 when none).
  size_t low = count == 0 ? 0 : count - 1;
  low = std::min(low, n - 2);
  const double lo = log_sigmas[low], hi = log_sigmas[low + 1];
  double w = (lo - log_sigma) / (lo - hi);
  w = std::clamp(w, 0.0, 1.0);
  return (1 - w) * static_cast<double>(low) + w * static_cast<double>(low + 1);
}

}  // namespace sdxl
