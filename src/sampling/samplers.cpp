#include "sampling/samplers.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/script.h>

#include <cmath>
#include <optional>
#include <utility>

#include "core/error.h"

namespace sdxl {
namespace {

// diffusers does the per-step scalar math on 0-d float32 tensors; float here.
// A 0-d tensor (or a C++ scalar) does not promote a latent tensor's dtype.
struct AlphaSigma {
  float alpha, sigma, lambda;
};

// _sigma_to_alpha_sigma_t + lambda = log(alpha) - log(sigma) (DPM-Solver, UniPC).
AlphaSigma alpha_sigma(double sigma_d) {
  const float s = static_cast<float>(sigma_d);
  const float a = 1.0f / std::sqrt(s * s + 1.0f);
  const float st = s * a;
  return {a, st, std::log(a) - std::log(st)};
}

double d(float v) { return static_cast<double>(v); }

class Progress {
 public:
  Progress(const SamplerPlan& plan, const StepHook& hook, const StepBlend& blend)
      : hook_(hook), blend_(blend), total_(plan_model_calls(plan)), calls_(plan.timesteps.size()) {}
  // After the step of model call `call`: the blend (the last call's too), then the hook.
  torch::Tensor done(torch::Tensor x, size_t call) {
    if (blend_) x = blend_(x, call);
    ++done_;
    if (hook_) hook_(done_, total_);
    return x;
  }

