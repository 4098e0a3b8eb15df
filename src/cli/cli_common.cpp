#include "cli/cli_common.h"

#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <tuple>

namespace sdxl::cli {

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

void add_upscale_flags(CLI::App& cmd, UpscaleFlags& f, bool model_required) {
  auto* model = cmd.add_option("--upscale-model", f.model,
                               "An upscaler folder (export_sdxl.py --upscaler), or Lanczos for no model");
  if (model_required) model->required();
  auto* by = cmd.add_option("--upscale", f.scale, "Upscale by this factor (the model's passes, then LANCZOS)");
  auto* to = cmd.add_option("--upscale-size", f.size, "Upscale to this frame, WxH (e.g. 1080x1920)");
  by->excludes(to);
  cmd.add_option("--upscale-fit", f.fit, "With --upscale-size: crop (fill, centre cut), pad (fit, black bars) "
                                         "or stretch (default)")
      ->check(CLI::IsMember({"crop", "pad", "stretch"}));
}

sdxl_batch::Upscale upscale_of_flags(const UpscaleFlags& f) {
  sdxl_batch::Upscale u;
  u.model = f.model;
  u.fit = f.fit;
  if (!f.size.empty()) {
    try {
      std::tie(u.width, u.height) = sdxl_batch::parse_frame_size(f.size);
    } catch (const sdxl_batch::UsageError& e) {
      throw sdxl_batch::UsageError(std::string("--upscale-size ") + e.what());
    }
  } else if (!f.scale.empty()) {
    std::size_t n = 0;
    try {
      u.scale = std::stod(f.scale, &n);
    } catch (const std::exception&) {
      n = 0;
    }
    if (n != f.scale.size() || !(u.scale > 0) || !std::isfinite(u.scale))
      throw sdxl_batch::UsageError("--upscale '" + f.scale + "': must be a number above 0");
  } else if (!f.model.empty()) {
    throw sdxl_batch::UsageError("--upscale-model needs --upscale S or --upscale-size WxH");
  }
  if (f.model.empty() && (!f.size.empty() || !f.scale.empty()))
    throw sdxl_batch::UsageError("--upscale / --upscale-size need --upscale-model DIR|Lanczos");
  return u;
}

}  // namespace sdxl::cli
