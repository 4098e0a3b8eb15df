// Shared pieces of the subcommands: logging set-up, formatting and flag checks.
// No generation logic here; uses no internal header (the API clients include it).
#pragma once

#include <CLI/CLI.hpp>
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

}  // namespace sdxl::cli