 private:
  const StepHook& hook_;
  const StepBlend& blend_;
  int total_;
  size_t calls_;
  int done_ = 0;
};

torch::Tensor scale_by_sigma(const torch::Tensor& x, double sigma) {
  const float s = static_cast<float>(sigma);
  return x / d(std::sqrt(s * s + 1.0f));
}

// The denoised sample of EulerDiscreteScheduler.step (Euler a's and Heun's alike) from the model
// output `out` at `sigma`: epsilon x - sigma * out; v_prediction
// out * (-sigma / sqrt(sigma^2 + 1)) + x / (sigma^2 + 1).
torch::Tensor euler_x0(const SamplerPlan& p, const torch::Tensor& x, const torch::Tensor& out, float sigma) {
  if (!p.v_prediction) return x - out * d(sigma);
  const float s2 = sigma * sigma + 1.0f;
  return out * d(-sigma / std::sqrt(s2)) + x / d(s2);
}

// Ref: diffusers 0.42 scheduling_euler_discrete.py EulerDiscreteScheduler.step
// (s_churn = 0: no noise), scale_model_input; k-diffusion sample_euler.
torch::Tensor sample_euler(const SamplerPlan& p, torch::Tensor x, const ModelFn& model, Progress& prog) {
  for (size_t i = static_cast<size_t>(p.begin); i < p.timesteps.size(); ++i) {
    const float sigma = static_cast<float>(p.sigmas[i]);
    const torch::Tensor eps = model(scale_by_sigma(x, sigma), p.timesteps[i]);
    const torch::Tensor xf = x.to(torch::kFloat32);
    // sigma * eps stays in eps's dtype, as a 0-d float32 tensor leaves it.
    const torch::Tensor x0 = euler_x0(p, xf, eps, sigma);
    const torch::Tensor derivative = (xf - x0) / d(sigma);
    const float dt = static_cast<float>(p.sigmas[i + 1]) - sigma;
    x = (xf + derivative * d(dt)).to(eps.scalar_type());
    x = prog.done(std::move(x), i);
  }
  return x;
}

// Ref: diffusers 0.42 scheduling_euler_ancestral_discrete.py
// EulerAncestralDiscreteScheduler.step; k-diffusion sample_euler_ancestral (eta 1).
// Noise: randn_tensor(model_output.shape, dtype=model_output.dtype, generator) every step.
torch::Tensor sample_euler_ancestral(const SamplerPlan& p, torch::Tensor x, const ModelFn& model,
                                     std::vector<at::Generator>& gens, Progress& prog) {
  for (size_t i = static_cast<size_t>(p.begin); i < p.timesteps.size(); ++i) {
    const float sigma = static_cast<float>(p.sigmas[i]);
    const float sigma_to = static_cast<float>(p.sigmas[i + 1]);
    const torch::Tensor eps = model(scale_by_sigma(x, sigma), p.timesteps[i]);
    const torch::Tensor xf = x.to(torch::kFloat32);
    const torch::Tensor x0 = euler_x0(p, xf, eps, sigma);
    const float sigma_up = std::sqrt(sigma_to * sigma_to * (sigma * sigma - sigma_to * sigma_to) / (sigma * sigma));
    const float sigma_down = std::sqrt(sigma_to * sigma_to - sigma_up * sigma_up);
    const torch::Tensor derivative = (xf - x0) / d(sigma);
    torch::Tensor prev = xf + derivative * d(sigma_down - sigma);
    const torch::Tensor noise = randn_per_image(gens, eps.sizes(), eps.scalar_type(), eps.device());
    prev = prev + noise * d(sigma_up);
    x = prev.to(eps.scalar_type());
    x = prog.done(std::move(x), i);
  }
  return x;
}

// Ref: diffusers 0.42 scheduling_heun_discrete.py HeunDiscreteScheduler.step
// (first/second order states over the repeated sigmas); k-diffusion sample_heun.
torch::Tensor sample_heun(const SamplerPlan& p, torch::Tensor x, const ModelFn& model, Progress& prog) {
  std::optional<torch::Tensor> prev_derivative, first_sample;
  float dt = 0;
  for (size_t i = static_cast<size_t>(p.begin); i < p.timesteps.size(); ++i) {
    const torch::Tensor eps = model(scale_by_sigma(x, p.sigmas[i]), p.timesteps[i]);
    if (!prev_derivative) {
      const float sigma = static_cast<float>(p.sigmas[i]);
      const torch::Tensor x0 = euler_x0(p, x, eps, sigma);
      const torch::Tensor derivative = (x - x0) / d(sigma);
      dt = static_cast<float>(p.sigmas[i + 1]) - sigma;
      prev_derivative = derivative;
      first_sample = x;
      x = x + derivative * d(dt);
    } else {
      const float sigma_next = static_cast<float>(p.sigmas[i]);
      const torch::Tensor x0 = euler_x0(p, x, eps, sigma_next);
      torch::Tensor derivative = (x - x0) / d(sigma_next);
      derivative = (*prev_derivative + derivative) / 2;
      x = *first_sample + derivative * d(dt);
      prev_derivative.reset();
      first_sample.reset();
    }
    x = prog.done(std::move(x), i);
  }
  return x;
}

// DPM-Solver++ (and UniPC predict_x0) data prediction, convert_model_output: epsilon
// x0 = (x - sigma_t * out) / alpha_t; v_prediction x0 = alpha_t * x - sigma_t * out.
torch::Tensor dpm_x0(const SamplerPlan& p, const torch::Tensor& x, const torch::Tensor& out, double sigma) {
  const AlphaSigma s = alpha_sigma(sigma);
  if (p.v_prediction) return x * d(s.alpha) - out * d(s.sigma);
  return (x - out * d(s.sigma)) / d(s.alpha);
}

// DDIM, LCM and TCD: (x0, eps) from the model output at alphas_cumprod a_t: epsilon
// x0 = (x - sqrt(1 - a_t) * out) / sqrt(a_t); v_prediction x0 = sqrt(a_t) x - sqrt(1 - a_t) out,
// eps = sqrt(a_t) out + sqrt(1 - a_t) x.
std::pair<torch::Tensor, torch::Tensor> ddim_x0_eps(const SamplerPlan& p, const torch::Tensor& x,
                                                    const torch::Tensor& out, float a_t) {
  const float beta_t = 1 - a_t;
  if (!p.v_prediction) return {(x - out * d(std::sqrt(beta_t))) / d(std::sqrt(a_t)), out};
  return {x * d(std::sqrt(a_t)) - out * d(std::sqrt(beta_t)), out * d(std::sqrt(a_t)) + x * d(std::sqrt(beta_t))};
}

// Ref: diffusers 0.42 scheduling_dpmsolver_multistep.py DPMSolverMultistepScheduler.step,
// dpm_solver_first_order_update, multistep_dpm_solver_second_order_update
// (solver_order 2, midpoint, lower_order_final, final_sigmas_type "zero").
// sde: algorithm_type "sde-dpmsolver++", noise randn float32 per step from the generators.
torch::Tensor sample_dpmpp_2m(const SamplerPlan& p, torch::Tensor x, const ModelFn& model, bool sde,
                              std::vector<at::Generator>& gens, Progress& prog) {
  const size_t n = p.timesteps.size();
  std::optional<torch::Tensor> m_prev;
  int lower_order_nums = 0;
  for (size_t i = static_cast<size_t>(p.begin); i < n; ++i) {
    const torch::Tensor eps = model(x, p.timesteps[i]);
    const torch::Tensor m0 = dpm_x0(p, x, eps, p.sigmas[i]);
    const torch::Tensor xf = x.to(torch::kFloat32);
    torch::Tensor noise;
    if (sde) noise = randn_per_image(gens, eps.sizes(), torch::kFloat32, eps.device());
    const bool lower_order_final = i == n - 1;  // final_sigmas_type "zero"
    const AlphaSigma t = alpha_sigma(p.sigmas[i + 1]), s0 = alpha_sigma(p.sigmas[i]);
    const float h = t.lambda - s0.lambda;
    torch::Tensor prev;
    if (lower_order_nums < 1 || lower_order_final || !m_prev) {
      if (!sde) {
        prev = xf * d(t.sigma / s0.sigma) - m0 * d(t.alpha * (std::exp(-h) - 1.0f));
      } else {
        prev = xf * d(t.sigma / s0.sigma * std::exp(-h)) + m0 * d(t.alpha * (1 - std::exp(-2.0f * h))) +
               noise * d(t.sigma * std::sqrt(1.0f - std::exp(-2 * h)));
      }
    } else {
      const AlphaSigma s1 = alpha_sigma(p.sigmas[i - 1]);
      const float h0 = s0.lambda - s1.lambda;
      const float r0 = h0 / h;
      const torch::Tensor& D0 = m0;
      const torch::Tensor D1 = (m0 - *m_prev) * d(1.0f / r0);
      if (!sde) {
        const float c = t.alpha * (std::exp(-h) - 1.0f);
        prev = xf * d(t.sigma / s0.sigma) - D0 * d(c) - D1 * d(0.5f * c);
      } else {
        const float c = t.alpha * (1 - std::exp(-2.0f * h));
        prev = xf * d(t.sigma / s0.sigma * std::exp(-h)) + D0 * d(c) + D1 * d(0.5f * c) +
               noise * d(t.sigma * std::sqrt(1.0f - std::exp(-2 * h)));
      }
    }
    if (lower_order_nums < 2) ++lower_order_nums;
    m_prev = m0;
    x = prev.to(eps.scalar_type());
    x = prog.done(std::move(x), i);
  }
  return x;
}

// Ref: diffusers 0.42 scheduling_dpmsolver_singlestep.py DPMSolverSinglestepScheduler.step,
// dpm_solver_first_order_update, singlestep_dpm_solver_second_order_update
// (solver_order 2, dpmsolver++, midpoint; order per step from get_order_list).
// This is what diffusers' documentation maps "DPM++ SDE" to; it draws no noise
// (k-diffusion's sample_dpmpp_sde needs a Brownian tree that diffusers lacks).
torch::Tensor sample_dpmpp_sde(const SamplerPlan& p, torch::Tensor x, const ModelFn& model, Progress& prog) {
  const size_t n = p.timesteps.size();
  std::optional<torch::Tensor> m_prev, m_cur, stored;
  for (size_t i = static_cast<size_t>(p.begin); i < n; ++i) {
    const torch::Tensor eps = model(x, p.timesteps[i]);
    m_prev = m_cur;
    m_cur = dpm_x0(p, x, eps, p.sigmas[i]);
    int order = p.orders[i];
    if (order == 2 && !m_prev) order = 1;
    if (order == 1) stored = x;
    const AlphaSigma t = alpha_sigma(p.sigmas[i + 1]);
    if (order == 1) {
      const AlphaSigma s = alpha_sigma(p.sigmas[i]);
      const float h = t.lambda - s.lambda;
      x = *stored * d(t.sigma / s.sigma) - *m_cur * d(t.alpha * (std::exp(-h) - 1.0f));
    } else {
      const AlphaSigma s0 = alpha_sigma(p.sigmas[i]), s1 = alpha_sigma(p.sigmas[i - 1]);
      const float h = t.lambda - s1.lambda, h0 = s0.lambda - s1.lambda;
      const float r0 = h0 / h;
      const torch::Tensor& D0 = *m_prev;
      const torch::Tensor D1 = (*m_cur - *m_prev) * d(1.0f / r0);
      const float c = t.alpha * (std::exp(-h) - 1.0f);
      x = *stored * d(t.sigma / s1.sigma) - D0 * d(c) - D1 * d(0.5f * c);
    }
    x = prog.done(std::move(x), i);
  }
  return x;
}

// UniPC coefficients for bh2 with predict_x0: h_phi_1, B_h and the b vector.
struct UniPcCoef {
  float h_phi_1, b_h;
  std::vector<float> b;
};
UniPcCoef unipc_coef(float h, int order) {
  const float hh = -h;
  UniPcCoef c;
  c.h_phi_1 = std::expm1(hh);
  float h_phi_k = c.h_phi_1 / hh - 1;
  float factorial = 1;
  c.b_h = std::expm1(hh);
  for (int i = 1; i <= order; ++i) {
    c.b.push_back(h_phi_k * factorial / c.b_h);
    factorial *= static_cast<float>(i + 1);
    h_phi_k = h_phi_k / hh - 1 / factorial;
  }
  return c;
}

// Ref: diffusers 0.42 scheduling_unipc_multistep.py UniPCMultistepScheduler.step,
// multistep_uni_p_bh_update (predictor) and multistep_uni_c_bh_update (corrector):
// solver_order 2, bh2, predict_x0, lower_order_final, no disabled corrector.
torch::Tensor sample_unipc(const SamplerPlan& p, torch::Tensor x, const ModelFn& model, Progress& prog) {
  const size_t n = p.timesteps.size();
  std::optional<torch::Tensor> m_prev, m_cur, last_sample;
  int lower_order_nums = 0, this_order = 1;
  for (size_t i = static_cast<size_t>(p.begin); i < n; ++i) {
    const torch::Tensor eps = model(x, p.timesteps[i]);
    const torch::Tensor m_t = dpm_x0(p, x, eps, p.sigmas[i]);
    if (i > static_cast<size_t>(p.begin) && last_sample) {
      // Corrector from the last sample to this one with the new model output.
      const AlphaSigma t = alpha_sigma(p.sigmas[i]), s0 = alpha_sigma(p.sigmas[i - 1]);
      const float h = t.lambda - s0.lambda;
      const UniPcCoef c = unipc_coef(h, this_order);
      const torch::Tensor& m0 = *m_cur;
      torch::Tensor corr;
      float rho_last;
      if (this_order == 1) {
        rho_last = 0.5f;
      } else {
        const AlphaSigma si = alpha_sigma(p.sigmas[i - 2]);
        const float rk = (si.lambda - s0.lambda) / h;
        // torch.linalg.solve([[1, 1], [rk, 1]], b)
        const float rho0 = (c.b[0] - c.b[1]) / (1 - rk);
        rho_last = c.b[0] - rho0;
        corr = (*m_prev - m0) / d(rk) * d(rho0);
      }
      const torch::Tensor x_t_ = *last_sample * d(t.sigma / s0.sigma) - m0 * d(t.alpha * c.h_phi_1);
      const torch::Tensor d1_t = m_t - m0;
      torch::Tensor res = d1_t * d(rho_last);
      if (corr.defined()) res = corr + res;
      x = (x_t_ - res * d(t.alpha * c.b_h)).to(x.scalar_type());
    }
    m_prev = m_cur;
    m_cur = m_t;
    this_order = std::min<int>({2, static_cast<int>(n - i), lower_order_nums + 1});
    last_sample = x;
    // Predictor from this sample to the next sigma.
    const AlphaSigma t = alpha_sigma(p.sigmas[i + 1]), s0 = alpha_sigma(p.sigmas[i]);
    const float h = t.lambda - s0.lambda;
    const UniPcCoef c = unipc_coef(h, this_order);
    const torch::Tensor x_t_ = x * d(t.sigma / s0.sigma) - *m_cur * d(t.alpha * c.h_phi_1);
    if (this_order == 2) {
      const AlphaSigma s1 = alpha_sigma(p.sigmas[i - 1]);
      const float rk = (s1.lambda - s0.lambda) / h;
      const torch::Tensor pred_res = (*m_prev - *m_cur) / d(rk) * 0.5;
      x = (x_t_ - pred_res * d(t.alpha * c.b_h)).to(x.scalar_type());
    } else {
      x = x_t_.to(x.scalar_type());
    }
    if (lower_order_nums < 2) ++lower_order_nums;
    x = prog.done(std::move(x), i);
  }
  return x;
}

// Ref: diffusers 0.42 scheduling_ddim.py DDIMScheduler.step (eta 0, epsilon or v_prediction,
// clip_sample false, set_alpha_to_one false as in SDXL's scheduler config).
torch::Tensor sample_ddim(const SamplerPlan& p, torch::Tensor x, const ModelFn& model, Progress& prog) {
  for (size_t i = static_cast<size_t>(p.begin); i < p.timesteps.size(); ++i) {
    const auto t = static_cast<int>(p.timesteps[i]);
    const torch::Tensor eps = model(x, p.timesteps[i]);
    const int prev_t = t - p.ddim_step_ratio;
    const float a_t = p.alphas_cumprod[static_cast<size_t>(t)];
    const float a_prev = prev_t >= 0 ? p.alphas_cumprod[static_cast<size_t>(prev_t)] : static_cast<float>(p.final_alpha_cumprod);
    const auto [x0, pred_eps] = ddim_x0_eps(p, x, eps, a_t);
    const torch::Tensor dir = pred_eps * d(std::sqrt(1 - a_prev - 0.0f));
    x = x0 * d(std::sqrt(a_prev)) + dir;
    x = prog.done(std::move(x), i);
  }
  return x;
}

// Ref: diffusers 0.42 scheduling_lcm.py LCMScheduler.step (epsilon or v_prediction, timestep_scaling 10,
// sigma_data 0.5); noise randn_tensor(dtype=denoised.dtype) on every step but the last.
torch::Tensor sample_lcm(const SamplerPlan& p, torch::Tensor x, const ModelFn& model, std::vector<at::Generator>& gens,
                         Progress& prog) {
  const size_t n = p.timesteps.size();
  for (size_t i = static_cast<size_t>(p.begin); i < n; ++i) {
    const auto t = static_cast<int64_t>(p.timesteps[i]);
    const torch::Tensor eps = model(x, p.timesteps[i]);
    const int64_t prev_t = i + 1 < n ? static_cast<int64_t>(p.timesteps[i + 1]) : t;
    const float a_t = p.alphas_cumprod[static_cast<size_t>(t)];
    const float a_prev = p.alphas_cumprod[static_cast<size_t>(prev_t)];
    const int64_t scaled = t * 10;
    const float st2 = static_cast<float>(scaled * scaled) + 0.25f;
    const float c_skip = 0.25f / st2;
    const float c_out = static_cast<float>(scaled) / std::sqrt(st2);
    const torch::Tensor x0 = ddim_x0_eps(p, x, eps, a_t).first;
    const torch::Tensor denoised = x0 * d(c_out) + x * d(c_skip);
    if (i != n - 1) {
      const torch::Tensor noise = randn_per_image(gens, eps.sizes(), denoised.scalar_type(), eps.device());
      x = denoised * d(std::sqrt(a_prev)) + noise * d(std::sqrt(1 - a_prev));
    } else {
      x = denoised;
    }
    x = prog.done(std::move(x), i);
  }
  return x;
}

// Ref: diffusers 0.42 scheduling_tcd.py TCDScheduler.step (eta = its gamma): the sample noised back
// to s = floor((1 - eta) * prev_t) from the predicted x0 and eps, then, when eta > 0 and before the
// last step, forward to prev_t with noise randn_tensor(dtype=pred_noised_sample.dtype).
torch::Tensor sample_tcd(const SamplerPlan& p, torch::Tensor x, const ModelFn& model, std::vector<at::Generator>& gens,
                         Progress& prog) {
  const size_t n = p.timesteps.size();
  const auto ac = [&p](int64_t t) { return p.alphas_cumprod[static_cast<size_t>(t)]; };
  for (size_t i = static_cast<size_t>(p.begin); i < n; ++i) {
    const auto t = static_cast<int64_t>(p.timesteps[i]);
    const torch::Tensor out = model(x, p.timesteps[i]);
    const int64_t prev_t = i + 1 < n ? static_cast<int64_t>(p.timesteps[i + 1]) : 0;
    // torch.floor((1 - eta) * prev_timestep): a float32 product.
    const auto s = static_cast<int64_t>(std::floor(static_cast<float>(1.0 - p.eta) * static_cast<float>(prev_t)));
    const float a_prev = ac(prev_t), a_s = ac(s);
    const auto [x0, pred_eps] = ddim_x0_eps(p, x, out, ac(t));
    const torch::Tensor noised = x0 * d(std::sqrt(a_s)) + pred_eps * d(std::sqrt(1 - a_s));
    if (p.eta > 0 && i != n - 1) {
      const torch::Tensor noise = randn_per_image(gens, out.sizes(), noised.scalar_type(), out.device());
      x = noised * d(std::sqrt(a_prev / a_s)) + noise * d(std::sqrt(1 - a_prev / a_s));
    } else {
      x = noised;
    }
    x = prog.done(std::move(x), i);
  }
  return x;
}

}  // namespace

std::vector<at::Generator> cpu_generators(const std::vector<std::int64_t>& seeds) {
  std::vector<at::Generator> gens;
  gens.reserve(seeds.size());
  for (std::int64_t s : seeds) gens.push_back(at::detail::createCPUGenerator(static_cast<uint64_t>(s)));
  return gens;
}

torch::Tensor randn_per_image(std::vector<at::Generator>& gens, at::IntArrayRef shape, torch::Dtype dtype,
                              const torch::Device& device) {
  if (gens.empty() || static_cast<int64_t>(gens.size()) != shape[0])
    throw TaskError("internal: " + std::to_string(gens.size()) + " noise generators for a batch of " +
                    std::to_string(shape[0]));
  std::vector<int64_t> one = shape.vec();
  one[0] = 1;
  std::vector<torch::Tensor> parts;
  parts.reserve(gens.size());
  for (auto& g : gens) parts.push_back(torch::randn(one, g, torch::TensorOptions().dtype(dtype)));
  return torch::cat(parts).to(device);
}

torch::Tensor add_noise(const SamplerPlan& p, const torch::Tensor& latents, const torch::Tensor& noise) {
  return add_noise_at(p, latents, noise, static_cast<size_t>(p.begin));
}

torch::Tensor add_noise_at(const SamplerPlan& p, const torch::Tensor& latents, const torch::Tensor& noise,
                           size_t b) {
  switch (p.kind) {
    case SamplerKind::kEuler:
    case SamplerKind::kEulerAncestral:
    case SamplerKind::kHeun:
      // EulerDiscreteScheduler.add_noise: x + noise * sigma (sigma cast to the latents' dtype).
      return latents + noise * p.sigmas[b];
    case SamplerKind::kDpmpp2m:
    case SamplerKind::kDpmpp2mSde:
    case SamplerKind::kDpmppSde:
    case SamplerKind::kUniPc: {
      // DPMSolverMultistepScheduler.add_noise: alpha_t * x + sigma_t * noise.
      const AlphaSigma s = alpha_sigma(p.sigmas[b]);
      return latents * d(s.alpha) + noise * d(s.sigma);
    }
    case SamplerKind::kDdim:
    case SamplerKind::kLcm:
    case SamplerKind::kTcd: {
      // DDIMScheduler.add_noise: sqrt(ac) * x + sqrt(1 - ac) * noise.
      const float ac = p.alphas_cumprod[static_cast<size_t>(p.timesteps[b])];
      return latents * d(std::sqrt(ac)) + noise * d(std::sqrt(1 - ac));
    }
  }
  return latents;
}

torch::Tensor sample(const SamplerPlan& plan, torch::Tensor latents, const ModelFn& model,
                     std::vector<at::Generator>& gens, const StepHook& hook, const StepBlend& blend) {
  if (static_cast<int64_t>(gens.size()) != latents.size(0))
    throw TaskError("internal: " + std::to_string(gens.size()) + " noise generators for " +
                    std::to_string(latents.size(0)) + " latents");
  Progress prog(plan, hook, blend);
  switch (plan.kind) {
    case SamplerKind::kEuler: return sample_euler(plan, std::move(latents), model, prog);
    case SamplerKind::kEulerAncestral: return sample_euler_ancestral(plan, std::move(latents), model, gens, prog);
    case SamplerKind::kHeun: return sample_heun(plan, std::move(latents), model, prog);
    case SamplerKind::kDpmpp2m: return sample_dpmpp_2m(plan, std::move(latents), model, false, gens, prog);
    case SamplerKind::kDpmpp2mSde: return sample_dpmpp_2m(plan, std::move(latents), model, true, gens, prog);
    case SamplerKind::kDpmppSde: return sample_dpmpp_sde(plan, std::move(latents), model, prog);
    case SamplerKind::kDdim: return sample_ddim(plan, std::move(latents), model, prog);
    case SamplerKind::kUniPc: return sample_unipc(plan, std::move(latents), model, prog);
    case SamplerKind::kLcm: return sample_lcm(plan, std::move(latents), model, gens, prog);
    case SamplerKind::kTcd: return sample_tcd(plan, std::move(latents), model, gens, prog);
  }
  return latents;
}

}  // namespace sdxl
