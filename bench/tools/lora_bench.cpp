// sdxl-lora-bench: times what users feel when they switch LoRAs — loading a
// LoRA from disk onto the device, switching between two cached ones, and
// restoring the base weights — on the real model and device. No images.
// A benchmark tool beside the product CLI (bench/bench_lora.sh runs it).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>

#include "api/options.h"
#include "cli/cli_common.h"
#include "cli/model_flags.h"
#include "core/atomic_file.h"
#include "core/error.h"

namespace sdxl::cli {

struct LoraBenchArgs {
  ModelFlags model;
  std::vector<std::string> loras;
  int switches = 20;
  std::string json_out;
};

namespace {

void add_lora_bench_options(CLI::App& app, LoraBenchArgs& a) {
  LoraBenchArgs* args = &a;
  CLI::App* cmd = &app;
  add_model_options(*cmd, args->model, /*model_required=*/true);
  cmd->add_option("--lora", args->loras, "Two LoRA files FILE[:WEIGHT] to switch between")->required()->expected(2);
  cmd->add_option("--switches", args->switches, "Cached switches to time (alternating A, B)")->check(CLI::Range(2, 100000));
  cmd->add_option("--json", args->json_out, "Write the figures as JSON to this file");
}

int run_lora_bench(const LoraBenchArgs& args) {
  using Clock = std::chrono::steady_clock;
  const sdxl_batch::ModelOptions mo = args.model.resolved();
  const LoraRef a = parse_lora_arg(args.loras.at(0)), b = parse_lora_arg(args.loras.at(1));
  Generator gen(mo.model_dir, api::runtime_options(mo));
  auto timed = [&](const std::vector<LoraRef>& set) {
    const auto t0 = Clock::now();
    (void)gen.set_loras(set);  // synchronises the device before returning
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  const double cold_a = timed({a});
  const LoraStats after_a = gen.lora_stats();
  const double cold_b = timed({b});
  const LoraStats after_b = gen.lora_stats();
  std::vector<double> sw;
  for (int i = 0; i < args.switches; ++i) sw.push_back(timed({i % 2 == 0 ? a : b}));
  const double restore = timed({});
  const LoraStats st = gen.lora_stats();
  std::vector<double> sorted = sw;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  double mean = 0;
  for (double s : sw) mean += s / static_cast<double>(sw.size());
  spdlog::info("lora-bench on {} ({}): first load of A {:.3f} s (read+upload {:.3f} s, merge {:.3f} s), of B {:.3f} s "
               "(read+upload {:.3f} s); cached switch A<->B: median {:.4f} s, mean {:.4f} s, min {:.4f} s, max {:.4f} s "
               "over {}; restore to base {:.4f} s; cache {:.1f} MiB",
               gen.device_name(), gen.model().name, cold_a, after_a.load_s, after_a.merge_s, cold_b,
               after_b.load_s - after_a.load_s, median, mean, sorted.front(), sorted.back(), sw.size(), restore,
               st.bytes_held / 1048576.0);
  nlohmann::json j = {{"device", gen.device_name()},
                      {"model", gen.model().name},
                      {"lora_a", a.path.string()},
                      {"lora_b", b.path.string()},
                      {"first_apply_a_s", cold_a},
                      {"load_a_s", after_a.load_s},
                      {"hash_a_s", after_a.hash_s},
                      {"merge_a_s", after_a.merge_s},
                      {"first_apply_b_s", cold_b},
                      {"load_b_s", after_b.load_s - after_a.load_s},
                      {"switch_median_s", median},
                      {"switch_mean_s", mean},
                      {"switch_min_s", sorted.front()},
                      {"switch_max_s", sorted.back()},
                      {"switches", sw.size()},
                      {"restore_s", restore},
                      {"cache_bytes", st.bytes_held},
                      {"cache_budget_bytes", st.budget_bytes},
                      {"hits", st.hits},
                      {"misses", st.misses}};
  std::cout << j.dump(2) << "\n";
  if (!args.json_out.empty()) write_file_atomic(args.json_out, j.dump(2) + "\n");
  return 0;
}

}  // namespace
}  // namespace sdxl::cli

int main(int argc, char** argv) {
  CLI::App app{"sdxl-lora-bench: time LoRA load from disk, cached switches and restore (no images)", "sdxl-lora-bench"};
  std::string log_level, log_file;
  sdxl::cli::add_log_options(app, log_level, log_file);
  sdxl::cli::LoraBenchArgs args;
  sdxl::cli::add_lora_bench_options(app, args);
  CLI11_PARSE(app, argc, argv);
  try {
    sdxl::cli::setup_logging(log_level, log_file);
    return sdxl::cli::run_lora_bench(args);
  } catch (const sdxl::Error& e) {
    spdlog::error("{}", e.what());
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    spdlog::error("unexpected error: {}", e.what());
    return static_cast<int>(sdxl::ExitCode::kFatal);
  }
}
