// `sdxl-batch run`: every task of a batch file, one image after another.
// The batch is validated (schema and the model's limits) before any module is
// loaded; a task that fails is recorded and the batch goes on (exit code 3).
#include <spdlog/spdlog.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "sdxl/atomic_file.h"
#include "sdxl/batch_file.h"
#include "sdxl/error.h"
#include "sdxl/png_writer.h"

namespace sdxl::cli {

struct RunArgs {
  ModelOptions model;
  std::string batch_file, out_dir;
};

CLI::App* add_run(CLI::App& app, std::shared_ptr<RunArgs>& args) {
  args = std::make_shared<RunArgs>();
  auto* cmd = app.add_subcommand("run", "Generate every image of a batch file");
  cmd->add_option("batch", args->batch_file, "Batch file (JSON)")->required()->check(CLI::ExistingFile);
  add_model_options(*cmd, args->model, /*model_required=*/false);
  cmd->add_option("--out,-o", args->out_dir, "Output folder (default: the batch's output.dir, else ./out)");
  return cmd;
}

namespace {

std::filesystem::path relative_to_batch(const std::filesystem::path& batch, const std::string& p) {
  std::filesystem::path q(p);
  return q.is_absolute() ? q : batch.parent_path() / q;
}

}  // namespace

int run_run(const RunArgs& a) {
  using Clock = std::chrono::steady_clock;
  const std::filesystem::path batch_path(a.batch_file);
  // First pass finds the model; the second applies the model's defaults.
  const BatchFile probe = parse_batch_file(batch_path, GenerationParams{});
  std::filesystem::path model_dir;
  if (!a.model.model_dir.empty()) model_dir = a.model.model_dir;
  else if (!probe.model.empty()) model_dir = relative_to_batch(batch_path, probe.model);
  else throw UsageError("no model: pass --model DIR or set \"model\" in " + batch_path.string());
  const ModelConfig mc = load_model_config(model_dir);
  GenerationParams model_defaults;
  model_defaults.steps = mc.defaults.steps;
  model_defaults.cfg = mc.defaults.cfg;
  model_defaults.width = mc.defaults.width;
  model_defaults.height = mc.defaults.height;
  BatchFile batch = parse_batch_file(batch_path, model_defaults);
  for (size_t i = 0; i < batch.tasks.size(); ++i) {
    try {
      check_generation_size(mc, batch.tasks[i].params.width, batch.tasks[i].params.height, 1);
    } catch (const UsageError& e) {
      throw UsageError(batch_path.string() + ": /tasks/" + std::to_string(i) + ": " + e.what());
    }
  }
  std::filesystem::path out_dir = !a.out_dir.empty()            ? std::filesystem::path(a.out_dir)
                                  : !batch.output_dir.empty()   ? relative_to_batch(batch_path, batch.output_dir)
                                                                : std::filesystem::path("out");
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw IoError("cannot create output folder '" + out_dir.string() + "': " + ec.message());

  int total = 0;
  for (const auto& t : batch.tasks) total += t.count;
  spdlog::info("batch {}: {} task(s), {} image(s) -> {}", batch_path.string(), batch.tasks.size(), total, out_dir.string());

  Generator gen(model_dir, a.model.runtime);
  const auto t_run = Clock::now();
  nlohmann::json images = nlohmann::json::array();
  nlohmann::json failures = nlohmann::json::array();
  int done = 0;
  for (BatchTask& task : batch.tasks) {
    if (task.seed_random) task.params.seed = random_seed();
    for (int i = 0; i < task.count; ++i) {
      GenerationParams p = task.params;
      p.seed = task.params.seed + i;
      const auto file = out_dir / output_file_name(task, i, p.seed);
      try {
        const auto t0 = Clock::now();
        GeneratedImage img = gen.generate(p);
        const auto t1 = Clock::now();
        write_png(file, img.width, img.height, 3, img.rgb.data(), {{"parameters", a1111_parameters(p, mc.name)}});
        const double write_s = std::chrono::duration<double>(Clock::now() - t1).count();
        const double total_s = std::chrono::duration<double>(Clock::now() - t0).count();
        ++done;
        spdlog::info("[{}/{}] {} ({:.2f} s)", done, total, file.filename().string(), total_s);
        images.push_back({{"task", task.id}, {"index", i}, {"seed", p.seed}, {"file", file.filename().string()},
                          {"width", p.width}, {"height", p.height}, {"steps", p.steps}, {"cfg", p.cfg},
                          {"text_s", img.seconds.text}, {"sample_s", img.seconds.sample},
                          {"decode_s", img.seconds.decode}, {"write_s", write_s}, {"total_s", total_s}});
      } catch (const TaskError& e) {
        spdlog::error("task {} image {} failed: {}", task.id, i, e.what());
        failures.push_back({{"task", task.id}, {"index", i}, {"seed", p.seed}, {"error", e.what()}});
      } catch (const UsageError& e) {
        spdlog::error("task {} image {} failed: {}", task.id, i, e.what());
        failures.push_back({{"task", task.id}, {"index", i}, {"seed", p.seed}, {"error", e.what()}});
      }
    }
  }
  const double run_s = std::chrono::duration<double>(Clock::now() - t_run).count();
  nlohmann::json report = {{"batch", batch_path.string()}, {"model", mc.name}, {"device", gen.device_name()},
                           {"images_total", total}, {"images_done", done}, {"images_failed", failures.size()},
                           {"load_s", gen.load_seconds()}, {"run_s", run_s},
                           {"images_per_hour", run_s > 0 ? done * 3600.0 / run_s : 0.0},
                           {"peak_memory_bytes", gen.peak_memory_bytes()}, {"images", images}, {"failures", failures}};
  write_file_atomic(out_dir / "report.json", report.dump(2) + "\n");
  spdlog::info("done: {}/{} image(s) in {:.1f} s, {} failed; report {}", done, total, run_s, failures.size(),
               (out_dir / "report.json").string());
  return failures.empty() ? 0 : static_cast<int>(ExitCode::kTasksFailed);
}

}  // namespace sdxl::cli
