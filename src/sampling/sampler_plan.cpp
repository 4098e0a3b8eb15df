#include "sampling/sampler_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

#include "core/error.h"
#include "core/units.h"
#include "sampling/schedule.h"

namespace sdxl {
namespace {

struct SamplerInfo {
  SamplerKind kind;
  const char* name;
  const char* scheduler;
  std::vector<ScheduleKind> schedules;
};

const std::vector<SamplerInfo>& sampler_table() {
  using S = ScheduleKind;
  static const std::vector<SamplerInfo> table = {
      {SamplerKind::kEuler, "Euler", "EulerDiscreteScheduler", {S::kAutomatic, S::kKarras, S::kExponential, S::kSgmUniform}},
      // EulerAncestralDiscreteScheduler has no use_karras_sigmas / use_exponential_sigmas.
      {SamplerKind::kEulerAncestral, "Euler a", "EulerAncestralDiscreteScheduler", {S::kAutomatic, S::kSgmUniform}},
      {SamplerKind::kHeun, "Heun", "HeunDiscreteScheduler", {S::kAutomatic, S::kKarras, S::kExponential, S::kSgmUniform}},
      {SamplerKind::kDpmpp2m, "DPM++ 2M", "DPMSolverMultistepScheduler", {S::kAutomatic, S::kKarras, S::kExponential, S::kSgmUniform}},
      {SamplerKind::kDpmpp2mSde, "DPM++ 2M SDE", "DPMSolverMultistepScheduler(sde-dpmsolver++)",
       {S::kAutomatic, S::kKarras, S::kExponential, S::kSgmUniform}},
      // DPMSolverSinglestepScheduler ignores timestep_spacing (always linspace), so SGM Uniform would be a no-op.
      {SamplerKind::kDpmppSde, "DPM++ SDE", "DPMSolverSinglestepScheduler", {S::kAutomatic, S::kKarras, S::kExponential}},
      // DDIMScheduler has spacing only; no sigma schedules.
      {SamplerKind::kDdim, "DDIM", "DDIMScheduler", {S::kAutomatic, S::kSgmUniform}},
      {SamplerKind::kUniPc, "UniPC", "UniPCMultistepScheduler", {S::kAutomatic, S::kKarras, S::kExponential, S::kSgmUniform}},
      // LCMScheduler has its own timesteps (original_inference_steps = 50).
      {SamplerKind::kLcm, "LCM", "LCMScheduler", {S::kAutomatic}},
      // TCDScheduler: LCM's timesteps (original_inference_steps = 50); eta is its gamma.
      {SamplerKind::kTcd, "TCD", "TCDScheduler", {S::kAutomatic}},
  };
  return table;
}

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::kAutomatic: return "Automatic";
    case ScheduleKind::kKarras: return "Karras";
    case ScheduleKind::kExponential: return "Exponential";
    case ScheduleKind::kSgmUniform: return "SGM Uniform";
  }
  return "?";
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // Collapse runs of spaces and trim, so "dpm++  2m" and "DPM++ 2M " match.
  std::string out;
  for (char c : s) {
    if (c == ' ' && (out.empty() || out.back() == ' ')) continue;
    out.push_back(c);
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::string("\"") + v[i] + "\"";
  return s;
}

const SamplerInfo* find_sampler(const std::string& key) {
  for (const auto& info : sampler_table())
    if (lower(info.name) == key) return &info;
  return nullptr;
}

bool find_schedule(const std::string& key, ScheduleKind& out) {
  for (ScheduleKind k : {ScheduleKind::kAutomatic, ScheduleKind::kKarras, ScheduleKind::kExponential, ScheduleKind::kSgmUniform}) {
    if (lower(schedule_name(k)) == key) {
      out = k;
      return true;
    }
  }
  // A1111's internal label for SGM Uniform.
  if (key == "sgm_uniform") {
    out = ScheduleKind::kSgmUniform;
    return true;
  }
  return false;
}

std::vector<float> to_float32(const std::vector<double>& v) {
  std::vector<float> out;
  for (double x : v) out.push_back(static_cast<float>(x));
  return out;
}

std::vector<double> as_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

std::string spacing_for(const SchedulerConfig& cfg, ScheduleKind s) {
  if (s == ScheduleKind::kSgmUniform) return "trailing";
  if (s == ScheduleKind::kExponential) return "linspace";
  return cfg.timestep_spacing;
}

// Euler / Euler a / Heun: EulerDiscreteScheduler.set_timesteps (interpolation
// "linear", final_sigmas_type "zero"); HeunDiscreteScheduler and
// EulerAncestralDiscreteScheduler compute the same sigmas.
// Given timesteps (not empty) replace the spaced ones.
void plan_euler_family(const SchedulerConfig& cfg, ScheduleKind sched, int steps, SamplerPlan& p,
                       const std::vector<int>& given) {
  const std::string spacing = spacing_for(cfg, sched);
  std::vector<double> ts = given.empty() ? spaced_timesteps(cfg, spacing, steps, 0) : std::vector<double>(given.begin(), given.end());
  for (double& t : ts) t = static_cast<double>(static_cast<float>(t));
  const std::vector<float> train = train_sigmas(cfg);
  const std::vector<float> log_sigmas = log_of(train);
  std::vector<double> sig;
  for (double t : ts) sig.push_back(interp_table(train, t));
  if (sched == ScheduleKind::kKarras || sched == ScheduleKind::kExponential) {
    // in_sigmas[-1] / in_sigmas[0] of the spaced sigmas bound the new schedule.
    sig = sched == ScheduleKind::kKarras ? karras_sigmas(sig.back(), sig.front(), steps)
                                         : exponential_sigmas(sig.back(), sig.front(), steps);
    ts.clear();
    for (double s : sig) ts.push_back(static_cast<double>(static_cast<float>(sigma_to_t(s, log_sigmas))));
  }
  sig.push_back(0.0);
  p.sigmas = as_double(to_float32(sig));
  p.timesteps = ts;
  const float max_sigma = static_cast<float>(*std::max_element(p.sigmas.begin(), p.sigmas.end()));
  p.init_noise_sigma = (spacing == "linspace" || spacing == "trailing")
                           ? static_cast<double>(max_sigma)
                           : static_cast<double>(std::sqrt(max_sigma * max_sigma + 1.0f));
}

// DPMSolverMultistepScheduler / DPMSolverSinglestepScheduler / UniPCMultistepScheduler
// set_timesteps: integer timesteps; Karras timesteps are rounded, exponential
// ones truncated by the int64 cast, as in diffusers.
// Given timesteps (not empty) replace the spaced ones.
void plan_multistep(const SchedulerConfig& cfg, ScheduleKind sched, int steps, bool singlestep, SamplerPlan& p,
                    const std::vector<int>& given = {}) {
  const std::string spacing = singlestep ? std::string("linspace") : spacing_for(cfg, sched);
  // linspace / leading space n + 1 points and drop the last; trailing is as Euler's.
  std::vector<double> ts = given.empty() ? spaced_timesteps(cfg, spacing, steps, /*extra=*/1)
                                         : std::vector<double>(given.begin(), given.end());
  const std::vector<float> train = train_sigmas(cfg);
  const std::vector<float> log_sigmas = log_of(train);
  std::vector<double> sig;
  if (sched == ScheduleKind::kKarras || sched == ScheduleKind::kExponential) {
    // np.flip(sigmas): in_sigmas[-1] = sigma of t = 0, in_sigmas[0] = sigma of t = N-1.
    sig = sched == ScheduleKind::kKarras ? karras_sigmas(train.front(), train.back(), steps)
                                         : exponential_sigmas(train.front(), train.back(), steps);
    ts.clear();
    for (double s : sig) {
      const double t = sigma_to_t(s, log_sigmas);
      ts.push_back(sched == ScheduleKind::kKarras ? std::nearbyint(t) : std::trunc(t));
    }
  } else {
    for (double& t : ts) t = std::trunc(t);
    for (double t : ts) sig.push_back(interp_table(train, t));
  }
  sig.push_back(0.0);
  p.sigmas = as_double(to_float32(sig));
  p.timesteps = ts;
  p.init_noise_sigma = 1.0;
}

// LCMScheduler / TCDScheduler set_timesteps (original_inference_steps 50, strength 1): `steps`
// of the 50 timesteps k - 1, 2k - 1, ..., N - 1 (k = N / 50), evenly spaced by index; given
// timesteps are taken as they are.
void plan_consistency(const SchedulerConfig& cfg, int steps, SamplerPlan& p, const std::vector<int>& given) {
  constexpr int kOriginal = 50;
  const int n = cfg.num_train_timesteps;
  p.alphas_cumprod = train_alphas_cumprod(cfg);
  p.final_alpha_cumprod = p.alphas_cumprod.front();
  if (!given.empty()) {
    p.timesteps.assign(given.begin(), given.end());
    return;
  }
  if (steps > kOriginal)
    throw UsageError(std::string(p.kind == SamplerKind::kLcm ? "LCM" : "TCD") + " takes at most " + std::to_string(kOriginal) +
                     " steps (its original_inference_steps); got " + std::to_string(steps));
  const int k = n / kOriginal;
  std::vector<int> origin;
  for (int i = kOriginal; i >= 1; --i) origin.push_back(i * k - 1);
  for (int i = 0; i < steps; ++i) {
    const double idx = std::floor(static_cast<double>(i) * (static_cast<double>(kOriginal) / steps));  // np.linspace(endpoint=False)
    p.timesteps.push_back(origin[static_cast<size_t>(idx)]);
  }
}

}  // namespace

