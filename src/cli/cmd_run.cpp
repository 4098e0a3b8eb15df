// `sdxl-batch run`: every image of a batch file into an output folder, resumable.
// The batch is validated (schema and the model's limits) before any module is
// loaded; the model loads only when there is an image left to make.
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "sdxl/batch_file.h"
#include "sdxl/batch_runner.h"
#include "sdxl/error.h"
#include "sdxl/run_lock.h"

namespace sdxl::cli {

struct RunArgs {
  ModelOptions model;
  std::string batch_file, out_dir, lock_file, max_runtime, shard;
  bool force = false, skip_invalid = false;
};

CLI::App* add_run(CLI::App& app, std::shared_ptr<RunArgs>& args) {
  args = std::make_shared<RunArgs>();
  auto* cmd = app.add_subcommand("run", "Generate every image of a batch file (a rerun resumes)");
  cmd->add_option("batch", args->batch_file, "Batch file (JSON)")->required()->check(CLI::ExistingFile);
  add_model_options(*cmd, args->model, /*model_required=*/false);
  cmd->add_option("--out,-o", args->out_dir, "Output folder (default: the batch's output.dir, else ./out)");
  cmd->add_flag("--force", args->force, "Generate every image again, even those the manifest shows as done");
  cmd->add_flag("--skip-invalid", args->skip_invalid,
                "Run the valid tasks of a batch file that has invalid ones (those are reported as failed)");
  cmd->add_option("--max-runtime", args->max_runtime, "Stop taking new images after this long (e.g. 90m, 6h)");
  cmd->add_option("--shard", args->shard, "Take share K of N of the tasks (K/N, 0 <= K < N), e.g. a job array index");
  cmd->add_option("--lock", args->lock_file, "Lock file (default: .sdxl-batch.lock in the output folder)");
  return cmd;
}

namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int sig) {
  if (g_stop.exchange(true)) {  // second signal: stop now
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  const char msg[] = "\nsdxl-batch: stopping after the image in flight (signal again to abort)\n";
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
}

std::filesystem::path relative_to_batch(const std::filesystem::path& batch, const std::string& p) {
  std::filesystem::path q(p);
  return q.is_absolute() ? q : batch.parent_path() / q;
}

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw UsageError("cannot read batch file '" + path.string() + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// --skip-invalid: problems under /tasks/N drop task N (reported as failed);
// any other problem (the file's structure) still refuses the whole file.
BatchFile load_valid_tasks(const std::filesystem::path& path, const ModelConfig& mc,
                           std::vector<std::pair<std::string, std::string>>& invalid) {
  const std::vector<BatchProblem> problems = validate_batch_file(path, &mc);
  std::map<size_t, std::string> bad;  // task position -> errors
  std::vector<BatchProblem> fatal;
  for (const auto& p : problems) {
    size_t pos = 0;
    if (std::sscanf(p.pointer.c_str(), "/tasks/%zu", &pos) == 1) {
      bad[pos] += (bad[pos].empty() ? "" : "; ") + p.pointer + ": " + p.message;
    } else {
      fatal.push_back(p);
    }
  }
  if (!fatal.empty()) {
    std::string msg = path.string() + " cannot run even with --skip-invalid:";
    for (const auto& p : fatal) msg += "\n  " + (p.pointer.empty() ? std::string("/") : p.pointer) + " (line " +
                                       std::to_string(p.line) + "): " + p.message;
    throw UsageError(msg);
  }
  std::vector<BatchProblem> ignored;
  BatchFile bf = parse_batch_text(read_text_file(path), path, defaults_of(mc), &ignored);
  std::vector<BatchTask> kept;
  for (size_t i = 0; i < bf.tasks.size(); ++i) {
    auto it = bad.find(i);
    if (it == bad.end()) {
      kept.push_back(bf.tasks[i]);
      continue;
    }
    const std::string id = bf.tasks[i].id.empty() ? "/tasks/" + std::to_string(i) : bf.tasks[i].id;
    spdlog::warn("skipping invalid task {}: {}", id, it->second);
    invalid.emplace_back(id, it->second);
  }
  bf.tasks = std::move(kept);
  return bf;
}

}  // namespace

int run_run(const RunArgs& a) {
  const std::filesystem::path batch_path(a.batch_file);
  const auto shard = a.shard.empty() ? std::pair<int, int>{0, 1} : parse_shard(a.shard);
  const double max_runtime_s = a.max_runtime.empty() ? 0.0 : parse_duration_s(a.max_runtime);
  // First pass only finds the model (problems are reported by the second pass,
  // which applies the model's defaults and limits).
  std::vector<BatchProblem> probe_problems;
  const BatchFile probe = parse_batch_text(read_text_file(batch_path), batch_path, GenerationParams{}, &probe_problems);
  std::filesystem::path model_dir;
  if (!a.model.model_dir.empty()) model_dir = a.model.model_dir;
  else if (!probe.model.empty()) model_dir = relative_to_batch(batch_path, probe.model);
  else throw UsageError("no model: pass --model DIR or set \"model\" in " + batch_path.string());
  const ModelConfig mc = load_model_config(model_dir);
  std::vector<std::pair<std::string, std::string>> invalid;
  const BatchFile batch = a.skip_invalid ? load_valid_tasks(batch_path, mc, invalid) : [&] {
    BatchFile bf = parse_batch_file(batch_path, defaults_of(mc));
    for (size_t i = 0; i < bf.tasks.size(); ++i) {
      try {
        check_generation_size(mc, bf.tasks[i].params.width, bf.tasks[i].params.height, 1);
      } catch (const UsageError& e) {
        throw UsageError(batch_path.string() + ": /tasks/" + std::to_string(i) + ": " + e.what());
      }
    }
    return bf;
  }();
  const std::filesystem::path out_dir = !a.out_dir.empty()          ? std::filesystem::path(a.out_dir)
                                        : !batch.output_dir.empty() ? relative_to_batch(batch_path, batch.output_dir)
                                                                    : std::filesystem::path("out");
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw IoError("cannot create output folder '" + out_dir.string() + "': " + ec.message());
  // Shards of one batch share the folder; each holds its own lock.
  const std::string lock_name = shard.second > 1 ? ".sdxl-batch-shard-" + std::to_string(shard.first) + "-of-" +
                                                       std::to_string(shard.second) + ".lock"
                                                 : ".sdxl-batch.lock";
  RunLock lock(a.lock_file.empty() ? out_dir / lock_name : std::filesystem::path(a.lock_file));

  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);

  ModelOptions model_opts = a.model;
  model_opts.finish();
  std::unique_ptr<Generator> gen;  // loaded on the first image that needs it
  auto generator = [&]() -> Generator& {
    if (!gen) {
      gen = std::make_unique<Generator>(model_dir, model_opts.runtime);
      gen->set_lora_registry(batch.lora_registry);
    }
    return *gen;
  };
  RunOptions o;
  o.out_dir = out_dir;
  o.force = a.force;
  o.max_runtime_s = max_runtime_s;
  o.shard_index = shard.first;
  o.shard_count = shard.second;
  o.stop = &g_stop;
  o.invalid_tasks = invalid;
  o.model_name = mc.name;
  o.device_name = [&] { return generator().device_name(); };
  o.load_seconds = [&] { return generator().load_seconds(); };
  o.memory_bytes = [&] { return generator().memory_in_use_bytes(); };
  o.peak_memory_bytes = [&] { return generator().peak_memory_bytes(); };
  o.lora_stats = [&] { return gen ? gen->lora_stats() : LoraStats{}; };
  spdlog::info("batch {}: {} task(s) -> {}", batch_path.string(), batch.tasks.size(), out_dir.string());
  const RunResult r = run_batch(batch, o, [&](const GenerationParams& p) { return generator().generate(p); });
  return static_cast<int>(r.exit_code());
}

}  // namespace sdxl::cli
