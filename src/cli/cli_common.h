// Shared pieces of the subcommands: the model/device options every command
// takes, logging set-up, and formatting helpers. No generation logic here.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "pipeline/generator.h"

namespace sdxl::cli {

struct ModelOptions {
  std::string model_dir;
  RuntimeOptions runtime;
  std::vector<std::string> lora_dirs;
  std::vector<std::string> embedding_dirs;
  std::string lora_cache;  // size text, "" = default
  std::string vae_dir;     // --vae: the VAE folder of images that name none ("" = the model's)
  bool verify_model = false;
  // Fills runtime.lora_* from the flags above; throws UsageError.
  void finish();
};

// Adds --model, --device, --dtype, --threads and the LoRA flags
// (--lora-dir, --lora-cache, --strict-lora) to a subcommand.
void add_model_options(CLI::App& cmd, ModelOptions& o, bool model_required);

// --verify-model: checks the model files' sha256 sums (model.json) before
// loading; logs what it checked and how long it took. Throws ModelError.
void verify_model_if_asked(const ModelOptions& o, const ModelConfig& mc);
// --verify-model for the folders images use beside the model (VAE, ControlNet
// and IP-Adapter folders): each folder's files against the sha256 sums its
// model.json records, once per folder, before anything loads. Throws
// ModelError naming the file.
void verify_task_folders_if_asked(const ModelOptions& o, const std::vector<const GenerationParams*>& params);

// --log-level and --log-file on the top-level app; call setup_logging() after parsing.
void add_log_options(CLI::App& app, std::string& level, std::string& file);
// Logs go to stderr and, with a file, also to that file (rotated at 10 MiB, 5 kept).
void setup_logging(const std::string& level, const std::string& file);

std::string format_bytes(std::uint64_t bytes);

// A number flag's check: a finite number in [lo, hi] (CLI::Range lets "nan"
// through, and a flag that reads nan would silently fall back to a default).
CLI::Validator finite_range(double lo, double hi);

}  // namespace sdxl::cli