bool sampler_takes_timesteps(SamplerKind kind) {
  switch (kind) {
    case SamplerKind::kEuler:
    case SamplerKind::kHeun:
    case SamplerKind::kDpmpp2m:
    case SamplerKind::kDpmpp2mSde:
    case SamplerKind::kDpmppSde:
    case SamplerKind::kLcm:
    case SamplerKind::kTcd: return true;
    default: return false;
  }
}

std::string timesteps_problem(const SamplerChoice& choice, const std::vector<int>& timesteps, int n) {
  if (std::string why = timestep_list_problem(timesteps, n); !why.empty()) return why;
  if (!sampler_takes_timesteps(choice.sampler))
    return "sampler '" + choice.sampler_name +
           "' takes no timestep list (its diffusers scheduler has no set_timesteps(timesteps=...)); samplers that do: "
           "Euler, Heun, DPM++ 2M, DPM++ 2M SDE, DPM++ SDE, LCM, TCD";
  if (choice.schedule != ScheduleKind::kAutomatic)
    return "a timestep list replaces the schedule: give schedule type Automatic, not '" + choice.schedule_name +
           "' (diffusers refuses timesteps with its sigmas)";
  return "";
}

std::vector<std::string> sampler_names() {
  std::vector<std::string> v;
  for (const auto& info : sampler_table()) v.emplace_back(info.name);
  return v;
}

