// Generator: the resident SDXL model on one device and the text -> sample ->
// decode path for one image. Loading throws ModelError naming the file; a
// generate() failure throws TaskError (or UsageError for sizes outside the
// model's limits). One caller at a time, except the three stage calls (see
// encode_batch). The header is
// torch-free (pImpl) so the CLI does not compile torch headers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "batch/generation_params.h"
#include "batch/lora_ref.h"
#include "lora/lora_stats.h"
#include "model/model_config.h"
#include "core/memory.h"
#include "device/cuda_allocator.h"
#include "pipeline/detailer.h"

namespace sdxl {

struct RuntimeOptions {
  std::string device = "cpu";  // cpu | cuda | cuda:N
  std::string dtype;           // "" = model.json's dtype; fp32 | fp16 | bf16
  // The UNet: "default" (unet.ts, the model dtype) or "fp8" (unet_fp8.ts:
  // FP8 linear layers; with_unet_precision, docs/models-and-export.md#fp8-unet).
  std::string precision = "default";
  int threads = 0;             // CPU intra-op threads, 0 = torch default
  // TorchScript graph optimisation (fusion after profiling runs). Off by default:
  // it changes fp16 results after the first calls, so an image would depend on
  // its place in the run.
  bool jit_optimize = false;
  bool cudnn_benchmark = false;  // let cuDNN time convolution algorithms per shape
  // Ask cuDNN for deterministic algorithms only (its split-K "segment_k"
  // convolutions may sum in a varying order). On by default, so the same seed
  // gives the same PNG on any GPU, at no measured cost in speed
  // (docs/scheduling-and-memory.md#determinism).
  bool deterministic_cudnn = true;
  // The CUDA caching allocator: "expandable" (expandable segments) or "default".
  // Expandable by default: less fragmentation under --vram-limit, so more images
  // fit a cap (docs/scheduling-and-memory.md#allocator).
  // PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF, when set, win. Process-wide:
  // the first CUDA generator applies it.
  std::string cuda_allocator = "expandable";
  // Capture the UNet step as a CUDA graph and replay it (CUDA only; falls back
  // to plain calls when capture fails).
  bool cuda_graphs = true;
  // The UNet's backend: "torchscript" (unet.ts) or "aoti" (unet.pt2 from
  // export_sdxl.py --aoti, AOTInductor; shapes outside its compiled ranges run on unet.ts).
  std::string unet_backend = "auto";  // auto | torchscript | aoti (resolve_unet_backend)
  // The VAE decoder's backend: "torchscript" (vae_decoder.ts) or "aoti"
  // (vae_decoder.pt2, one image size; attach_vae_decoder_aoti).
  std::string vae_backend = "auto";  // auto | torchscript | aoti
  // VAE decode in tiles: "auto" (whole, tiles after an out-of-memory), "always", "never".
  std::string vae_tiling = "auto";
  // VAE decode dtype: "auto" (the compute dtype), fp32, fp16, bf16; NaN/Inf output is decoded again in fp32.
  std::string vae_dtype = "auto";
  // VAE folders tasks name ("vae"; --vae): how many stay loaded beside the
  // model's own (least recently used evicted).
  std::size_t vae_cache = 2;
  // ControlNet folders tasks name ("controlnets"; --controlnet): how many stay
  // loaded (least recently used evicted).
  std::size_t controlnet_cache = 2;
  // IP-Adapter folders tasks name ("ip_adapter"; --ip-adapter): how many stay
  // loaded, and how many reference images' keys and values stay cached.
  std::size_t ip_adapter_cache = 2;
  std::size_t ip_image_cache = 64;
  // Upscaler folders tasks name for their frames ("upscale"; --upscale-model) and hires fix
  // ("hires": {"upscaler": DIR}; --hires-upscaler): how many stay loaded.
  std::size_t upscaler_cache = 1;
  // Detector folders tasks' detailers name ("detailer"): how many stay loaded.
  std::size_t detector_cache = 2;
  // LoRAs: where prompt tags <lora:NAME:W> are looked up (after the registry),
  // the factor cache's budget (0 = 30% of the memory free after the weights),
  // and whether keys that map to no weight are an error instead of a warning.
  std::vector<std::filesystem::path> lora_dirs;
  std::uint64_t lora_cache_bytes = 0;
  bool lora_strict = false;
  // Textual-inversion embeddings: every .safetensors in these folders, loaded
  // with the model (lora/embeddings.h); prompts use them by file name.
  std::vector<std::filesystem::path> embedding_dirs;
};

struct StageSeconds {
  double text = 0, sample = 0, decode = 0;
};

// Called between sampling steps (step counts from 1). It may throw (a
// TimeoutError cancels the batch; its memory is freed as the stack unwinds).
using StepHook = std::function<void(int step, int total)>;

// Opaque results of the first two stages (see Generator::encode_batch).
struct EncodedBatch;
struct SampledBatch;

struct GeneratedImage {
  int width = 0, height = 0;
  std::vector<std::uint8_t> rgb;           // height * width * 3
  std::vector<std::int64_t> latent_shape;  // final latents [1, 4, h, w]
  std::vector<float> latents;              // before VAE scaling, float32
  StageSeconds seconds;
  std::vector<std::pair<std::string, std::string>> lora_hashes;  // applied LoRAs: name, A1111 short hash
  double lora_s = 0;                                              // switching the LoRA set (load + merge)
  // The textual-inversion embeddings its prompt and (encoded) negative prompt
  // used, in order of first use: name, A1111 short hash (12 hex digits).
  std::vector<std::pair<std::string, std::string>> ti_hashes;
  // The task's own VAE ("vae"), when it named one: its file's name and A1111
  // short hash, for the PNG ("" = the model's VAE, whose hash the model gives).
  std::string vae_name, vae_hash;
  // Its ControlNets, in the task's order: name and A1111 short hash ("" unknown).
  std::vector<std::pair<std::string, std::string>> controlnets;
  // Its IP-Adapter: name, short hash, and each reference image's file name and hash.
  std::string ip_adapter_name, ip_adapter_hash;
  std::vector<std::pair<std::string, std::string>> ip_images;
  // Its final upscale's upscaler as images name it ("" = none): rgb, width and height are the frame.
  std::string upscaler_name;
  // Its detailer units' detectors as images name them (ADetailer model), in the task's order.
  std::vector<std::string> detailer_models;
};

// The model's part of an image's PNG sources (name, and the hashes model.json records).
ImageSources model_sources(const ModelConfig& mc);
// The image's part of its PNG's sources (model_sources gives the model's part):
// the LoRA and embedding hashes, the task's own VAE when it named one, its ControlNets and IP-Adapter.
void add_image_sources(ImageSources& sources, const GenerationParams& p, const GeneratedImage& img);

// CUDA devices this process can use (0 without CUDA).
int cuda_device_count();

class Generator {
 public:
  Generator(const std::filesystem::path& model_dir, const RuntimeOptions& opts);
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // Applies params.loras plus the prompt's <lora:NAME:W> tags (removed from the
  // text before encoding), then generates: the image as decoded (make_frame makes its frame).
  // Unknown LoRA names throw UsageError.
  GeneratedImage generate(const GenerationParams& params);
  // Compatible images (same size, steps, sampler, schedule) in one UNet call
  // per step; each image's noise comes from its own seed, so an image is the
  // same whatever batch it is in. A CUDA out-of-memory throws OutOfMemoryError.
  std::vector<GeneratedImage> generate_batch(const std::vector<GenerationParams>& params, const StepHook& hook = {});

