#include "cli/cli_common.h"

#include <chrono>
#include <cmath>
#include <cstdlib>

#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <map>
#include <set>
#include <utility>

#include "batch/batch_file.h"
#include "core/units.h"

namespace sdxl::cli {

void add_model_options(CLI::App& cmd, ModelOptions& o, bool model_required) {
  auto* m = cmd.add_option("--model", o.model_dir, "Model directory written by scripts/export_sdxl.py");
  if (model_required) m->required();
  cmd.add_flag("--verify-model", o.verify_model,
               "Check every model file against the sha256 recorded at export before loading (reads all of them)");
  cmd.add_option("--device", o.runtime.device, "cpu, cuda or cuda:N")->default_val("cpu");
  cmd.add_option("--dtype", o.runtime.dtype, "Compute dtype (default: the model's)")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  cmd.add_option("--precision", o.runtime.precision,
                 "UNet precision: default (the model's dtype) or fp8 (the FP8 UNet of export_sdxl.py --fp8: faster, not "
                 "exact; a GPU with FP8 tensor cores)")
      ->capture_default_str()
      ->check(CLI::IsMember({"default", "fp8"}));
  cmd.add_option("--threads", o.runtime.threads, "CPU threads for torch (0 = torch's default)")
      ->check(CLI::Range(0, 1024));
  cmd.add_flag("--jit-optimize", o.runtime.jit_optimize,
               "Let TorchScript fuse ops after its first calls: seconds of optimisation at each new shape, and fp16 results "
               "then depend on the call count");
  cmd.add_flag("--cudnn-benchmark", o.runtime.cudnn_benchmark, "Let cuDNN pick convolution algorithms by timing them");
  cmd.add_flag("--deterministic-cudnn,!--no-deterministic-cudnn", o.runtime.deterministic_cudnn,
               "Use only cuDNN algorithms that give the same bits on every GPU and run (default on; no slower on the "
               "GPUs measured)");
  cmd.add_option("--cuda-allocator", o.runtime.cuda_allocator,
                 "CUDA caching allocator: expandable (expandable segments: less fragmentation under --vram-limit) or "
                 "default; PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF, when set, win")
      ->capture_default_str()
      ->check(CLI::IsMember({"expandable", "default"}));
  cmd.add_flag("--cuda-graphs,!--no-cuda-graphs", o.runtime.cuda_graphs,
               "Replay the UNet step as a captured CUDA graph (CUDA only; default on)");
  cmd.add_option("--unet-backend", o.runtime.unet_backend,
                 "UNet implementation: auto (aoti when the model has a unet.pt2 for this device and dtype, else "
                 "torchscript), torchscript (unet.ts) or aoti (unet.pt2 from export_sdxl.py --aoti)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "torchscript", "aoti"}));
  cmd.add_option("--vae-backend", o.runtime.vae_backend,
                 "VAE decoder implementation: auto (aoti when the model has a vae_decoder.pt2 for this device and "
                 "decode dtype, else torchscript), torchscript (vae_decoder.ts) or aoti (vae_decoder.pt2 from "
                 "export_sdxl.py --aoti: images of the size it was compiled for; others decode on vae_decoder.ts)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "torchscript", "aoti"}));
  cmd.add_option("--vae-tiling", o.runtime.vae_tiling,
                 "VAE decode in overlapping tiles: auto (only after an out-of-memory), always, never")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "always", "never"}));
  cmd.add_option("--vae-dtype", o.runtime.vae_dtype,
                 "VAE decode dtype: auto (on a GPU the compute dtype, e.g. fp16; on the CPU as exported), fp32, fp16, bf16; "
                 "an image whose decode has NaN/Inf is decoded again in fp32")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "fp32", "fp16", "bf16"}));
  cmd.add_option("--vae", o.vae_dir,
                 "VAE folder (scripts/export_sdxl.py --vae-only) that encodes and decodes the images instead of the "
                 "model's VAE; a batch task's \"vae\" wins")
      ->check(CLI::ExistingDirectory);
  cmd.add_option("--vae-cache", o.runtime.vae_cache,
                 "How many VAE folders that tasks name stay loaded beside the model's own (least recently used evicted)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd.add_option("--controlnet-cache", o.runtime.controlnet_cache,
                 "How many ControlNet folders that tasks name stay loaded (least recently used evicted)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd.add_option("--ip-adapter-cache", o.runtime.ip_adapter_cache,
                 "How many IP-Adapter folders that tasks name stay loaded (least recently used evicted)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd.add_option("--ip-image-cache", o.runtime.ip_image_cache,
                 "How many reference images' IP-Adapter tokens stay cached (each is encoded once while cached)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  cmd.add_option("--lora-dir", o.lora_dirs, "Directory where <lora:NAME:W> prompt tags find NAME.safetensors (repeatable)");
  cmd.add_option("--embedding-dir,--embeddings-dir", o.embedding_dirs,
                 "Folder of SDXL textual-inversion embeddings (NAME.safetensors with clip_l and clip_g); prompts use "
                 "NAME (repeatable)")
      ->check(CLI::ExistingDirectory);
  cmd.add_option("--lora-cache", o.lora_cache,
                 "Device memory for cached LoRA factors, e.g. 2G (default: 30% of the memory free after the weights)");
  cmd.add_flag("--strict-lora,--strict", o.runtime.lora_strict, "LoRA keys that map to no model weight are an error, not a warning");
}

