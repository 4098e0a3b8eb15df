// Shared pieces of the subcommands: logging set-up, formatting and flag checks.
// No generation logic here; uses no internal header (the API clients include it).
#pragma once

#include <CLI/CLI.hpp>
#include <sdxl_batch/sdxl_batch.h>

#include <cstdint>
#include <string>

namespace sdxl::cli {

// --log-level and --log-file on the top-level app; call setup_logging() after parsing.
void add_log_options(CLI::App& app, std::string& level, std::string& file);
// Logs go to stderr and, with a file, also to that file (rotated at 10 MiB, 5 kept).
void setup_logging(const std::string& level, const std::string& file);

std::string format_bytes(std::uint64_t bytes);

// A number flag's check: a finite number in [lo, hi] (CLI::Range lets "nan"
// through, and a flag that reads nan would silently fall back to a default).
CLI::Validator finite_range(double lo, double hi);

// The final upscale's flags, shared by `upscale` and `generate`: --upscale-model DIR|Lanczos with
// --upscale S or --upscale-size WxH [--upscale-fit crop|pad|stretch], as typed (an --upscale of 0 is
// an error, not "not given").
struct UpscaleFlags {
  std::string model, scale, size, fit = "stretch";
};
// Adds the four flags to `cmd` (--upscale-model required when `model_required`).
void add_upscale_flags(CLI::App& cmd, UpscaleFlags& flags, bool model_required);
// The flags as an Upscale (model "" when none was given). Throws sdxl_batch::UsageError for a size that
// is not WxH, a factor that is not a number above 0, or a model without a factor or size (and the
// reverse).
sdxl_batch::Upscale upscale_of_flags(const UpscaleFlags& flags);

}  // namespace sdxl::cli
