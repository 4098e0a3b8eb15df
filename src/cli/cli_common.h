// Shared pieces of the subcommands: the model/device options every command
// takes, logging set-up, and formatting helpers. No generation logic here.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "sdxl/generator.h"

namespace sdxl::cli {

struct ModelOptions {
  std::string model_dir;
  RuntimeOptions runtime;
};

// Adds --model, --device, --dtype, --threads to a subcommand.
void add_model_options(CLI::App& cmd, ModelOptions& o, bool model_required);

// --log-level on the top-level app; call apply_log_level() after parsing.
void add_log_options(CLI::App& app, std::string& level);
void apply_log_level(const std::string& level);

std::string format_bytes(std::uint64_t bytes);

}  // namespace sdxl::cli
