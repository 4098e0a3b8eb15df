// Samplers and schedules by their A1111 names, and the plan a sampler follows:
// the timesteps, sigmas and coefficients that the diffusers scheduler which
// diffusers' documentation maps to that name computes in set_timesteps
// (api/schedulers/overview: "DPM++ 2M Karras" -> DPMSolverMultistepScheduler
// with use_karras_sigmas=True, "SGM Uniform" -> timestep_spacing="trailing",
// "Exponential" -> timestep_spacing="linspace", use_exponential_sigmas=True).
// Pure functions, torch-free; parse errors are UsageErrors listing valid names.
#pragma once

#include <string>
#include <vector>

#include "model/model_config.h"

namespace sdxl {

enum class SamplerKind { kEuler, kEulerAncestral, kHeun, kDpmpp2m, kDpmpp2mSde, kDpmppSde, kDdim, kUniPc, kLcm, kTcd };
enum class ScheduleKind { kAutomatic, kKarras, kExponential, kSgmUniform };

struct SamplerChoice {
  SamplerKind sampler = SamplerKind::kEuler;
  ScheduleKind schedule = ScheduleKind::kAutomatic;
  std::string sampler_name = "Euler";       // canonical A1111 sampler name, no schedule suffix
  std::string schedule_name = "Automatic";  // canonical A1111 schedule type
};

// Accepts A1111 names, case-insensitively: a sampler ("DPM++ 2M") with a
// schedule type ("Karras"), or the older combined names ("DPM++ 2M Karras",
// "DPM++ 2M SDE Exponential") with schedule "Automatic" or the same type.
// Throws UsageError naming the valid samplers, or the schedules valid for that
// sampler (e.g. DDIM has no Karras sigmas in diffusers).
SamplerChoice parse_sampler_choice(const std::string& sampler, const std::string& schedule);

std::vector<std::string> sampler_names();
std::vector<std::string> schedule_names(SamplerKind kind);  // the schedules this sampler supports

struct SamplerPlan {
  SamplerKind kind = SamplerKind::kEuler;
  std::string scheduler;           // the diffusers class mirrored (logs, errors)
  int steps = 0;                   // num_inference_steps asked for
  int order = 1;                   // scheduler.order (Heun: 2 model calls per step)
  int begin = 0;                   // first model call (img2img: t_start * order)
  std::vector<double> timesteps;   // the UNet's timestep per model call
  std::vector<double> sigmas;      // the scheduler's sigmas (float32 values), incl. the final one
  double init_noise_sigma = 1.0;   // text-to-image noise is scaled by this
  std::vector<float> alphas_cumprod;  // DDIM, LCM: training alphas_cumprod
  double final_alpha_cumprod = 1.0;   // DDIM: alpha at "timestep -1"
  int ddim_step_ratio = 0;            // DDIM: num_train_timesteps // steps
  std::vector<int> orders;            // DPM++ SDE (singlestep): solver order per step
  bool v_prediction = false;          // the model predicts v (model.json prediction_type)
  double eta = 0.3;                   // TCD: its gamma, in [0, 1]
};

// Whether the sampler's diffusers scheduler takes set_timesteps(timesteps=[...]) (Euler, Heun,
// DPM++ 2M, DPM++ 2M SDE, DPM++ SDE, LCM, TCD).
bool sampler_takes_timesteps(SamplerKind kind);

// set_timesteps(steps) of the scheduler for `choice`, from the model's config; with `timesteps`
// (not empty) set_timesteps(timesteps=...) instead, and steps is their count. Throws UsageError
// for steps out of range (LCM, TCD: at most 50, their original steps), and for timesteps that
// are not strictly decreasing within [0, num_train_timesteps), or that the sampler (or a
// schedule other than Automatic) cannot take, naming it.
SamplerPlan make_sampler_plan(const SchedulerConfig& cfg, const SamplerChoice& choice, int steps,
                              const std::vector<int>& timesteps = {});

// Why `timesteps` cannot be used with `choice` on a model of num_train_timesteps `n`
// ("" when they can): the checks of make_sampler_plan, for the batch-file check.
std::string timesteps_problem(const SamplerChoice& choice, const std::vector<int>& timesteps, int n);

// img2img: StableDiffusionXLImg2ImgPipeline.get_timesteps: the first
// steps - min(int(steps * strength), steps) steps are skipped. Throws
// UsageError when no step is left (strength too low for the step count).
void plan_apply_strength(SamplerPlan& plan, double strength);

// Steps that will run (model calls / order), for progress and metadata.
int plan_model_calls(const SamplerPlan& plan);

}  // namespace sdxl