std::vector<std::string> schedule_names(SamplerKind kind) {
  std::vector<std::string> v;
  for (const auto& info : sampler_table())
    if (info.kind == kind)
      for (ScheduleKind s : info.schedules) v.emplace_back(schedule_name(s));
  return v;
}

SamplerChoice parse_sampler_choice(const std::string& sampler, const std::string& schedule) {
  const std::string key = lower(sampler);
  const SamplerInfo* info = find_sampler(key);
  ScheduleKind from_name = ScheduleKind::kAutomatic;
  bool combined = false;
  if (info == nullptr) {
    // Older A1111 names carry the schedule: "DPM++ 2M Karras", "Euler SGM Uniform".
    for (ScheduleKind k : {ScheduleKind::kKarras, ScheduleKind::kExponential, ScheduleKind::kSgmUniform}) {
      const std::string suffix = " " + lower(schedule_name(k));
      if (key.size() > suffix.size() && key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0) {
        info = find_sampler(key.substr(0, key.size() - suffix.size()));
        if (info != nullptr) {
          from_name = k;
          combined = true;
          break;
        }
      }
    }
  }
  if (info == nullptr)
    throw UsageError("unknown sampler '" + sampler + "'; valid: " + join(sampler_names()) +
                     " (a schedule may follow the name, e.g. \"DPM++ 2M Karras\", or be given as the schedule type)");
  ScheduleKind sched = ScheduleKind::kAutomatic;
  const std::string skey = lower(schedule.empty() ? std::string("Automatic") : schedule);
  if (!find_schedule(skey, sched))
    throw UsageError("unknown schedule type '" + schedule + "'; valid for " + info->name + ": " +
                     join(schedule_names(info->kind)));
  if (combined) {
    if (sched != ScheduleKind::kAutomatic && sched != from_name)
      throw UsageError("sampler '" + sampler + "' names the schedule " + schedule_name(from_name) +
                       " but the schedule type is '" + schedule + "'; give one of them");
    sched = from_name;
  }
  if (std::find(info->schedules.begin(), info->schedules.end(), sched) == info->schedules.end())
    throw UsageError("schedule type '" + std::string(schedule_name(sched)) + "' is not available for sampler '" +
                     info->name + "' (diffusers' " + info->scheduler + " does not support it); valid: " +
                     join(schedule_names(info->kind)));
  SamplerChoice c;
  c.sampler = info->kind;
  c.schedule = sched;
  c.sampler_name = info->name;
  c.schedule_name = schedule_name(sched);
  return c;
}

