// The model flags every command takes (--model, --device, ..., --verify-model),
// read into the public API's ModelOptions. Uses the public header only.
#pragma once

#include <sdxl_batch/sdxl_batch.h>

#include <CLI/CLI.hpp>
#include <string>

namespace sdxl::cli {

struct ModelFlags {
  sdxl_batch::ModelOptions options;
  std::string lora_cache;  // --lora-cache as typed ("" = the default)
  // `options` with the flags that need parsing applied; throws sdxl_batch::UsageError.
  sdxl_batch::ModelOptions resolved() const;
};

// Adds --model, --device, --dtype, --threads, the VAE, cache and LoRA flags to a subcommand.
void add_model_options(CLI::App& cmd, ModelFlags& f, bool model_required);

}  // namespace sdxl::cli
