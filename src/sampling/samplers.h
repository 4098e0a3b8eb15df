// Samplers: one function per method, each following the diffusers scheduler
// that diffusers' documentation maps to the A1111 name (the file and function
// are cited at each). They work on a batch of latents [B, 4, h, w]; the model
// function applies CFG (and guidance rescale) and returns the model's output for
// the batch: eps, or v for a v-prediction model (plan.v_prediction), which each
// sampler converts to x0 / eps as its diffusers scheduler does.
// Noise that an ancestral/SDE sampler draws comes from one CPU generator per
// image, drawn as diffusers' randn_tensor does with a list of generators, so
// an image is the same whatever batch it lands in. Not thread-safe per call;
// separate calls with their own generators may run concurrently.
#pragma once

#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <functional>
#include <vector>

#include "sampling/sampler_plan.h"

namespace sdxl {

// model_input: latents already scaled by the sampler (scale_model_input);
// returns the model output (eps or v) with CFG applied, same shape.
using ModelFn = std::function<torch::Tensor(const torch::Tensor& model_input, double timestep)>;
// Called after each model call with (calls done, calls total); may throw to stop.
using StepHook = std::function<void(int step, int total)>;

// Called after the step of model call `call` with its result (the last call's too);
// returns the latents the next call starts from, or the result (inpainting blends
// the known region back, noised to timesteps[call + 1]; after the last call not noised).
using StepBlend = std::function<torch::Tensor(const torch::Tensor& latents, size_t call)>;

// Runs plan.timesteps[plan.begin..] on `latents` (already noised: initial noise
// times plan.init_noise_sigma, or add_noise for img2img). gens.size() == B.
torch::Tensor sample(const SamplerPlan& plan, torch::Tensor latents, const ModelFn& model,
                     std::vector<at::Generator>& gens, const StepHook& hook, const StepBlend& blend = {});

// scheduler.add_noise(latents, noise, timesteps[begin]) of the plan's scheduler
// (img2img and the hires fix second pass).
torch::Tensor add_noise(const SamplerPlan& plan, const torch::Tensor& latents, const torch::Tensor& noise);
// The same at model call `call` (scheduler.add_noise after set_begin_index, at
// the step index `call`, as StableDiffusionXLInpaintPipeline re-noises the known region).
torch::Tensor add_noise_at(const SamplerPlan& plan, const torch::Tensor& latents, const torch::Tensor& noise,
                           size_t call);

// randn_tensor(shape, generator=[gens...], dtype): one draw of shape [1, ...]
// per image on the CPU, concatenated, moved to `device`.
torch::Tensor randn_per_image(std::vector<at::Generator>& gens, at::IntArrayRef shape, torch::Dtype dtype,
                              const torch::Device& device);

// One CPU generator per image, seeded with its seed (torch.Generator().manual_seed).
std::vector<at::Generator> cpu_generators(const std::vector<std::int64_t>& seeds);

}  // namespace sdxl