SamplerPlan make_sampler_plan(const SchedulerConfig& cfg, const SamplerChoice& choice, int steps,
                              const std::vector<int>& given) {
  const int n = cfg.num_train_timesteps;
  if (!given.empty()) {
    if (const std::string why = timesteps_problem(choice, given, n); !why.empty()) throw UsageError("timesteps " + why);
    steps = static_cast<int>(given.size());
  }
  if (steps < 1 || steps > n)
    throw UsageError("steps " + std::to_string(steps) + " must be in 1.." + std::to_string(n));
  SamplerPlan p;
  p.kind = choice.sampler;
  p.steps = steps;
  p.v_prediction = cfg.v_prediction();
  for (const auto& info : sampler_table())
    if (info.kind == choice.sampler) p.scheduler = info.scheduler;
  switch (choice.sampler) {
    case SamplerKind::kEuler:
    case SamplerKind::kEulerAncestral:
      // Ref: scheduling_euler_discrete.py / scheduling_euler_ancestral_discrete.py set_timesteps.
      plan_euler_family(cfg, choice.schedule, steps, p, given);
      break;
    case SamplerKind::kHeun: {
      // Ref: scheduling_heun_discrete.py set_timesteps: every sigma but the first and
      // the last, and every timestep but the first, repeated for the corrector call.
      plan_euler_family(cfg, choice.schedule, steps, p, given);
      std::vector<double> sig{p.sigmas.front()}, ts{p.timesteps.front()};
      for (size_t i = 1; i + 1 < p.sigmas.size(); ++i) sig.insert(sig.end(), {p.sigmas[i], p.sigmas[i]});
      sig.push_back(p.sigmas.back());
      for (size_t i = 1; i < p.timesteps.size(); ++i) ts.insert(ts.end(), {p.timesteps[i], p.timesteps[i]});
      p.sigmas = sig;
      p.timesteps = ts;
      p.order = 2;
      break;
    }
    case SamplerKind::kDpmpp2m:
    case SamplerKind::kDpmpp2mSde:
    case SamplerKind::kUniPc:
      // Ref: scheduling_dpmsolver_multistep.py / scheduling_unipc_multistep.py set_timesteps.
      plan_multistep(cfg, choice.schedule, steps, /*singlestep=*/false, p, given);
      break;
    case SamplerKind::kDpmppSde: {
      // Ref: scheduling_dpmsolver_singlestep.py set_timesteps + get_order_list
      // (solver_order 2, lower_order_final, final_sigmas_type "zero").
      plan_multistep(cfg, choice.schedule, steps, /*singlestep=*/true, p, given);
      std::vector<int> o;
      for (int i = 0; i < steps / 2 - (steps % 2 == 0 ? 1 : 0); ++i) o.insert(o.end(), {1, 2});
      if (steps % 2 == 0) o.insert(o.end(), {1, 1});
      else o.push_back(1);
      o.back() = 1;
      p.orders = o;
      break;
    }
    case SamplerKind::kDdim: {
      // Ref: scheduling_ddim.py set_timesteps; SDXL's scheduler config has
      // set_alpha_to_one=false and clip_sample=false.
      const std::string spacing = spacing_for(cfg, choice.schedule);
      std::vector<double> ts;
      if (spacing == "linspace") {
        for (double v : np_linspace(0, n - 1, steps)) ts.push_back(std::nearbyint(v));
        std::reverse(ts.begin(), ts.end());
      } else {
        ts = spaced_timesteps(cfg, spacing, steps, 0);
      }
      p.timesteps = ts;
      p.alphas_cumprod = train_alphas_cumprod(cfg);
      p.final_alpha_cumprod = p.alphas_cumprod.front();
      p.ddim_step_ratio = n / steps;
      break;
    }
    case SamplerKind::kLcm:
    case SamplerKind::kTcd:
      // Ref: scheduling_lcm.py / scheduling_tcd.py set_timesteps.
      plan_consistency(cfg, steps, p, given);
      break;
  }
  return p;
}

void plan_apply_strength(SamplerPlan& plan, double strength) {
  if (!(strength > 0.0 && strength <= 1.0))
    throw UsageError("denoising strength " + std::to_string(strength) + " must be in (0, 1]");
  const int init = strength_steps(plan.steps, strength);
  const int t_start = std::max(plan.steps - init, 0);
  if (plan.steps - t_start < 1)
    throw UsageError("denoising strength " + std::to_string(strength) + " with " + std::to_string(plan.steps) +
                     " steps leaves no step to run (int(steps * strength) = 0): raise the strength or the steps");
  plan.begin = t_start * plan.order;
}

int plan_model_calls(const SamplerPlan& plan) { return static_cast<int>(plan.timesteps.size()) - plan.begin; }

}  // namespace sdxl