void ModelOptions::finish() {
  runtime.lora_dirs.assign(lora_dirs.begin(), lora_dirs.end());
  runtime.embedding_dirs.assign(embedding_dirs.begin(), embedding_dirs.end());
  if (!lora_cache.empty()) {
    runtime.lora_cache_bytes = parse_size_bytes(lora_cache);
    if (runtime.lora_cache_bytes == 0) runtime.lora_cache_bytes = 1;  // "0": cache nothing beyond the set in use
  }
}

void add_log_options(CLI::App& app, std::string& level, std::string& file) {
  app.add_option("--log-level", level, "trace, debug, info, warn, error, off")
      ->default_val("info")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  app.add_option("--log-file", file, "Also log to this file (rotated at 10 MiB, 5 files kept)");
}

void setup_logging(const std::string& level, const std::string& file) {
  // Logs go to stderr so stdout stays for machine-readable output.
  std::vector<spdlog::sink_ptr> sinks{std::make_shared<spdlog::sinks::stderr_color_sink_mt>()};
  if (!file.empty())
    sinks.push_back(std::make_shared<spdlog::sinks::rotating_file_sink_mt>(file, 10u << 20, 5));
  auto logger = std::make_shared<spdlog::logger>("sdxl", sinks.begin(), sinks.end());
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  spdlog::set_level(spdlog::level::from_str(level));
}

std::string format_bytes(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

void verify_model_if_asked(const ModelOptions& o, const ModelConfig& mc) {
  if (!o.verify_model) return;
  const auto t0 = std::chrono::steady_clock::now();
  const int n = verify_model_files(mc);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (n == 0)
    spdlog::warn("--verify-model: model.json of '{}' records no sha256 sums (exported before they were); "
                 "export it again to verify it", mc.dir.string());
  else
    spdlog::info("--verify-model: {} file(s) match their sha256 ({:.1f} s)", n, s);
}

void verify_task_folders_if_asked(const ModelOptions& o, const std::vector<const GenerationParams*>& params) {
  if (!o.verify_model) return;
  std::set<std::pair<std::string, std::string>> folders;  // kind, folder
  for (const GenerationParams* p : params) {
    if (!p->vae.empty()) folders.emplace("vae", p->vae);
    for (const ControlNetUse& c : p->controlnets) folders.emplace("controlnet", c.model);
    if (p->ip_adapter.on()) folders.emplace("ip_adapter", p->ip_adapter.model);
  }
  int files = 0;
  for (const auto& [kind, dir] : folders) {
    const std::map<std::string, std::string> sums = kind == "vae"          ? load_vae_config(dir).file_sha256
                                                    : kind == "controlnet" ? load_controlnet_config(dir).file_sha256
                                                                           : load_ip_adapter_config(dir).file_sha256;
    ModelConfig folder;  // verify_model_files reads only the folder and its sums
    folder.dir = dir;
    folder.file_sha256 = sums;
    const int n = verify_model_files(folder);
    if (n == 0)
      spdlog::warn("--verify-model: model.json of '{}' records no sha256 sums (exported before they were); "
                   "export it again to verify it", dir);
    files += n;
  }
  if (files > 0)
    spdlog::info("--verify-model: {} file(s) of {} folder(s) beside the model match their sha256", files, folders.size());
}

CLI::Validator finite_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v))
          return "'" + text + "' is not a finite number";
        if (v < lo || v > hi) return "'" + text + "' is not in [" + CLI::detail::to_string(lo) + ", " +
                                     CLI::detail::to_string(hi) + "]";
        return "";
      },
      "NUMBER in [" + CLI::detail::to_string(lo) + " - " + CLI::detail::to_string(hi) + "]");
}

}  // namespace sdxl::cli
