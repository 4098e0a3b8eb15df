#include "sdxl/generator.h"

#include <spdlog/spdlog.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <chrono>

#include "image/upscale.h"
#include "image/vae_decode.h"
#include "image/vae_encode.h"
#include "model/sdxl_model.h"
#include "runtime/device.h"
#include "sampling/samplers.h"
#include "sdxl/error.h"
#include "sdxl/png_reader.h"
#include "sdxl/sampler_plan.h"
#include "text/conditioning.h"

namespace sdxl {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CFG, then diffusers' rescale_noise_cfg when guidance_rescale > 0
// (pipeline_stable_diffusion_xl.py: std over all but the batch dim, unbiased).
torch::Tensor apply_guidance(const torch::Tensor& uncond, const torch::Tensor& cond, double scale, double rescale) {
  torch::Tensor eps = uncond + scale * (cond - uncond);
  if (rescale > 0.0) {
    const torch::Tensor std_text = cond.std({1, 2, 3}, /*unbiased=*/true, /*keepdim=*/true);
    const torch::Tensor std_cfg = eps.std({1, 2, 3}, /*unbiased=*/true, /*keepdim=*/true);
    const torch::Tensor rescaled = eps * (std_text / std_cfg);
    eps = rescale * rescaled + (1 - rescale) * eps;
  }
  return eps;
}

}  // namespace

struct Generator::Impl {
  std::unique_ptr<SdxlModel> model;
  double load_s = 0;
};

Generator::Generator(const std::filesystem::path& model_dir, const RuntimeOptions& opts) : impl_(std::make_unique<Impl>()) {
  const auto t0 = Clock::now();
  const ModelConfig cfg = load_model_config(model_dir);
  const torch::Device device = parse_device(opts.device);
  // TorchScript's profiling executor re-optimises a graph after its first calls
  // (fusing pointwise ops), which changes fp16 results from about the 4th call
  // on: the same seed would give another image depending on its place in the
  // run. By default the graphs run as traced so every image is reproducible.
  torch::jit::setGraphExecutorOptimize(opts.jit_optimize);
  at::globalContext().setBenchmarkCuDNN(opts.cudnn_benchmark);
  if (opts.threads > 0) at::set_num_threads(opts.threads);
  impl_->model = SdxlModel::load(cfg, device, opts.dtype);
  device_synchronize(device);
  impl_->load_s = seconds_since(t0);
  spdlog::info("loaded model '{}' ({}, {}) on {} in {:.2f} s", cfg.name, cfg.source, dtype_name(impl_->model->dtype),
               device.str(), impl_->load_s);
}

Generator::~Generator() = default;

const ModelConfig& Generator::model() const { return impl_->model->config; }
std::string Generator::device_name() const { return impl_->model->device.str(); }
double Generator::load_seconds() const { return impl_->load_s; }
std::uint64_t Generator::peak_memory_bytes() const { return device_peak_bytes(impl_->model->device); }
std::uint64_t Generator::memory_in_use_bytes() const { return device_memory_in_use(impl_->model->device); }