  // The three stages of generate_batch as separate calls, so that a runner can
  // overlap them on three threads (batch_runner's pipeline). On CUDA each stage
  // runs on its own stream: text on a normal-priority one, sampling on a
  // high-priority one, decode on a third; a stage hands its tensors to the
  // next with an event and record_stream. Each call may run on its own thread
  // concurrently with the other two, with one rule: encode_batch of a batch
  // whose LoRA set differs from the previous batch's changes the weights, so
  // it must wait until sample_batch of every earlier batch has returned.
  //  1. LoRA set, tokenize, text encoders (prompt errors come from here).
  std::shared_ptr<EncodedBatch> encode_batch(const std::vector<GenerationParams>& params);
  //  2. Sampling (and the hires pass): latents. `hook` runs between steps.
  std::shared_ptr<SampledBatch> sample_batch(const std::shared_ptr<EncodedBatch>& encoded, const StepHook& hook = {});
  //  3. VAE decode and the copy to host memory: one image per params entry.
  std::vector<GeneratedImage> decode_batch(const std::shared_ptr<SampledBatch>& sampled);
  // The detailer (docs/detailer.md), on the decode stage's thread and stream: the regions detector
  // folder unit.detector finds in `image` (its masks made as detailer_regions makes them; regions the
  // blur leaves empty dropped), the folder loaded once into a cache; model_name: the detector's name
  // as images give it. A folder that does not load throws UsageError (the task fails).
  std::vector<DetailerRegion> detailer_regions(const DetailerUse& unit, const PixelImage& image, std::string& model_name);
  // The frame ("upscale") of a finished image, on the decode stage's thread and stream (no-op without
  // "upscale"). No stage makes it: it is the last step of every image, after its detailer
  // (scheduler/image_finish.h).
  void make_frame(const GenerationParams& p, GeneratedImage& g);
  // Loads the LoRA files `params` will need into the cache ahead of
  // encode_batch (no weight changes: safe while another batch samples).
  void prefetch_loras(const std::vector<GenerationParams>& params);

  // Makes `loras` the applied set (switching only when it differs from the
  // current one); returns each LoRA's name and short hash. Throws UsageError
  // for bad files. An empty set restores the base weights bit for bit.
  std::vector<std::pair<std::string, std::string>> set_loras(const std::vector<LoraRef>& loras);
  // Names that prompt tags and batch tasks resolve first (a batch file's "loras").
  void set_lora_registry(LoraRegistry registry);
  LoraStats lora_stats() const;
  // The UNet runner's counters: graph captures / replays / graphs held,
  // AOTInductor calls and fallbacks (for the report's devices[].engine).
  std::map<std::string, double> engine_counters() const;

  const ModelConfig& model() const;
  std::string device_name() const;
  double load_seconds() const;
  // Peak device memory since load (CUDA allocator stats), or the process's
  // peak resident memory on CPU.
  std::uint64_t peak_memory_bytes() const;
  // Device memory allocated now (CUDA), or the process's resident memory on CPU.
  std::uint64_t memory_in_use_bytes() const;
  MemorySnapshot memory() const;
  void reset_peak_memory();
  // Returns cached, unused blocks of the caching allocator to the driver.
  void release_cached_memory();
  // Caps what the caching allocator may hold (--vram-limit): a per-process
  // memory fraction of the card. Throws UsageError when larger than the card.
  void set_memory_limit(std::uint64_t bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sdxl
