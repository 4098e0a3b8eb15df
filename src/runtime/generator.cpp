#include "sdxl/generator.h"

#include <spdlog/spdlog.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <chrono>

#include "image/vae_decode.h"
#include "lora/lora_cache.h"
#include "lora/lora_patcher.h"
#include "model/sdxl_model.h"
#include "runtime/device.h"
#include "sampling/euler.h"
#include "sampling/noise.h"
#include "sdxl/error.h"
#include "sdxl/schedule.h"
#include "text/conditioning.h"

namespace sdxl {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

struct Generator::Impl {
  std::unique_ptr<SdxlModel> model;
  double load_s = 0;
  RuntimeOptions opts;
  // LoRA state (created on first use): the factor cache, the patcher holding the
  // originals of touched weights, and the set applied now.
  std::unique_ptr<LoraPatcher> patcher;
  std::unique_ptr<LoraCache> lora_cache;
  LoraRegistry lora_registry;
  std::vector<LoraRef> applied;
  std::vector<std::pair<std::string, std::string>> applied_hashes;

  void ensure_lora_state() {
    if (patcher) return;
    patcher = std::make_unique<LoraPatcher>(*model);
    std::uint64_t budget = opts.lora_cache_bytes;
    if (budget == 0) budget = device_free_bytes(model->device) / 10 * 3;  // 30% of what the weights left free
    lora_cache = std::make_unique<LoraCache>(patcher->shapes(), model->device, budget, opts.lora_strict);
    spdlog::info("LoRA cache budget {:.1f} MiB{}", budget / 1048576.0, opts.lora_cache_bytes ? "" : " (30% of free memory)");
  }
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
  impl_->opts = opts;
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

void Generator::set_lora_registry(LoraRegistry registry) { impl_->lora_registry = std::move(registry); }

LoraStats Generator::lora_stats() const { return impl_->lora_cache ? impl_->lora_cache->stats() : LoraStats{}; }

std::vector<std::pair<std::string, std::string>> Generator::set_loras(const std::vector<LoraRef>& loras) {
  Impl& im = *impl_;
  if (loras == im.applied) return im.applied_hashes;
  if (loras.empty() && !im.patcher) return {};
  im.ensure_lora_state();
  const auto t0 = Clock::now();
  std::vector<std::string> keep;
  for (const auto& r : loras) keep.push_back(lora_cache_key(r.path));
  LoraPatcher::Applied set;
  std::vector<std::pair<std::string, std::string>> hashes;
  for (const auto& r : loras) {
    auto l = im.lora_cache->get(r, keep);
    hashes.emplace_back(r.name, l->short_hash);
    set.emplace_back(std::move(l), r.weight);
  }
  const auto t1 = Clock::now();
  im.patcher->apply(set);
  device_synchronize(im.model->device);
  auto& st = im.lora_cache->stats();
  const double merge_s = seconds_since(t1);
  st.merge_s += merge_s;
  ++st.switches;
  std::string names;
  for (const auto& r : loras) names += (names.empty() ? "" : ", ") + fmt::format("{}:{:g}", r.name, r.weight);
  spdlog::info("LoRA set [{}] applied in {:.3f} s (load {:.3f} s, merge {:.3f} s; {} weights patched; cache {:.1f} MiB, "
               "{} hits, {} misses, {} evictions)",
               names.empty() ? "none" : names, seconds_since(t0), std::chrono::duration<double>(t1 - t0).count(), merge_s,
               im.patcher->patched_weights(), st.bytes_held / 1048576.0, st.hits, st.misses, st.evictions);
  im.applied = loras;
  im.applied_hashes = hashes;
  return hashes;
}

GeneratedImage Generator::generate(const GenerationParams& p) {
  // LoRAs from the parameters and the prompt's tags; the tags leave the text.
  const PromptLoras tagged = extract_lora_tags(p.prompt);
  std::vector<LoraRef> loras = p.loras;
  for (const auto& t : tagged.tags)
    loras.push_back(resolve_lora(t.name, t.weight, impl_->lora_registry, impl_->opts.lora_dirs));
  const auto t_lora = Clock::now();
  auto lora_hashes = set_loras(loras);
  const double lora_s = seconds_since(t_lora);

  SdxlModel& m = *impl_->model;
  const ModelConfig& cfg = m.config;
  check_generation_size(cfg, p.width, p.height, 1);
  if (p.sampler != "Euler") throw UsageError("sampler '" + p.sampler + "' is not available yet; valid: Euler");
  const Schedule sched = euler_discrete_schedule(cfg.scheduler, p.steps);
  c10::InferenceMode inference;
  GeneratedImage out;
  out.width = p.width;
  out.height = p.height;
  out.lora_hashes = std::move(lora_hashes);
  out.lora_s = lora_s;

  // Stage 1: text conditioning (A1111 prompt rules), CFG batch order [negative, positive].
  auto t0 = Clock::now();
  const bool cfg_on = p.cfg > 1.0;
  SdxlPromptTokens pos_tokens = tokenize_sdxl_prompt(m, tagged.text);
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
  torch::Tensor time_ids = sdxl_time_ids(p.width, p.height, m.dtype, m.device);
  if (cfg_on) {
    PromptEmbeds neg = zero_embeds(pos);
    if (neg_text) {
      pad_sdxl_prompt(m, neg_tokens, chunk_count);
      neg = encode_prompt_tokens(m, neg_tokens);
    }
    context = torch::cat({neg.context, pos.context});
    pooled = torch::cat({neg.pooled, pos.pooled});
    time_ids = torch::cat({time_ids, time_ids});
  }
  device_synchronize(m.device);
  out.seconds.text = seconds_since(t0);

  // Stage 2: sampling.
  t0 = Clock::now();
  const int64_t h = p.height / cfg.vae_downsample, w = p.width / cfg.vae_downsample;
  torch::Tensor latents = initial_noise(p.seed, cfg.latent_channels, h, w, m.dtype).to(m.device);
  latents = latents * sched.init_noise_sigma;
  const int64_t batch = cfg_on ? 2 : 1;
  for (size_t i = 0; i < sched.timesteps.size(); ++i) {
    const double sigma = sched.sigmas[i];
    torch::Tensor x = cfg_on ? torch::cat({latents, latents}) : latents;
    x = euler_scale_model_input(x, sigma);
    torch::Tensor t = torch::full({batch}, sched.timesteps[i], torch::TensorOptions().dtype(torch::kFloat32).device(m.device));
    torch::Tensor eps = run_module(m.unet, "unet", {x, t, context, pooled, time_ids}).toTensor();
    if (cfg_on) {
      auto halves = eps.chunk(2);  // [uncond, cond]
      eps = halves[0] + p.cfg * (halves[1] - halves[0]);
    }
    latents = euler_step(eps, latents, sigma, sched.sigmas[i + 1]);
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
