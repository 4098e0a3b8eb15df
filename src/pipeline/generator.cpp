#include "pipeline/generator.h"

#include <spdlog/spdlog.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/cuda.h>
#include <torch/script.h>

#include <chrono>
#include <functional>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>

#include "control/control_image.h"
#include "control/controlnet_cache.h"
#include "control/ip_adapter_cache.h"
#include "image/resize.h"
#include "image/upscale.h"
#include "image/upscaler.h"
#include "image/upscaler_cache.h"
#include "image/vae_decode.h"
#include "image/vae_encode.h"
#include "lora/embeddings.h"
#include "lora/lora_cache.h"
#include "lora/lora_patcher.h"
#include "batch/batch_file.h"
#include "batch/lora_ref.h"
#include "batch/task_keys.h"
#include "model/sdxl_model.h"
#include "model/task_size.h"
#include "pipeline/region_weights.h"
#include "device/device.h"
#include "pipeline/stage_stream.h"
#include "pipeline/unet_runner.h"
#include "pipeline/vae_cache.h"
#include "sampling/samplers.h"
#include "core/error.h"
#include "device/device_errors.h"
#include "image/mask.h"
#include "detect/detector_cache.h"
#include "core/lru_cache.h"
#include "pipeline/detailer.h"
#include "image/png_reader.h"
#include "sampling/sampler_plan.h"
#include "pipeline/text_encode.h"
#include "pipeline/prompt_steps.h"
#include "text/prompt_schedule.h"