GeneratedImage Generator::generate(const GenerationParams& p) {
  SdxlModel& m = *impl_->model;
  const ModelConfig& cfg = m.config;
  check_task_size(cfg, p);
  const SamplerChoice choice = parse_sampler_choice(p.sampler, p.schedule);
  SamplerPlan plan = make_sampler_plan(cfg.scheduler, choice, p.steps);
  if (!p.init_image.empty()) plan_apply_strength(plan, p.strength);
  SamplerPlan hires_plan;
  if (p.hires_on()) {
    hires_plan = make_sampler_plan(cfg.scheduler, choice, p.hires_steps());
    plan_apply_strength(hires_plan, p.hires.denoise);
  }
  RgbImage init_image;
  if (!p.init_image.empty()) {
    init_image = read_png_rgb(p.init_image);
    if (init_image.width != p.width || init_image.height != p.height)
      throw UsageError("init image '" + p.init_image + "' is " + std::to_string(init_image.width) + "x" +
                       std::to_string(init_image.height) + " but the task asks for " + std::to_string(p.width) + "x" +
                       std::to_string(p.height) + ": resize the image first, or leave width/height unset to take its size");
  }
  c10::InferenceMode inference;
  GeneratedImage out;
  out.width = p.hires_on() ? p.hires_width() : p.width;
  out.height = p.hires_on() ? p.hires_height() : p.height;

  // Stage 1: text conditioning (A1111 prompt rules), CFG batch order [negative, positive].
  auto t0 = Clock::now();
  const bool cfg_on = p.cfg > 1.0;
  SdxlPromptTokens pos_tokens = tokenize_sdxl_prompt(m, p.prompt);
  for (const auto& w : pos_tokens.warnings) spdlog::warn("prompt, character {}: {}", w.position, w.message);
  SdxlPromptTokens neg_tokens;
  const bool neg_text = cfg_on && !p.negative_prompt.empty();
  size_t chunk_count = pos_tokens.chunk_count();
  if (neg_text) {
    neg_tokens = tokenize_sdxl_prompt(m, p.negative_prompt);
    for (const auto& w : neg_tokens.warnings) spdlog::warn("negative prompt, character {}: {}", w.position, w.message);
    chunk_count = std::max(chunk_count, neg_tokens.chunk_count());
  }
  if (chunk_count > static_cast<size_t>(cfg.limits.context_chunks_max))
    throw UsageError("the prompt needs " + std::to_string(chunk_count) + " chunks of 75 tokens; model '" + cfg.name +
                     "' was checked for at most " + std::to_string(cfg.limits.context_chunks_max) +
                     " (model.json /limits/context_chunks_max): shorten the prompt (see `sdxl-batch tokens`)");
  pad_sdxl_prompt(m, pos_tokens, chunk_count);
  const PromptEmbeds pos = encode_prompt_tokens(m, pos_tokens);
  torch::Tensor context = pos.context, pooled = pos.pooled;
  if (cfg_on) {
    PromptEmbeds neg = zero_embeds(pos);
    if (neg_text) {
      pad_sdxl_prompt(m, neg_tokens, chunk_count);
      neg = encode_prompt_tokens(m, neg_tokens);
    }
    context = torch::cat({neg.context, pos.context});
    pooled = torch::cat({neg.pooled, pos.pooled});
  }
  device_synchronize(m.device);
  out.seconds.text = seconds_since(t0);

  // Stage 2: sampling. The image's generator (its seed) draws the initial noise
  // and then the noise that ancestral / SDE samplers draw, as diffusers' does.
  t0 = Clock::now();
  const int64_t batch = cfg_on ? 2 : 1;
  // The UNet with CFG at a size (SDXL's time_ids: original = target = that size, crop 0).
  auto model_at = [&](int width, int height) -> ModelFn {
    torch::Tensor time_ids = sdxl_time_ids(width, height, m.dtype, m.device);
    if (cfg_on) time_ids = torch::cat({time_ids, time_ids});
    return [&, time_ids](const torch::Tensor& x_in, double timestep) {
      torch::Tensor x = cfg_on ? torch::cat({x_in, x_in}) : x_in;
      torch::Tensor t = torch::full({batch}, timestep, torch::TensorOptions().dtype(torch::kFloat32).device(m.device));
      torch::Tensor eps = run_module(m.unet, "unet", {x, t, context, pooled, time_ids}).toTensor();
      if (!cfg_on) return eps;
      auto halves = eps.chunk(2);  // [uncond, cond]
      return apply_guidance(halves[0], halves[1], p.cfg, p.guidance_rescale);
    };
  };
  std::vector<at::Generator> gens = cpu_generators({p.seed});
  const int64_t h = p.height / cfg.vae_downsample, w = p.width / cfg.vae_downsample;
  torch::Tensor latents;
  if (init_image.rgb.empty()) {
    latents = randn_per_image(gens, {1, cfg.latent_channels, h, w}, m.dtype, m.device) * plan.init_noise_sigma;
  } else {
    // StableDiffusionXLImg2ImgPipeline.prepare_latents: add_noise at the first kept timestep.
    const torch::Tensor init = vae_encode_rgb8(m, init_image.rgb.data(), init_image.width, init_image.height);
    latents = add_noise(plan, init, randn_per_image(gens, init.sizes(), m.dtype, m.device));
  }
  latents = sample(plan, latents, model_at(p.width, p.height), gens, nullptr);

  if (p.hires_on()) {
    // Hires fix: upscale the first result, then an img2img pass at the new size
    // with a fresh generator of the same seed (A1111 re-seeds the second pass).
    const int hw = p.hires_width(), hh = p.hires_height();
    torch::Tensor up;
    if (is_latent_upscaler(p.hires.upscaler)) {
      up = upscale_latents(latents, hh / cfg.vae_downsample, hw / cfg.vae_downsample, p.hires.upscaler);
    } else {
      const std::vector<std::uint8_t> first = vae_decode_rgb8(m, latents);
      const std::vector<std::uint8_t> big = resize_nearest_rgb8(first.data(), p.width, p.height, hw, hh);
      up = vae_encode_rgb8(m, big.data(), hw, hh);
    }
    std::vector<at::Generator> gens2 = cpu_generators({p.seed});
    latents = add_noise(hires_plan, up, randn_per_image(gens2, up.sizes(), m.dtype, m.device));
    latents = sample(hires_plan, latents, model_at(hw, hh), gens2, nullptr);
  }
  device_synchronize(m.device);
  out.seconds.sample = seconds_since(t0);

  // Stage 3: decode.
  t0 = Clock::now();
  torch::Tensor lat_cpu = latents.to(torch::kCPU).to(torch::kFloat32).contiguous();
  out.latent_shape.assign(lat_cpu.sizes().begin(), lat_cpu.sizes().end());
  out.latents.assign(lat_cpu.data_ptr<float>(), lat_cpu.data_ptr<float>() + lat_cpu.numel());
  out.rgb = vae_decode_rgb8(m, latents);
  device_synchronize(m.device);
  out.seconds.decode = seconds_since(t0);
  return out;
}

}  // namespace sdxl