namespace sdxl {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The end of a stage: waits for its work on the device (so the time is the
// device's, not the launch's) and gives every image of the batch that time.
void stamp_stage(const torch::Device& device, Clock::time_point t0, std::vector<GeneratedImage>& out,
                 double StageSeconds::*stage) {
  stream_synchronize(device);
  const double s = seconds_since(t0);
  for (auto& g : out) g.seconds.*stage = s;
}

// SDXL_TRACE_STEPS=1 (a diagnostic): the sampling stage synchronises around
// each UNet call and logs its time, and the time since the previous call ended
// (the sampler's own work), at info level.
bool trace_steps() {
  static const bool on = std::getenv("SDXL_TRACE_STEPS") != nullptr;
  return on;
}

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

int cuda_device_count() { return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0; }

struct Generator::Impl {
  std::unique_ptr<SdxlModel> model;
  std::unique_ptr<UnetRunner> unet;
  std::unique_ptr<VaeCache> vaes;  // the VAEs tasks name; "" = the model's own
  std::unique_ptr<ControlNetCache> controlnets;
  std::unique_ptr<IpAdapterCache> ip_adapters;
  std::unique_ptr<UpscalerCache> upscalers;  // the upscaler folders of frames ("upscale") and the hires fix
  std::unique_ptr<DetectorCache> detectors;  // the detailer's detector folders (decode stage)
  Clock::time_point trace_last_call_end;  // SDXL_TRACE_STEPS (sampling stage only)
  VaeTiling vae_tiling = VaeTiling::kAuto;
  double load_s = 0;
  RuntimeOptions opts;
  // LoRA state (created on first use): the factor cache, the patcher holding the
  // originals of touched weights, and the set applied now.
  std::unique_ptr<LoraPatcher> patcher;
  std::unique_ptr<LoraCache> lora_cache;
  LoraRegistry lora_registry;
  std::vector<LoraRef> applied;
  std::vector<std::pair<std::string, std::string>> applied_hashes;
  std::map<std::string, std::string> embedding_hashes;  // loaded embedding name -> A1111 short hash
  // The pipeline's streams (see encode_batch) and the lock that keeps the
  // text and decode stages (shared) off the device while the sampling stage
  // captures a CUDA graph (exclusive).
  StageStream text_stream, sample_stream, decode_stream;
  std::shared_mutex device_mu;
  // The LoRA cache's counters as last published by the text stage, for
  // readers on other threads (progress, report).
  mutable std::mutex stats_mu;
  LoraStats stats_copy;
  void publish_lora_stats() {
    if (!lora_cache) return;
    std::lock_guard lk(stats_mu);
    stats_copy = lora_cache->stats();
  }

  void ensure_lora_state() {
    if (patcher) return;
    const MemorySnapshot m = device_memory_snapshot(model->device);
    const bool on_host = lora_originals_on_host(model->device.is_cuda(), m.limit);
    patcher = std::make_unique<LoraPatcher>(*model, on_host);
    if (model->device.is_cuda())
      spdlog::info("LoRA originals in {} memory (budget {:.1f} GiB)", on_host ? "pinned host" : "device",
                   m.limit / 1073741824.0);
    std::uint64_t budget = opts.lora_cache_bytes;
    if (budget == 0) budget = device_free_bytes(model->device) / 10 * 3;  // 30% of what the weights left free
    lora_cache = std::make_unique<LoraCache>(patcher->shapes(), model->device, budget, opts.lora_strict);
    spdlog::info("LoRA cache budget {:.1f} MiB{}", budget / 1048576.0, opts.lora_cache_bytes ? "" : " (30% of free memory)");
  }
};

namespace {

// TorchScript's executor settings are per thread (a thread_local in libtorch):
// set on the thread that loads the model, they would not reach the pipeline's
// stage threads, which would run the optimising profiling executor (seconds of
// graph optimisation per new shape; measured: docs/scheduling-and-memory.md#speed).
// Rule: every entry point that runs a module calls this first.
void apply_thread_settings(const RuntimeOptions& opts) { torch::jit::setGraphExecutorOptimize(opts.jit_optimize); }

}  // namespace

Generator::Generator(const std::filesystem::path& model_dir, const RuntimeOptions& opts) : impl_(std::make_unique<Impl>()) {
  const auto t0 = Clock::now();
  const ModelConfig cfg = with_unet_precision(load_model_config(model_dir), opts.precision, opts.dtype);
  const torch::Device device = parse_device(opts.device);
  if (cfg.unet_precision == "fp8") {
    if (const std::string why = fp8_unsupported_reason(device); !why.empty()) throw UsageError("--precision fp8: " + why);
    // The FP8 layers' path is fixed at trace time (scripts/fp8_quant.py): FP8 tensor cores when traced on CUDA, an
    // fp32 matmul when traced on the CPU.
    if (device.is_cuda() != (cfg.export_device == "cuda"))
      spdlog::warn("--precision fp8: {} was traced on {}, so on {} its FP8 layers run {}; export the model on the "
                   "device kind it runs on", cfg.unet_file, cfg.export_device, device.str(),
                   device.is_cuda() ? "as fp32 matmuls (no FP8 speed-up)" : "torch's reference FP8 loop (very slow)");
  }
  if (device.is_cuda()) configure_cuda_allocator(opts.cuda_allocator);
  // TorchScript's profiling executor re-optimises a graph after its first calls
  // (fusing pointwise ops), which changes fp16 results from about the 4th call
  // on: the same seed would give another image depending on its place in the
  // run. By default the graphs run as traced so every image is reproducible.
  apply_thread_settings(opts);
  at::globalContext().setBenchmarkCuDNN(opts.cudnn_benchmark);
  at::globalContext().setDeterministicCuDNN(opts.deterministic_cudnn);
  if (opts.threads > 0) at::set_num_threads(opts.threads);
  impl_->opts = opts;
  impl_->model = SdxlModel::load(cfg, device, opts.dtype);
  for (const EmbeddingFile& e : load_embeddings(*impl_->model, opts.embedding_dirs))
    impl_->embedding_hashes[e.name] = e.short_hash;
  impl_->unet = std::make_unique<UnetRunner>(*impl_->model, opts.cuda_graphs, opts.unet_backend, &impl_->device_mu);
  if (cfg.unet_precision == "fp8" && device.is_cuda() && std::string(impl_->unet->backend()) == "torchscript")
    spdlog::info("--precision fp8 on {} (TorchScript): less memory than the default UNet but slower, as its input "
                 "quantisation runs unfused; the speed comes with unet_fp8.pt2 (export_sdxl.py --fp8 --aoti)",
                 cfg.unet_file);
  impl_->text_stream = StageStream(device, /*high_priority=*/false);
  impl_->sample_stream = StageStream(device, /*high_priority=*/true);
  impl_->decode_stream = StageStream(device, /*high_priority=*/false);
  impl_->vae_tiling = parse_vae_tiling(opts.vae_tiling);
  set_vae_decode_dtype(*impl_->model, opts.vae_dtype);
  attach_vae_decoder_aoti(*impl_->model, opts.vae_backend);
  impl_->vaes = std::make_unique<VaeCache>(*impl_->model, opts.vae_dtype, opts.vae_cache);
  impl_->controlnets = std::make_unique<ControlNetCache>(*impl_->model, opts.controlnet_cache);
  impl_->ip_adapters = std::make_unique<IpAdapterCache>(*impl_->model, opts.ip_adapter_cache, opts.ip_image_cache);
  impl_->upscalers = std::make_unique<UpscalerCache>(device, opts.upscaler_cache);
  impl_->detectors = std::make_unique<DetectorCache>(device, opts.detector_cache);
  device_synchronize(device);
  impl_->load_s = seconds_since(t0);
  spdlog::info("loaded model '{}' ({}, {}{}) on {} in {:.2f} s", cfg.name, cfg.source, dtype_name(impl_->model->dtype),
               cfg.unet_precision.empty() ? "" : ", UNet " + cfg.unet_precision, device.str(), impl_->load_s);
}

ImageSources model_sources(const ModelConfig& mc) {
  ImageSources s;
  s.model_name = mc.name;
  s.unet_precision = mc.unet_precision;
  if (mc.source_file.recorded()) s.model_hash = mc.source_file.short_hash();
  s.zero_terminal_snr = mc.scheduler.rescale_betas_zero_snr;
  if (mc.vae_file.recorded()) {
    s.vae_hash = mc.vae_file.short_hash();
    s.vae_name = mc.vae_file.name;
  }
  return s;
}

void add_image_sources(ImageSources& sources, const GenerationParams& p, const GeneratedImage& img) {
  sources.lora_hashes = img.lora_hashes;
  sources.ti_hashes = img.ti_hashes;
  sources.controlnets = img.controlnets;
  sources.ip_adapter_name = img.ip_adapter_name;
  sources.ip_adapter_hash = img.ip_adapter_hash;
  sources.ip_images = img.ip_images;
  sources.upscaler_name = img.upscaler_name;
  sources.detailer_models = img.detailer_models;
  if (p.vae.empty()) return;
  sources.vae_name = img.vae_name;
  sources.vae_hash = img.vae_hash;
}

Generator::~Generator() = default;

const ModelConfig& Generator::model() const { return impl_->model->config; }
std::string Generator::device_name() const { return impl_->model->device.str(); }
double Generator::load_seconds() const { return impl_->load_s; }
std::uint64_t Generator::peak_memory_bytes() const { return device_peak_bytes(impl_->model->device); }
std::uint64_t Generator::memory_in_use_bytes() const { return device_memory_in_use(impl_->model->device); }

void Generator::set_lora_registry(LoraRegistry registry) { impl_->lora_registry = std::move(registry); }

namespace {

// A folder cache's counters as "<prefix>_loads", "_hits", "_evictions", "_resident_mib" (once it loaded one).
void add_cache_counters(std::map<std::string, double>& c, const std::string& prefix, const LruCacheStats& s) {
  if (s.loads == 0) return;
  c[prefix + "_loads"] = s.loads;
  c[prefix + "_hits"] = s.hits;
  c[prefix + "_evictions"] = s.evictions;
  c[prefix + "_resident_mib"] = static_cast<double>(s.resident_bytes) / 1048576.0;
}

}  // namespace

std::map<std::string, double> Generator::engine_counters() const {
  const UnetRunner& u = *impl_->unet;
  std::map<std::string, double> c{{"unet_graph_captures", u.captures()},
                                  {"unet_graph_replays", u.replays()},
                                  {"unet_graphs_held", u.graphs_held()},
                                  {"unet_first_call_s", u.first_call_seconds()},
                                  {"unet_capture_s", u.capture_seconds()}};
  if (std::string(u.backend()) == "aoti") {
    c["unet_aoti_calls"] = u.aoti_calls();
    c["unet_aoti_fallback_calls"] = u.fallback_calls();
  }
  if (impl_->model->vae_decoder_aoti) {
    c["vae_aoti_decodes"] = impl_->model->vae_aoti_decodes.load();
    if (const int n = impl_->vaes->aoti_decodes(); n > 0) c["vae_folder_aoti_decodes"] = n;
  }
  add_cache_counters(c, "vae_cache", impl_->vaes->stats());
  add_cache_counters(c, "controlnet_cache", impl_->controlnets->stats());
  add_cache_counters(c, "ip_adapter_cache", impl_->ip_adapters->adapter_stats());
  add_cache_counters(c, "ip_image_cache", impl_->ip_adapters->image_stats());  // loads: reference images encoded
  add_cache_counters(c, "upscaler_cache", impl_->upscalers->stats());
  add_cache_counters(c, "detector_cache", impl_->detectors->stats());
  return c;
}

LoraStats Generator::lora_stats() const {
  std::lock_guard lk(impl_->stats_mu);
  return impl_->stats_copy;
}

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
  stream_synchronize(im.model->device);
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
  im.publish_lora_stats();
  return hashes;
}

GeneratedImage Generator::generate(const GenerationParams& p) { return generate_batch({p}).front(); }

namespace {

// Images that share a UNet call have one batch group key (batch/task_keys.h: every key that splits
// a batch); the scheduler groups them by it.
void check_compatible(const std::vector<GenerationParams>& ps) {
  const std::string key = batch_group_key(ps.front());
  for (const auto& b : ps)
    if (batch_group_key(b) != key)
      throw UsageError("a batch mixes settings that split a UNet call (" + key + " and " + batch_group_key(b) +
                       "); group images by batch_group_key()");
}

// pos and neg: the tokens of the first scheduled text (the prompt as written
// when it has no edits); with prompt editing, the other texts' in *_rest.
struct TextInputs {
  SdxlPromptTokens pos, neg;
  bool neg_text = false;
  size_t chunks = 1;
  // Each region's prompt and (with CFG, when it has text) negative; a region without its own negative
  // text takes the task's.
  std::vector<SdxlPromptTokens> region_pos, region_neg;
  std::vector<bool> region_neg_text;
  PassSchedules pos_schedules, neg_schedules;
  std::vector<SdxlPromptTokens> pos_rest, neg_rest;
  bool edited() const { return !pos_rest.empty() || !neg_rest.empty(); }
};

}  // namespace

// Images whose prompts need different chunk counts cannot share a context
// tensor (padding one to the other's length would change its image): they
// run as separate sub-batches, in order.
struct SubBatch {
  std::vector<size_t> idx;        // into the batch's params
  std::vector<std::int64_t> seeds;
  torch::Tensor context, pooled;  // CFG order [negatives, positives]
  std::vector<torch::Tensor> ip_kv;  // the IP-Adapter's keys and values per layer, in the same row order
  // With a row that has regions: context is [rows, prompts, L, C] (the task's prompt, then each region's,
  // padded with copies of the first to `prompts`), and ip_kv holds masked groups [rows, groups, T, C]
  // whose masks are made per pass size (pipeline/region_weights.h). 0: the plain path.
  std::int64_t prompts = 0;
  std::int64_t ip_groups = 0;
  std::vector<std::vector<const RegionUse*>> ip_group_regions;  // per row (sub order): each group's region, null = all
  StepConditioning steps;            // prompt editing: each call's context and pooled (off without edits)
  torch::Tensor latents;          // after sampling
};

struct EncodedBatch {
  std::vector<GenerationParams> params;
  std::vector<SubBatch> subs;
  std::vector<RgbImage> init_images;
  // Inpainting: each image's mask on the latent grid (inpaint_latent_mask), row-major.
  std::vector<std::vector<float>> latent_masks;
  // A 9-channel inpainting UNet: each image's mask at its size (inpaint_pixel_mask),
  // which zeroes the repainted pixels of the masked image it is given.
  std::vector<std::vector<std::uint8_t>> pixel_masks;
  // "Only masked": per image its crop box, the whole init image and the blurred
  // mask's grey values at the task's size, to paste the result back (empty for "whole").
  struct Overlay {
    CropBox box;
    RgbImage init;
    std::vector<std::uint8_t> mask_grey;
  };
  std::vector<std::optional<Overlay>> overlays;
  // The batch's ControlNets (loaded on the text stage) and each one's control image per image.
  std::vector<std::shared_ptr<ControlNet>> controlnets;
  std::vector<std::vector<RgbImage>> control_images;  // [ControlNet][image]
  SamplerPlan plan, hires_plan;
  bool cfg_on = false, img2img = false, inpaint = false;
  bool inpaint_unet = false;  // inpaint with a 9-channel UNet: no step blend, the mask and masked image as input
  std::vector<GeneratedImage> out;  // LoRA hashes and text seconds filled in
  StageEvent ready;                 // on the text stream, after the last encoder kernel
};

struct SampledBatch {
  std::shared_ptr<EncodedBatch> encoded;
  int out_w = 0, out_h = 0;
  StageEvent ready;  // on the sample stream, after the last sampling kernel
};

void Generator::prefetch_loras(const std::vector<GenerationParams>& ps) {
  Impl& im = *impl_;
  std::vector<LoraRef> loras;
  if (!ps.empty()) {
    loras = merge_lora_tags(ps.front().loras, extract_lora_tags(ps.front().prompt).tags, im.lora_registry,
                            im.opts.lora_dirs);
  }
  if (loras.empty() || loras == im.applied) return;
  im.ensure_lora_state();
  const StageStream::Scope on(im.text_stream);
  std::vector<std::string> keep;
  for (const auto& r : im.applied) keep.push_back(lora_cache_key(r.path));
  for (const auto& r : loras) keep.push_back(lora_cache_key(r.path));
  translate_device_errors(nullptr, [&] {
    LoraPatcher::Applied set;
    for (const auto& r : loras) set.emplace_back(im.lora_cache->get(r, keep), r.weight);
    // A set's first use pins host memory and copies the originals, ahead too.
    // Like the uploads above it runs beside a capture (thread-local, on
    // another stream) instead of holding device_mu for the seconds that
    // pinning takes, which would hold the capture and the device up.
    im.patcher->keep_originals(set);
    return 0;
  });
  im.publish_lora_stats();
}

namespace {

// The batch's LoRA set (its parameters plus the prompts' tags, which leave the
// text in `prompts`, merged by merge_lora_tags); every image of a batch must use the same set.
std::vector<LoraRef> batch_lora_set(const std::vector<GenerationParams>& ps, const LoraRegistry& registry,
                                    const std::vector<std::filesystem::path>& dirs, std::vector<std::string>& prompts) {
  prompts.resize(ps.size());
  std::vector<LoraRef> loras;
  for (size_t i = 0; i < ps.size(); ++i) {
    const PromptLoras tagged = extract_lora_tags(ps[i].prompt);
    const std::vector<LoraRef> mine = merge_lora_tags(ps[i].loras, tagged.tags, registry, dirs);
    if (i == 0) loras = mine;
    else if (!(mine == loras))
      throw UsageError("a batch mixes LoRA sets; group images by batch_group_key()");
    prompts[i] = tagged.text;
  }
  return loras;
}

// Logs a warning the first time this process meets it ("" is no warning).
void warn_once(const std::string& warning) {
  static std::mutex mu;
  static std::set<std::string> seen;
  if (warning.empty()) return;
  const std::lock_guard lock(mu);
  if (seen.insert(warning).second) spdlog::warn("{}", warning);
}

// Each ControlNet's control image per image (the files are read now; they are
// resized to each pass's size on the sampling stage).
void read_control_images(EncodedBatch& eb) {
  const std::vector<GenerationParams>& ps = eb.params;
  const size_t n = ps.front().controlnets.size();
  eb.control_images.assign(n, std::vector<RgbImage>(ps.size()));
  for (size_t k = 0; k < n; ++k)
    for (size_t i = 0; i < ps.size(); ++i) {
      const std::string& path = ps[i].controlnets[k].image;
      eb.control_images[k][i] = read_png_rgb(path, "control image");
      warn_once(control_aspect_note(path, eb.control_images[k][i], ps[i].width, ps[i].height));
    }
}

// "Only masked" (StableDiffusionXLInpaintPipeline with padding_mask_crop): the
// mask blurred and at the task's size, the crop box around it, and the init
// image and the mask cut to the box and filled to the task's size (resize_mode
// "fill"). The whole init image and the blurred mask are kept for the paste-back.
RgbImage crop_for_inpainting(const GenerationParams& p, const RgbImage& mask, RgbImage& init,
                             std::optional<EncodedBatch::Overlay>& overlay) {
  const int w = p.width, h = p.height;
  std::vector<std::uint8_t> blurred = gaussian_blur_rgb8(mask.rgb.data(), mask.width, mask.height, p.mask_blur);
  if (mask.width != w || mask.height != h) blurred = resize_lanczos_rgb8(blurred.data(), mask.width, mask.height, w, h);
  EncodedBatch::Overlay o;
  o.mask_grey = grey_of_rgb8(blurred.data(), w, h);
  o.box = mask_crop_region(o.mask_grey, w, h, w, h, p.inpaint_padding);
  const std::vector<std::uint8_t> mask_crop = crop_rgb8(blurred.data(), w, o.box);
  const std::vector<std::uint8_t> init_crop = crop_rgb8(init.rgb.data(), w, o.box);
  o.init = init;
  init.rgb = resize_and_fill_rgb8(init_crop.data(), o.box.width(), o.box.height(), w, h);
  overlay = std::move(o);
  return {w, h, resize_and_fill_rgb8(mask_crop.data(), overlay->box.width(), overlay->box.height(), w, h)};
}

// Inpainting: each image's mask, blurred, resized, binarised and on the latent
// grid as StableDiffusionXLInpaintPipeline prepares it. A mask that marks
// nothing after that (a thin stroke that the blur fades below 0.5) is refused.
void read_inpaint_masks(const ModelConfig& cfg, EncodedBatch& eb) {
  eb.inpaint = eb.params.front().inpaint();
  if (cfg.inpainting_unet() && !eb.inpaint)
    throw UsageError(unmasked_task_on_inpainting_unet(cfg));
  if (!eb.inpaint) return;
  eb.inpaint_unet = cfg.inpainting_unet();
  eb.overlays.resize(eb.params.size());
  for (size_t i = 0; i < eb.params.size(); ++i) {
    const GenerationParams& p = eb.params[i];
    RgbImage mask = p.mask_pixels ? RgbImage{p.mask_pixels->width, p.mask_pixels->height, p.mask_pixels->rgb}
                                  : read_png_rgb(p.mask, "mask");
    int blur = p.mask_blur;
    if (p.inpaint_masked()) {
      mask = crop_for_inpainting(p, mask, eb.init_images[i], eb.overlays[i]);
      blur = 0;  // blurred before the crop
    }
    std::vector<std::uint8_t> pixels = inpaint_pixel_mask(mask, blur, p.width, p.height);
    const std::vector<float> m = latent_mask_of_pixels(pixels, p.width, p.height, cfg.vae_downsample);
    if (std::none_of(m.begin(), m.end(), [](float v) { return v > 0; }))
      throw UsageError("mask '" + p.mask + "' marks nothing to repaint after its blur of " +
                       std::to_string(p.mask_blur) + " and the resize to the latent grid (widen it, or lower mask_blur)");
    eb.latent_masks.push_back(m);
    if (eb.inpaint_unet) eb.pixel_masks.push_back(std::move(pixels));
  }
}

// Sizes, the sampler plans (img2img strength, hires pass) and the init images.
void plan_batch_sampling(const ModelConfig& cfg, EncodedBatch& eb) {
  const std::vector<GenerationParams>& ps = eb.params;
  const GenerationParams& p0 = ps.front();
  for (const auto& p : ps) {
    warn_once(check_task_size(cfg, p));
    if (const std::string why = regions_problem(cfg, p); !why.empty()) throw UsageError("regions: " + why);
  }
  check_generation_size(cfg, p0.width, p0.height, static_cast<int>(ps.size()));
  const SamplerChoice choice = parse_sampler_choice(p0.sampler, p0.schedule);
  eb.plan = make_sampler_plan(cfg.scheduler, choice, p0.steps, p0.timesteps);
  eb.plan.eta = p0.eta;
  eb.img2img = !p0.init_image.empty();
  if (eb.img2img) plan_apply_strength(eb.plan, p0.strength);
  if (p0.hires_on()) {
    // The hires pass spaces its own steps (a timestep list is the first pass's).
    eb.hires_plan = make_sampler_plan(cfg.scheduler, choice, p0.hires_steps());
    eb.hires_plan.eta = p0.eta;
    plan_apply_strength(eb.hires_plan, p0.hires.denoise);
  }
  if (eb.img2img) {
    eb.init_images.resize(ps.size());
    for (size_t i = 0; i < ps.size(); ++i) {
      const GenerationParams& p = ps[i];
      eb.init_images[i] = p.init_pixels ? RgbImage{p.init_pixels->width, p.init_pixels->height, p.init_pixels->rgb}
                                        : read_png_rgb(p.init_image);
      const std::string why = init_size_problem(eb.init_images[i].width, eb.init_images[i].height, p.width, p.height);
      if (!why.empty()) throw UsageError("init image '" + p.init_image + "' " + why);
    }
  }
  read_inpaint_masks(cfg, eb);
  read_control_images(eb);
  eb.cfg_on = p0.cfg > 1.0;
}

// A row's region prompts and negatives (a region without negative text of its own takes the task's).
void tokenize_regions(SdxlModel& m, bool cfg_on, const GenerationParams& p, TextInputs& ti) {
  for (const RegionUse& r : p.regions) {
    ti.region_pos.push_back(tokenize_sdxl_prompt(m, r.prompt));
    for (const auto& w : ti.region_pos.back().warnings)
      spdlog::warn("region prompt, character {}: {}", w.position, w.message);
    ti.chunks = std::max(ti.chunks, ti.region_pos.back().chunk_count());
    const bool own = cfg_on && !r.negative.empty();
    ti.region_neg_text.push_back(own);
    ti.region_neg.push_back(own ? tokenize_sdxl_prompt(m, r.negative) : SdxlPromptTokens{});
    if (own) ti.chunks = std::max(ti.chunks, ti.region_neg.back().chunk_count());
  }
}

// A prompt's schedules over the batch's passes (A1111 counts a pass's steps in
// model calls: its whole plan's, before an img2img strength skips some) and
// each distinct text tokenized: the first into `first`, the others into `rest`.
void tokenize_scheduled(const SdxlModel& m, const EncodedBatch& eb, const std::string& prompt, const char* what,
                        PassSchedules& schedules, SdxlPromptTokens& first, std::vector<SdxlPromptTokens>& rest) {
  const int hires_calls = eb.params.front().hires_on() ? static_cast<int>(eb.hires_plan.timesteps.size()) : 0;
  try {
    schedules = pass_schedules(prompt, static_cast<int>(eb.plan.timesteps.size()), hires_calls);
  } catch (const UsageError& e) {
    throw UsageError(std::string(what) + ": " + e.what());
  }
  for (size_t k = 0; k < schedules.texts.size(); ++k) {
    SdxlPromptTokens t = tokenize_sdxl_prompt(m, schedules.texts[k]);
    for (const auto& w : t.warnings) spdlog::warn("{}, character {}: {}", what, w.position, w.message);
    if (k == 0)
      first = std::move(t);
    else
      rest.push_back(std::move(t));
  }
}

// Tokenizes every prompt first, so an over-long prompt fails before any device work.
std::vector<TextInputs> tokenize_batch(SdxlModel& m, const EncodedBatch& eb, const std::vector<std::string>& prompts) {
  const ModelConfig& cfg = m.config;
  std::vector<TextInputs> text(eb.params.size());
  for (size_t i = 0; i < eb.params.size(); ++i) {
    TextInputs& ti = text[i];
    tokenize_scheduled(m, eb, prompts[i], "prompt", ti.pos_schedules, ti.pos, ti.pos_rest);
    ti.chunks = ti.pos.chunk_count();
    for (const SdxlPromptTokens& t : ti.pos_rest) ti.chunks = std::max(ti.chunks, t.chunk_count());
    ti.neg_text = eb.cfg_on && !eb.params[i].negative_prompt.empty();
    if (ti.neg_text) {
      tokenize_scheduled(m, eb, eb.params[i].negative_prompt, "negative prompt", ti.neg_schedules, ti.neg, ti.neg_rest);
      ti.chunks = std::max(ti.chunks, ti.neg.chunk_count());
      for (const SdxlPromptTokens& t : ti.neg_rest) ti.chunks = std::max(ti.chunks, t.chunk_count());
    } else if (eb.cfg_on) {
      ti.neg_schedules = pass_schedules("", 1, eb.params[i].hires_on() ? 1 : 0);  // the zero embedding throughout
    }
    tokenize_regions(m, eb.cfg_on, eb.params[i], ti);
    if (ti.edited() && eb.params[i].has_regions())
      throw UsageError("prompt editing ([from:to:when], [a|b]) cannot be combined with \"regions\"");
    if (ti.chunks > static_cast<size_t>(cfg.limits.context_chunks_max))
      throw UsageError("the prompt needs " + std::to_string(ti.chunks) + " chunks of 75 tokens; model '" + cfg.name +
                       "' was checked for at most " + std::to_string(cfg.limits.context_chunks_max) +
                       " (model.json /limits/context_chunks_max): shorten the prompt (see `sdxl-batch tokens`)");
  }
  return text;
}

// The embeddings an image's prompt and encoded negative prompt use, as A1111
// writes them: name without ':' and ',', short hash; in order of first use.
std::vector<std::pair<std::string, std::string>> used_embedding_hashes(const SdxlModel& m, const TextInputs& ti,
                                                                      const std::map<std::string, std::string>& hashes) {
  std::vector<std::string> names;
  collect_used_embeddings(*m.tokenizer, ti.pos.te1, names);
  for (const SdxlPromptTokens& t : ti.pos_rest) collect_used_embeddings(*m.tokenizer, t.te1, names);
  if (ti.neg_text) collect_used_embeddings(*m.tokenizer, ti.neg.te1, names);
  if (ti.neg_text)
    for (const SdxlPromptTokens& t : ti.neg_rest) collect_used_embeddings(*m.tokenizer, t.te1, names);
  std::vector<std::pair<std::string, std::string>> out;
  for (std::string name : names) {
    const auto it = hashes.find(name);
    if (it == hashes.end()) continue;
    std::erase_if(name, [](char c) { return c == ':' || c == ','; });
    out.emplace_back(name, it->second);
  }
  return out;
}

// Images with the same chunk count share a sub-batch, in order; edited prompts (their conditioning
// picked per call) and plain ones (which may carry regions) go apart.
std::vector<SubBatch> group_by_chunks(const std::vector<GenerationParams>& ps, const std::vector<TextInputs>& text) {
  std::vector<SubBatch> subs;
  std::vector<bool> grouped(ps.size(), false);
  for (size_t first = 0; first < ps.size(); ++first) {
    if (grouped[first]) continue;
    SubBatch sub;
    for (size_t i = first; i < ps.size(); ++i)
      if (!grouped[i] && text[i].chunks == text[first].chunks && text[i].edited() == text[first].edited())
        sub.idx.push_back(i);
    for (size_t i : sub.idx) {
      grouped[i] = true;
      sub.seeds.push_back(ps[i].seed);
    }
    subs.push_back(std::move(sub));
  }
  return subs;
}

// One row's prompts stacked [1, prompts, L, C]: `base`, then each region's, then copies of `base`.
torch::Tensor stack_prompts(const torch::Tensor& base, const std::vector<torch::Tensor>& regions, std::int64_t prompts) {
  std::vector<torch::Tensor> all{base};
  all.insert(all.end(), regions.begin(), regions.end());
  while (static_cast<std::int64_t>(all.size()) < prompts) all.push_back(base);
  return torch::stack(all, 1);
}

// Row i's encodings: its prompt, negative (with CFG) and, in a sub-batch with regions, each region's
// (regional, stacked to sub.prompts).
struct RowEmbeds {
  torch::Tensor ctx_pos, ctx_neg, pool_pos, pool_neg;
};

RowEmbeds encode_row(SdxlModel& m, const EncodedBatch& eb, size_t i, TextInputs& ti, std::int64_t prompts) {
  pad_sdxl_prompt(m, ti.pos, ti.chunks);
  const int clip_skip = eb.params[i].clip_skip;
  const PromptEmbeds pos = encode_prompt_tokens(m, ti.pos, clip_skip);
  RowEmbeds row{pos.context, {}, pos.pooled, {}};
  PromptEmbeds neg;
  if (eb.cfg_on) {
    neg = zero_embeds(pos);
    if (ti.neg_text) {
      pad_sdxl_prompt(m, ti.neg, ti.chunks);
      neg = encode_prompt_tokens(m, ti.neg, clip_skip);
    }
    row.ctx_neg = neg.context;
    row.pool_neg = neg.pooled;
  }
  if (prompts == 0) return row;
  std::vector<torch::Tensor> rpos, rneg;
  for (size_t k = 0; k < ti.region_pos.size(); ++k) {
    pad_sdxl_prompt(m, ti.region_pos[k], ti.chunks);
    rpos.push_back(encode_prompt_tokens(m, ti.region_pos[k], clip_skip).context);
    if (!eb.cfg_on) continue;
    if (!ti.region_neg_text[k]) {
      rneg.push_back(neg.context);
      continue;
    }
    pad_sdxl_prompt(m, ti.region_neg[k], ti.chunks);
    rneg.push_back(encode_prompt_tokens(m, ti.region_neg[k], clip_skip).context);
  }
  row.ctx_pos = stack_prompts(row.ctx_pos, rpos, prompts);
  if (eb.cfg_on) row.ctx_neg = stack_prompts(row.ctx_neg, rneg, prompts);
  return row;
}

// Every scheduled text of an image encoded, padded to the image's chunk count.
ImageTextSteps encode_image_steps(SdxlModel& m, bool cfg_on, TextInputs& ti, int clip_skip) {
  ImageTextSteps im;
  auto encode_all = [&](SdxlPromptTokens& first, std::vector<SdxlPromptTokens>& rest, std::vector<PromptEmbeds>& out) {
    pad_sdxl_prompt(m, first, ti.chunks);
    out.push_back(encode_prompt_tokens(m, first, clip_skip));
    for (SdxlPromptTokens& t : rest) {
      pad_sdxl_prompt(m, t, ti.chunks);
      out.push_back(encode_prompt_tokens(m, t, clip_skip));
    }
  };
  encode_all(ti.pos, ti.pos_rest, im.pos);
  if (cfg_on && ti.neg_text) encode_all(ti.neg, ti.neg_rest, im.neg);
  if (cfg_on && !ti.neg_text) im.neg.push_back(zero_embeds(im.pos.front()));
  im.pos_schedules = ti.pos_schedules;
  im.neg_schedules = ti.neg_schedules;
  return im;
}

// Text conditioning (A1111 prompt rules), per image so an image's embedding
// never depends on its batch; CFG order [negatives, positives]. A sub-batch
// with an edited prompt gets its conditioning per call (sub.steps).
void encode_sub_batches(SdxlModel& m, EncodedBatch& eb, std::vector<TextInputs>& text) {
  for (SubBatch& sub : eb.subs) {
    if (std::any_of(sub.idx.begin(), sub.idx.end(), [&](size_t i) { return text[i].edited(); })) {
      for (size_t i : sub.idx) sub.steps.add_image(encode_image_steps(m, eb.cfg_on, text[i], eb.params[i].clip_skip));
      sub.steps.select(0, 0, eb.cfg_on, sub.context, sub.pooled);
      continue;
    }
    size_t most = 0;
    bool regional = false;
    for (size_t i : sub.idx) {
      most = std::max(most, eb.params[i].regions.size());
      regional |= eb.params[i].has_regions();
    }
    sub.prompts = regional ? static_cast<std::int64_t>(most) + 1 : 0;
    std::vector<torch::Tensor> ctx_pos, ctx_neg, pool_pos, pool_neg;
    for (size_t i : sub.idx) {
      RowEmbeds row = encode_row(m, eb, i, text[i], sub.prompts);
      ctx_pos.push_back(row.ctx_pos);
      pool_pos.push_back(row.pool_pos);
      if (eb.cfg_on) {
        ctx_neg.push_back(row.ctx_neg);
        pool_neg.push_back(row.pool_neg);
      }
    }
    sub.context = torch::cat(ctx_pos);
    sub.pooled = torch::cat(pool_pos);
    if (eb.cfg_on) {
      sub.context = torch::cat({torch::cat(ctx_neg), sub.context});
      sub.pooled = torch::cat({torch::cat(pool_neg), sub.pooled});
    }
  }
}

// Each image's IP-Adapter keys and values (its reference images' tokens in
// order), and the negative's (one copy of the adapter's per reference image).
// Its values are multiplied by its scale: diffusers adds scale * attention(q, k, v),
// which is attention(q, k, scale * v).
struct IpRows {
  std::vector<std::vector<torch::Tensor>> pos, neg;  // [image][k_0, v_0, ...]
};

IpRows ip_adapter_rows(IpAdapterCache& cache, const EncodedBatch& eb, std::vector<GeneratedImage>& out) {
  const std::shared_ptr<IpAdapter> ip = cache.get(eb.params.front().ip_adapter.model);
  const IpAdapterConfig& cfg = ip->config();
  IpRows rows;
  for (size_t i = 0; i < eb.params.size(); ++i) {
    const IpAdapterUse& use = eb.params[i].ip_adapter;
    std::vector<std::shared_ptr<IpImageKv>> refs;
    std::vector<const std::vector<torch::Tensor>*> pos_parts, neg_parts;
    GeneratedImage& g = out[i];
    g.ip_adapter_name = cfg.display_name();
    g.ip_adapter_hash = cfg.short_hash();
    for (const std::string& path : use.images) {
      refs.push_back(cache.image(ip, path));
      pos_parts.push_back(&refs.back()->kv);
      neg_parts.push_back(&ip->negative_kv());
      g.ip_images.emplace_back(std::filesystem::path(path).filename().string(), refs.back()->sha256.substr(0, 10));
    }
    rows.pos.push_back(concat_image_kv(pos_parts));
    rows.neg.push_back(concat_image_kv(neg_parts));
    for (std::vector<torch::Tensor>* kv : {&rows.pos.back(), &rows.neg.back()})
      for (size_t l = 1; l < kv->size(); l += 2) (*kv)[l] = (*kv)[l] * use.scale;
  }
  return rows;
}

// A masked IP-Adapter group of a row with regions: one reference picture's keys and values (values
// times its scale), the negative's, and the region it acts in (null: the whole panel, the task's own
// images). Each group is its own attention, masked (diffusers' ip_adapter_masks).
struct IpGroup {
  std::vector<torch::Tensor> pos, neg;
  const RegionUse* region = nullptr;
};

std::vector<std::vector<IpGroup>> regional_ip_groups(IpAdapterCache& cache, const EncodedBatch& eb,
                                                     std::vector<GeneratedImage>& out) {
  const std::shared_ptr<IpAdapter> ip = cache.get(eb.params.front().ip_adapter.model);
  std::vector<std::vector<IpGroup>> rows(eb.params.size());
  for (size_t i = 0; i < eb.params.size(); ++i) {
    const GenerationParams& p = eb.params[i];
    out[i].ip_adapter_name = ip->config().display_name();
    out[i].ip_adapter_hash = ip->config().short_hash();
    const auto add = [&](const std::string& path, double scale, const RegionUse* region) {
      const std::shared_ptr<IpImageKv> ref = cache.image(ip, path);
      IpGroup g{ref->kv, ip->negative_kv(), region};
      for (size_t l = 1; l < g.pos.size(); l += 2) {
        g.pos[l] = g.pos[l] * scale;
        g.neg[l] = g.neg[l] * scale;
      }
      rows[i].push_back(std::move(g));
      out[i].ip_images.emplace_back(std::filesystem::path(path).filename().string(), ref->sha256.substr(0, 10));
    };
    for (const std::string& path : p.ip_adapter.images) add(path, p.ip_adapter.scale, nullptr);
    for (const RegionUse& r : p.regions)
      if (!r.reference.empty()) add(r.reference, r.reference_scale, &r);
  }
  return rows;
}

// A sub-batch with regions: each layer's keys and values [rows, groups, T, C] (rows in CFG order, a row's
// missing groups zero: masked out), and each row's groups' regions for their masks.
void bind_regional_ip(const EncodedBatch& eb, const std::vector<std::vector<IpGroup>>& groups, SubBatch& sub) {
  std::int64_t most = 1;
  for (size_t i : sub.idx) most = std::max<std::int64_t>(most, static_cast<std::int64_t>(groups[i].size()));
  sub.ip_groups = most;
  const size_t layers2 = groups[sub.idx.front()].empty() ? 0 : groups[sub.idx.front()].front().pos.size();
  const auto row_kv = [&](size_t i, size_t l, bool negative) {
    std::vector<torch::Tensor> parts;
    for (const IpGroup& g : groups[i]) parts.push_back(negative ? g.neg[l] : g.pos[l]);
    torch::Tensor row = torch::stack(parts, 1);  // [1, groups, T, C]
    if (row.size(1) < most) {
      auto shape = row.sizes().vec();
      shape[1] = most - row.size(1);
      row = torch::cat({row, torch::zeros(shape, row.options())}, 1);
    }
    return row;
  };
  sub.ip_kv.assign(layers2, torch::Tensor());
  for (size_t l = 0; l < layers2; ++l) {
    std::vector<torch::Tensor> parts;
    if (eb.cfg_on)
      for (size_t i : sub.idx) parts.push_back(row_kv(i, l, true));
    for (size_t i : sub.idx) parts.push_back(row_kv(i, l, false));
    sub.ip_kv[l] = torch::cat(parts);
  }
  sub.ip_group_regions.clear();
  for (size_t i : sub.idx) {
    sub.ip_group_regions.emplace_back();
    for (const IpGroup& g : groups[i]) sub.ip_group_regions.back().push_back(g.region);
  }
}

// The sub-batches' IP-Adapter rows, in the context's CFG order [negatives, positives].
void bind_ip_adapter(IpAdapterCache& cache, EncodedBatch& eb) {
  if (!eb.params.front().ip_adapter.on()) return;
  if (eb.params.front().has_regions()) {  // the group key keeps such panels together (task_keys.cpp)
    const std::vector<std::vector<IpGroup>> groups = regional_ip_groups(cache, eb, eb.out);
    for (SubBatch& sub : eb.subs) bind_regional_ip(eb, groups, sub);
    return;
  }
  const IpRows rows = ip_adapter_rows(cache, eb, eb.out);
  for (SubBatch& sub : eb.subs) {
    const size_t layers2 = rows.pos[sub.idx.front()].size();
    sub.ip_kv.resize(layers2);
    for (size_t l = 0; l < layers2; ++l) {
      std::vector<torch::Tensor> parts;
      if (eb.cfg_on)
        for (size_t i : sub.idx) parts.push_back(rows.neg[i][l]);
      for (size_t i : sub.idx) parts.push_back(rows.pos[i][l]);
      sub.ip_kv[l] = torch::cat(parts);
    }
  }
}

}  // namespace

std::shared_ptr<EncodedBatch> Generator::encode_batch(const std::vector<GenerationParams>& ps) {
  if (ps.empty()) throw UsageError("an empty batch");
  check_compatible(ps);
  Impl& im = *impl_;
  apply_thread_settings(im.opts);
  SdxlModel& m = *im.model;
  auto eb = std::make_shared<EncodedBatch>();
  eb->params = ps;
  std::vector<std::string> prompts;
  const std::vector<LoraRef> loras = batch_lora_set(ps, im.lora_registry, im.opts.lora_dirs, prompts);
  plan_batch_sampling(m.config, *eb);
  std::vector<TextInputs> text = tokenize_batch(m, *eb, prompts);
  const StageStream::Scope on(im.text_stream);
  std::shared_lock device_lock(im.device_mu);  // not while a CUDA graph is being captured
  const auto t_lora = Clock::now();
  // e.g. no room for the LoRA factors under --vram-limit: an out-of-memory
  const std::vector<std::pair<std::string, std::string>> lora_hashes =
      translate_device_errors("applying LoRAs", [&] { return set_loras(loras); });
  const double lora_s = seconds_since(t_lora);
  std::vector<std::pair<std::string, std::string>> cn_names;
  for (const ControlNetUse& c : ps.front().controlnets) {
    eb->controlnets.push_back(translate_device_errors("loading a ControlNet", [&] { return im.controlnets->get(c.model); }));
    const ControlNetConfig& cc = eb->controlnets.back()->config();
    if (const std::string why = control_type_problem(cc, c.type); !why.empty())  // as validate says it
      throw UsageError("ControlNet " + std::to_string(cn_names.size()) + ": \"type\" " + why);
    cn_names.emplace_back(cc.display_name(), cc.short_hash());
  }
  eb->out.resize(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    GeneratedImage& g = eb->out[i];
    g.lora_hashes = lora_hashes;
    g.lora_s = lora_s / static_cast<double>(ps.size());
    g.ti_hashes = used_embedding_hashes(m, text[i], im.embedding_hashes);
    g.controlnets = cn_names;
  }
  eb->subs = group_by_chunks(ps, text);
  translate_device_errors(nullptr, [&] {
    c10::InferenceMode inference;
    const auto t0 = Clock::now();
    encode_sub_batches(m, *eb, text);
    bind_ip_adapter(*im.ip_adapters, *eb);
    eb->ready = im.text_stream.record();
    stamp_stage(m.device, t0, eb->out, &StageSeconds::text);
    return 0;
  });
  return eb;
}

namespace {

// A ControlNet call in one pass: its module, and per control image (one, or a
// Union ControlNet's several of one call) the images at the pass's size (CFG
// order [negatives, positives], as diffusers doubles them), its type's index
// (a Union ControlNet's; none for a plain one), strength and window.
struct ActiveControl {
  ControlNet* net = nullptr;
  std::vector<torch::Tensor> conds;
  std::vector<std::int64_t> types;
  std::vector<double> strength, start, end;
};

// What the sampling of one sub-batch needs from the generator.
struct SubSampling {
  SdxlModel& m;
  UnetRunner& unet;
  VaeCache& vaes;  // the VAE of each image's task (img2img encode, pixel-space hires fix)
  UpscalerCache& upscalers;  // the hires fix's upscaler folder (shared with the frames)
  const EncodedBatch& eb;
  SubBatch& sub;
  VaeTiling vae_tiling;
  Clock::time_point& trace_last_call_end;  // SDXL_TRACE_STEPS
  int64_t b = 0, rows = 0;                 // images; UNet rows (2b with CFG)
  std::vector<ActiveControl> controls;     // the pass's ControlNets (model_at)
  int call = 0, calls = 0;                 // the pass's model calls so far, and in all
  size_t text_pass = 0;                    // prompt editing: 0 the first pass, 1 the hires pass
  int text_call = 0;                       // and its model calls so far
  torch::Tensor image_latents, noise, mask;  // inpainting: the init latents, first noise, [b, 1, h, w] mask
  // A 9-channel inpainting UNet: cat(mask, masked image latents) per UNet row
  // (CFG order, both halves the same), appended to the latents of every call.
  torch::Tensor unet_extra;
};

// The UNet's input: the (scaled) latents, and for a 9-channel inpainting UNet
// the mask and the masked image's latents after them (diffusers' channel order).
torch::Tensor unet_input(const SubSampling& s, const torch::Tensor& x) {
  return s.unet_extra.defined() ? torch::cat({x, s.unet_extra.to(x.scalar_type())}, 1) : x;
}

// A Union ControlNet's residuals at one model call, its images at `scales`.
// Its transformer attends across the rows it is given, so each image runs
// with its own rows (its CFG pair, as diffusers makes one image) and an image
// does not depend on its batch.
std::vector<torch::Tensor> union_call(SubSampling& s, const ActiveControl& c, const torch::Tensor& x,
                                      const torch::Tensor& t, const std::vector<double>& scales) {
  UnetRunner& u = s.unet;
  const torch::Tensor cond = torch::stack(c.conds);  // [K, rows, 3, H, W]
  if (s.b == 1) return c.net->union_residuals(x, t, u.text_context(), u.pooled(), u.time_ids(), cond, c.types, scales);
  std::vector<std::vector<torch::Tensor>> parts;
  std::vector<std::int64_t> order;
  for (std::int64_t i = 0; i < s.b; ++i) {
    std::vector<std::int64_t> rows{i};
    if (s.eb.cfg_on) rows.push_back(s.b + i);
    const torch::Tensor r = torch::tensor(rows, torch::TensorOptions().dtype(torch::kInt64).device(x.device()));
    parts.push_back(c.net->union_residuals(x.index_select(0, r), t.index_select(0, r), u.text_context().index_select(0, r),
                                           u.pooled().index_select(0, r), u.time_ids().index_select(0, r),
                                           cond.index_select(1, r), c.types, scales));
    order.insert(order.end(), rows.begin(), rows.end());
  }
  const torch::Tensor where = torch::tensor(order, torch::TensorOptions().dtype(torch::kInt64).device(x.device()));
  std::vector<torch::Tensor> out;
  for (size_t k = 0; k < parts.front().size(); ++k) {
    std::vector<torch::Tensor> pieces;
    for (const auto& p : parts) pieces.push_back(p[k]);
    const torch::Tensor cat = torch::cat(pieces);
    out.push_back(torch::empty_like(cat).index_copy_(0, where, cat));
  }
  return out;
}

// The UNet call of model call `s.call` with the residuals of every ControlNet
// whose window holds it: diffusers' controlnet_keep[i] = 1 - (i / n < start or
// (i + 1) / n > end) over the pass's n model calls. A ControlNet of one image
// outside its window adds zeros in diffusers; here it is not run (the same
// sum). A Union ControlNet's call of several images runs at every call, each
// image at strength * keep: diffusers scales its images inside then, and its
// residuals are not zero with every image at 0.
torch::Tensor controlled_unet_call(SubSampling& s, const torch::Tensor& x, const torch::Tensor& t) {
  const double i = s.call++, n = s.calls;
  std::vector<torch::Tensor> residuals;
  for (const ActiveControl& c : s.controls) {
    std::vector<double> scales;
    bool any = false;
    for (size_t j = 0; j < c.conds.size(); ++j) {
      const bool keep = !(i / n < c.start[j] || (i + 1) / n > c.end[j]);
      scales.push_back(keep ? c.strength[j] : 0.0);
      any |= keep;
    }
    if (!any && c.conds.size() == 1) continue;
    add_residuals(residuals, c.types.empty() ? c.net->residuals(x, t, s.unet.text_context(), s.unet.pooled(),
                                                                 s.unet.time_ids(), c.conds[0], c.strength[0])
                                             : union_call(s, c, x, t, scales));
  }
  return s.unet(unet_input(s, x), t, residuals);
}

// One UNet call with CFG, timed per call under SDXL_TRACE_STEPS.
torch::Tensor guided_unet_call(SubSampling& s, const torch::Tensor& x_in, double timestep) {
  const bool trace = trace_steps();
  const GenerationParams& p0 = s.eb.params.front();
  Clock::time_point t_call;
  if (trace) {
    stream_synchronize(s.m.device);
    t_call = Clock::now();
  }
  if (s.sub.steps.on() && s.sub.steps.select(s.text_pass, s.text_call, s.eb.cfg_on, s.sub.context, s.sub.pooled))
    s.unet.bind(s.sub.context, s.sub.pooled, s.unet.time_ids(), s.sub.ip_kv);
  ++s.text_call;
  torch::Tensor x = s.eb.cfg_on ? torch::cat({x_in, x_in}) : x_in;
  torch::Tensor t = torch::full({s.rows}, timestep, torch::TensorOptions().dtype(torch::kFloat32).device(s.m.device));
  torch::Tensor eps = s.controls.empty() ? s.unet(unet_input(s, x), t) : controlled_unet_call(s, x, t);
  if (trace) {
    stream_synchronize(s.m.device);
    const auto now = Clock::now();
    spdlog::info("trace: latents [{}, {}, {}, {}] t={:.1f}: UNet call {:.1f} ms, sampler between calls {:.1f} ms",
                 x.size(0), x.size(1), x.size(2), x.size(3), timestep,
                 std::chrono::duration<double, std::milli>(now - t_call).count(),
                 s.trace_last_call_end == Clock::time_point{}
                     ? 0.0
                     : std::chrono::duration<double, std::milli>(t_call - s.trace_last_call_end).count());
    s.trace_last_call_end = now;
  }
  if (!s.eb.cfg_on) return eps.clone();  // a graph's output is overwritten by the next step
  auto halves = eps.chunk(2);            // [uncond, cond]
  return apply_guidance(halves[0], halves[1], p0.cfg, p0.guidance_rescale);
}

// The batch's ControlNets for a pass of `plan` at width x height.
void bind_controls(SubSampling& s, const SamplerPlan& plan, int width, int height) {
  s.controls.clear();
  s.call = 0;
  s.calls = static_cast<int>(plan.timesteps.size()) - plan.begin;
  const GenerationParams& p0 = s.eb.params.front();
  for (size_t k = 0; k < s.eb.controlnets.size(); ++k) {
    std::vector<torch::Tensor> images;
    for (size_t i : s.sub.idx)
      images.push_back(control_image_tensor(s.eb.control_images[k][i], width, height, s.m.dtype, s.m.device));
    torch::Tensor cond = torch::cat(images);
    if (s.eb.cfg_on) cond = torch::cat({cond, cond});
    const ControlNetUse& c = p0.controlnets[k];
    if (!c.same_call || s.controls.empty()) s.controls.push_back({s.eb.controlnets[k].get(), {}, {}, {}, {}, {}});
    ActiveControl& a = s.controls.back();
    a.conds.push_back(cond);
    if (!c.type.empty()) a.types.push_back(a.net->config().union_types.at(c.type));  // checked on the text stage
    a.strength.push_back(c.strength);
    a.start.push_back(c.start);
    a.end.push_back(c.end);
  }
}

// A sub-batch with regions at a pass of width x height: each attention grid's prompt weights [rows,
// prompts, n_d] and reference masks [rows, groups, n_d], rows in CFG order (both halves the same).
RegionInputs region_inputs(const SubSampling& s, int width, int height) {
  RegionInputs in;
  if (s.sub.prompts == 0) return in;
  const ModelConfig& cfg = s.m.config;
  const std::int64_t lh = height / cfg.vae_downsample, lw = width / cfg.vae_downsample;
  const std::vector<int>& downs = cfg.unet_regions.downscales;
  std::vector<std::vector<torch::Tensor>> per_row;  // [row][downscale]
  std::vector<torch::Tensor> px_masks;              // the rows' groups' pixel masks, in order
  for (size_t k = 0; k < s.sub.idx.size(); ++k) {
    per_row.push_back(region_prompt_weights(s.eb.params[s.sub.idx[k]], downs, lh, lw, s.sub.prompts));
    if (s.sub.ip_groups > 0)
      for (const RegionUse* r : s.sub.ip_group_regions[k]) px_masks.push_back(reference_pixel_mask(r, width, height));
  }
  const auto cfg_rows = [&](torch::Tensor t) {
    t = t.to(s.m.device, s.m.dtype);
    return s.eb.cfg_on ? torch::cat({t, t}) : t;
  };
  for (size_t d = 0; d < downs.size(); ++d) {
    std::vector<torch::Tensor> rows;
    for (const auto& w : per_row) rows.push_back(w[d]);
    in.weights.push_back(cfg_rows(torch::stack(rows)));
    if (s.sub.ip_groups == 0) continue;
    const std::int64_t tokens = attention_grid_side(lh, downs[d]) * attention_grid_side(lw, downs[d]);
    torch::Tensor masks = torch::zeros({s.b, s.sub.ip_groups, tokens}, torch::kFloat32);
    size_t at = 0;
    for (size_t k = 0; k < s.sub.idx.size(); ++k)
      for (size_t g = 0; g < s.sub.ip_group_regions[k].size(); ++g)
        masks[static_cast<std::int64_t>(k)][static_cast<std::int64_t>(g)] =
            downsample_reference_mask(px_masks[at++], tokens);
    in.ip_masks.push_back(cfg_rows(masks));
  }
  return in;
}

// The UNet with CFG (and the batch's ControlNets) for a pass of `plan` at a
// size (SDXL's time_ids: original = target = that size, crop 0).
ModelFn model_at(SubSampling& s, const SamplerPlan& plan, int width, int height) {
  torch::Tensor time_ids = sdxl_time_ids(width, height, s.m.dtype, s.m.device).repeat({s.rows, 1});
  s.unet.bind(s.sub.context, s.sub.pooled, time_ids, s.sub.ip_kv, region_inputs(s, width, height));
  s.text_pass = &plan == &s.eb.hires_plan ? 1 : 0;
  s.text_call = 0;
  bind_controls(s, plan, width, height);
  return [&s](const torch::Tensor& x_in, double timestep) { return guided_unet_call(s, x_in, timestep); };
}

// A 9-channel inpainting UNet's extra input (prepare_mask_latents): each image's
// init image with its repainted pixels at 0 in [-1, 1], encoded, after its
// latent mask; both duplicated for the unconditional rows with CFG.
void bind_masked_image(SubSampling& s) {
  std::vector<torch::Tensor> masked;
  for (size_t i : s.sub.idx) {
    const RgbImage& init = s.eb.init_images[i];
    masked.push_back(vae_encode_masked_rgb8(*s.vaes.get(s.eb.params[i].vae), init.rgb.data(),
                                            s.eb.pixel_masks[i].data(), init.width, init.height));
  }
  torch::Tensor extra = torch::cat({s.mask, torch::cat(masked).to(s.m.dtype)}, 1);
  s.unet_extra = s.eb.cfg_on ? torch::cat({extra, extra}) : extra;
}

// Each image's generator (its seed) draws its initial noise (txt2img), or the
// noise added to its encoded init image at the first kept timestep
// (StableDiffusionXLImg2ImgPipeline.prepare_latents).
torch::Tensor initial_latents(SubSampling& s, std::vector<at::Generator>& gens) {
  const ModelConfig& cfg = s.m.config;
  const GenerationParams& p0 = s.eb.params.front();
  const int64_t h = p0.height / cfg.vae_downsample, w = p0.width / cfg.vae_downsample;
  if (!s.eb.img2img)
    return randn_per_image(gens, {s.b, cfg.latent_channels, h, w}, s.m.dtype, s.m.device) * s.eb.plan.init_noise_sigma;
  // A 9-channel UNet at strength 1 starts from noise alone (diffusers encodes no init latents then).
  const bool noise_only = s.eb.inpaint && p0.strength == 1.0;
  torch::Tensor init;
  if (!(noise_only && s.eb.inpaint_unet)) {
    std::vector<torch::Tensor> inits;
    for (size_t i : s.sub.idx)
      inits.push_back(vae_encode_rgb8(*s.vaes.get(s.eb.params[i].vae), s.eb.init_images[i].rgb.data(),
                                      s.eb.init_images[i].width, s.eb.init_images[i].height));
    init = torch::cat(inits);
  }
  const torch::Tensor noise = randn_per_image(gens, {s.b, cfg.latent_channels, h, w}, s.m.dtype, s.m.device);
  if (!s.eb.inpaint) return add_noise(s.eb.plan, init, noise);
  // StableDiffusionXLInpaintPipeline.prepare_latents: pure noise at strength 1
  // (is_strength_max), else the init latents noised; both kept for the blend.
  s.image_latents = init;
  s.noise = noise;
  std::vector<torch::Tensor> masks;
  for (size_t i : s.sub.idx)
    masks.push_back(torch::from_blob(const_cast<float*>(s.eb.latent_masks[i].data()), {1, 1, h, w}, torch::kFloat32)
                        .to(s.m.device, s.m.dtype));
  s.mask = torch::cat(masks);
  if (s.eb.inpaint_unet) bind_masked_image(s);
  if (noise_only) return noise * s.eb.plan.init_noise_sigma;
  return add_noise(s.eb.plan, init, noise);
}

// The pipeline's step-end blend for a 4-channel UNet: the known region (mask 0)
// re-noised to the next model call's timestep with the first noise, the rest
// as sampled: (1 - mask) * add_noise(image_latents, noise, t_next) + mask * latents;
// after the last call the known region is image_latents itself (diffusers' loop).
StepBlend inpaint_blend(SubSampling& s, const SamplerPlan& plan) {
  if (!s.eb.inpaint || s.eb.inpaint_unet) return {};  // a 9-channel UNet sees the mask instead
  return [&s, &plan](const torch::Tensor& x, size_t call) {
    const torch::Tensor known = call + 1 < plan.timesteps.size() ? add_noise_at(plan, s.image_latents, s.noise, call + 1)
                                                                  : s.image_latents;
    return ((1 - s.mask) * known + s.mask * x).to(x.scalar_type());
  };
}

// Hires fix: upscale the first result, then an img2img pass at the new size
// with fresh generators of the same seeds (A1111 re-seeds the second pass).
torch::Tensor hires_pass(SubSampling& s, const torch::Tensor& latents, int out_w, int out_h, const StepHook& hook) {
  const ModelConfig& cfg = s.m.config;
  const GenerationParams& p0 = s.eb.params.front();
  torch::Tensor up;
  if (is_latent_upscaler(p0.hires.upscaler)) {
    up = upscale_latents(latents, out_h / cfg.vae_downsample, out_w / cfg.vae_downsample, p0.hires.upscaler);
  } else {  // pixel space (A1111's sample_hr_pass): decode, upscale the 8-bit image, encode
    std::shared_ptr<Upscaler> model;
    if (p0.hires_uses_model()) model = s.upscalers.get(p0.hires.upscaler);
    std::vector<torch::Tensor> ups;
    for (int64_t k = 0; k < s.b; ++k) {
      const std::shared_ptr<SdxlModel> vae = s.vaes.get(s.eb.params[s.sub.idx[static_cast<size_t>(k)]].vae);
      const std::vector<std::uint8_t> first_pass = vae_decode_rgb8(*vae, latents.slice(0, k, k + 1), s.vae_tiling);
      // "Nearest": PIL's NEAREST; "Lanczos" and a folder: A1111's upscale_with_model (the model's passes
      // while smaller than the target, at most 3), then LANCZOS to the exact size.
      const std::vector<std::uint8_t> big =
          p0.hires.upscaler == "Nearest"
              ? resize_nearest_rgb8(first_pass.data(), p0.width, p0.height, out_w, out_h)
              : upscale_rgb8(model.get(), first_pass.data(), p0.width, p0.height, out_w, out_h);
      ups.push_back(vae_encode_rgb8(*vae, big.data(), out_w, out_h));
    }
    up = torch::cat(ups);
  }
  std::vector<at::Generator> gens2 = cpu_generators(s.sub.seeds);
  torch::Tensor noisy = add_noise(s.eb.hires_plan, up, randn_per_image(gens2, up.sizes(), s.m.dtype, s.m.device));
  return sample(s.eb.hires_plan, noisy, model_at(s, s.eb.hires_plan, out_w, out_h), gens2, hook);
}

}  // namespace

std::shared_ptr<SampledBatch> Generator::sample_batch(const std::shared_ptr<EncodedBatch>& eb, const StepHook& hook) {
  Impl& im = *impl_;
  apply_thread_settings(im.opts);
  SdxlModel& m = *im.model;
  const GenerationParams& p0 = eb->params.front();
  auto sb = std::make_shared<SampledBatch>();
  sb->encoded = eb;
  sb->out_w = p0.width;
  sb->out_h = p0.height;
  const StageStream::Scope on(im.sample_stream);
  im.sample_stream.wait(eb->ready);  // the text stage's tensors are written
  translate_device_errors(nullptr, [&] {
    c10::InferenceMode inference;
    const auto t0 = Clock::now();
    for (SubBatch& sub : eb->subs) {
      im.sample_stream.hand_over(sub.context);
      for (const torch::Tensor& e : sub.steps.tensors()) im.sample_stream.hand_over(e);
      im.sample_stream.hand_over(sub.pooled);
      for (torch::Tensor& kv : sub.ip_kv) im.sample_stream.hand_over(kv);
      const int64_t b = static_cast<int64_t>(sub.idx.size());
      SubSampling s{m, *im.unet, *im.vaes, *im.upscalers, *eb, sub, im.vae_tiling, im.trace_last_call_end,
                    b, eb->cfg_on ? 2 * b : b, {}, 0, 0, 0, 0, {}, {}, {}, {}};
      // Each image's generator (its seed) draws its initial noise and then the
      // noise ancestral / SDE samplers draw, as diffusers' list of generators does.
      std::vector<at::Generator> gens = cpu_generators(sub.seeds);
      torch::Tensor latents = initial_latents(s, gens);
      if (trace_steps()) {
        stream_synchronize(m.device);
        spdlog::info("trace: {} image(s) of {}x{}: noise and set-up {:.1f} ms", b, p0.width, p0.height,
                     std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        im.trace_last_call_end = Clock::time_point{};
      }
      latents = sample(eb->plan, latents, model_at(s, eb->plan, p0.width, p0.height), gens, hook,
                       inpaint_blend(s, eb->plan));
      if (p0.hires_on()) {
        sb->out_w = p0.hires_width();
        sb->out_h = p0.hires_height();
        latents = hires_pass(s, latents, sb->out_w, sb->out_h, hook);
      }
      sub.latents = latents;
      // The text stage's tensors are done with; the encoded batch lives on
      // (the decode stage reads its bookkeeping), its device memory need not.
      sub.context = torch::Tensor();
      sub.pooled = torch::Tensor();
      sub.ip_kv.clear();
      sub.steps = StepConditioning();
    }
    sb->ready = im.sample_stream.record();
    stamp_stage(m.device, t0, eb->out, &StageSeconds::sample);
    return 0;
  });
  return sb;
}

namespace {

// The image brought to its task's frame ("upscale"): the upscaler's passes on the model's device, then
// LANCZOS, crop or pad (image/upscaler.h); g's size and upscaler name follow.
void frame_image(UpscalerCache& upscalers, const GenerationParams& p, GeneratedImage& g) {
  std::shared_ptr<Upscaler> up;
  if (p.upscale.uses_model()) up = upscalers.get(p.upscale.model);
  FrameSpec spec;
  spec.scale = p.upscale.scale;
  spec.width = p.upscale.width;
  spec.height = p.upscale.height;
  spec.fit = spec.scale > 0 ? FrameFit::kStretch : parse_frame_fit(p.upscale.fit, "upscale fit");
  int w = 0, h = 0;
  g.rgb = upscale_frame(up.get(), g.rgb.data(), g.width, g.height, spec, w, h);
  g.width = w;
  g.height = h;
  g.upscaler_name = up ? up->config().display_name() : "Lanczos";
}

}  // namespace

std::vector<GeneratedImage> Generator::decode_batch(const std::shared_ptr<SampledBatch>& sb) {
  Impl& im = *impl_;
  apply_thread_settings(im.opts);
  SdxlModel& m = *im.model;
  EncodedBatch& eb = *sb->encoded;
  const StageStream::Scope on(im.decode_stream);
  std::shared_lock device_lock(im.device_mu);  // not while a CUDA graph is being captured
  im.decode_stream.wait(sb->ready);            // the sampling stage's latents are written
  translate_device_errors(nullptr, [&] {
    c10::InferenceMode inference;
    // Decode one image at a time (the decoder's peak is per image).
    const auto t0 = Clock::now();
    for (SubBatch& sub : eb.subs) {
      im.decode_stream.hand_over(sub.latents);
      const torch::Tensor lat_cpu = sub.latents.to(torch::kCPU).to(torch::kFloat32).contiguous();
      for (size_t k = 0; k < sub.idx.size(); ++k) {
        GeneratedImage& g = eb.out[sub.idx[k]];
        const auto kk = static_cast<int64_t>(k);
        g.width = sb->out_w;
        g.height = sb->out_h;
        const torch::Tensor one = lat_cpu.slice(0, kk, kk + 1);
        g.latent_shape.assign(one.sizes().begin(), one.sizes().end());
        g.latents.assign(one.data_ptr<float>(), one.data_ptr<float>() + one.numel());
        const GenerationParams& p = eb.params[sub.idx[k]];
        const std::shared_ptr<SdxlModel> vae = im.vaes->get(p.vae);
        g.rgb = vae_decode_rgb8(*vae, sub.latents.slice(0, kk, kk + 1), im.vae_tiling, {},
                                "seed " + std::to_string(p.seed));
        if (eb.inpaint && eb.overlays[sub.idx[k]]) {  // "Only masked": pasted back into the init image
          const EncodedBatch::Overlay& o = *eb.overlays[sub.idx[k]];
          g.rgb = overlay_inpainted_rgb8(o.init, o.mask_grey, g.rgb.data(), g.width, g.height, o.box);
        }
        if (!p.vae.empty()) {
          g.vae_name = vae->config.vae_file.recorded() ? vae->config.vae_file.name : vae->config.name;
          g.vae_hash = vae->config.vae_file.recorded() ? vae->config.vae_file.short_hash() : "";
        }
      }
      sub.latents = torch::Tensor();
    }
    stamp_stage(m.device, t0, eb.out, &StageSeconds::decode);
    return 0;
  });
  return std::move(eb.out);
}

namespace {

// Work of the decode stage outside decode_batch (a detailer's detector, an image's frame): on the
// decode stream with the decode thread's settings, under the device lock (not while a CUDA graph is
// being captured), in inference mode, device errors translated.
void on_decode_stage(const RuntimeOptions& opts, StageStream& stream, std::shared_mutex& device_mu,
                     const std::function<void()>& body) {
  apply_thread_settings(opts);
  const StageStream::Scope on(stream);
  std::shared_lock device_lock(device_mu);
  translate_device_errors(nullptr, [&] {
    c10::InferenceMode inference;
    body();
    return 0;
  });
}

}  // namespace

void Generator::make_frame(const GenerationParams& p, GeneratedImage& g) {
  Impl& im = *impl_;
  if (!p.upscale.on()) return;
  on_decode_stage(im.opts, im.decode_stream, im.device_mu, [&] { frame_image(*im.upscalers, p, g); });
}

std::vector<DetailerRegion> Generator::detailer_regions(const DetailerUse& unit, const PixelImage& image,
                                                        std::string& model_name) {
  Impl& im = *impl_;
  std::vector<Detection> found;
  on_decode_stage(im.opts, im.decode_stream, im.device_mu, [&] {
    std::shared_ptr<Detector> det;
    try {
      det = im.detectors->get(unit.detector);
    } catch (const ModelError& e) {
      throw UsageError(std::string("detailer: ") + e.what());  // the task's failure, not the run's
    }
    const DetectorConfig& dc = det->config();
    model_name = dc.source_file.recorded() ? dc.source_file.name : dc.display_name();  // ADetailer: "face_yolov8n.pt"
    DetectSettings settings;
    settings.confidence = unit.confidence;
    found = det->detect(image.rgb.data(), image.width, image.height, settings, dc.task == "segment");
  });
  std::vector<DetailerRegion> regions = sdxl::detailer_regions(found, image.width, image.height, unit);
  // A region whose mask the blur and the latent grid leave empty would be refused by the inpainting
  // pass ("marks nothing to repaint"): it is left as it is.
  const int down = im.model->config.vae_downsample;
  std::erase_if(regions, [&](const DetailerRegion& r) {
    const RgbImage m{r.mask->width, r.mask->height, r.mask->rgb};
    return !mask_survives_blur(m, unit.blur, true, unit.padding, image.width, image.height, down);
  });
  return regions;
}

std::vector<GeneratedImage> Generator::generate_batch(const std::vector<GenerationParams>& ps, const StepHook& hook) {
  if (ps.empty()) return {};
  return decode_batch(sample_batch(encode_batch(ps), hook));
}

MemorySnapshot Generator::memory() const { return device_memory_snapshot(impl_->model->device); }
void Generator::reset_peak_memory() { device_reset_peak(impl_->model->device); }
void Generator::release_cached_memory() {
  // A captured graph holds its own memory pool; it is dropped by the sampling
  // stage before its next batch (it may be replaying it right now).
  impl_->unet->request_release();
  std::shared_lock device_lock(impl_->device_mu);  // not while a CUDA graph is being captured
  device_release_cached(impl_->model->device);
}
void Generator::set_memory_limit(std::uint64_t bytes) {
  device_set_memory_limit(impl_->model->device, bytes);
}

}  // namespace sdxl
