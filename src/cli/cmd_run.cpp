// `sdxl-batch run`: every image of a batch file into an output folder, resumable.
// The batch is validated (schema and the model's limits) before any module is
// loaded; the model loads only when there is an image left to make.
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "batch/batch_file.h"
#include "check/batch_check.h"
#include "scheduler/generator_lane.h"
#include "scheduler/run_batch.h"
#include "core/error.h"
#include "core/run_lock.h"
#include "cli/progress.h"
#include "core/units.h"

namespace sdxl::cli {

struct RunArgs {
  ModelOptions model;
  std::string batch_file, out_dir, lock_file, max_runtime, shard, vram_limit, timeout, aging = "15m", order = "queue";
  std::string devices;
  std::vector<std::string> wildcard_dirs;
  bool force = false, skip_invalid = false, dry_run = false, no_progress = false, no_overlap = false;
  int max_batch = 1, retries = 1, release_every = 0, writer_threads = 2;
  int clip_skip = 0;  // 0: not given
  double safety = 1.2, retry_backoff = 2.0, progress_interval = 10.0;
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
  cmd->add_option("--max-runtime", args->max_runtime, "Stop taking new images after this long (e.g. 90m, 6h; 0: no limit)");
  cmd->add_option("--shard", args->shard, "Take share K of N of the tasks (K/N, 0 <= K < N), e.g. a job array index");
  cmd->add_option("--lock", args->lock_file,
                  "Also hold this lock file (e.g. one per machine for cron); the output folder's own lock is always held");
  cmd->add_option("--wildcards-dir", args->wildcard_dirs,
                  "Folder of __name__ wildcard files (NAME.txt), searched before the batch's wildcards_dir (repeatable)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--clip-skip", args->clip_skip,
                  "Clip skip of the tasks that set none (the batch file's \"clip_skip\", in defaults or a task, wins): "
                  "1 or 2 = SDXL's default, N >= 3 = hidden_states[-N] of both text encoders")
      ->check(CLI::Range(1, 256));
  cmd->add_flag("--dry-run", args->dry_run,
                "Print the plan (batches, estimated memory and time) and exit; loads no model weights");
  cmd->add_option("--vram-limit", args->vram_limit,
                  "Device memory budget, e.g. 24GiB or 12GiB (default: the card); enforced on the allocator");
  cmd->add_option("--max-batch", args->max_batch,
                  "Images per UNet call at most (the memory budget or the model's batch_max may allow fewer). "
                  "Above 1, an image can differ by a few 1-level pixels from the same seed made alone (other "
                  "kernel shapes); 1 keeps every image bit-identical whatever else is in the batch file")
      ->capture_default_str()->check(CLI::Range(1, 64));
  cmd->add_option("--safety", args->safety, "A batch runs only if its estimated peak times this fits")
      ->capture_default_str()->check(finite_range(1.0, 4.0));
  cmd->add_option("--retries", args->retries, "Extra attempts of an image that failed (not for bad settings)")
      ->capture_default_str()->check(CLI::Range(0, 10));
  cmd->add_option("--retry-backoff", args->retry_backoff, "Seconds before the first retry; doubles each time")
      ->capture_default_str()->check(finite_range(0.0, 3600.0));
  cmd->add_option("--timeout", args->timeout,
                  "Cancel an image running longer than this (e.g. 120s, 5m; 0: no limit); tasks may set their own");
  cmd->add_option("--aging", args->aging, "A waiting image moves up one priority class per this long (0: no aging)")
      ->capture_default_str();
  cmd->add_option("--release-every", args->release_every, "Free the allocator's cached blocks every N images (0: only after an out-of-memory)")
      ->capture_default_str()->check(CLI::Range(0, 100000));
  cmd->add_option("--writer-threads", args->writer_threads, "Threads that encode and write PNGs")
      ->capture_default_str()->check(CLI::Range(1, 32));
  cmd->add_option("--order", args->order,
                  "queue: priorities, deadlines, aging, fewest LoRA switches; file: the batch file's order (a baseline)")
      ->capture_default_str()
      ->check(CLI::IsMember({"queue", "file"}));
  cmd->add_option("--devices", args->devices,
                  "GPUs to use together: all, or indices like 0,1 (one model copy and pipeline per GPU; "
                  "default: --device alone)");
  cmd->add_flag("--no-overlap", args->no_overlap,
                "One batch at a time per device (no text/sample/decode overlap between batches): a baseline");
  cmd->add_flag("--no-progress", args->no_progress, "No progress bar on a terminal (plain lines instead)");
  cmd->add_option("--progress-interval", args->progress_interval, "Seconds between plain progress lines when not on a terminal")
      ->capture_default_str()->check(finite_range(0.0, 86400.0));
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

// --devices: "all" (every CUDA device), or indices "0,1" -> "cuda:0", "cuda:1";
// empty: the one --device.
std::vector<std::string> resolve_devices(const std::string& spec, const std::string& device) {
  if (spec.empty()) return {device};
  std::vector<std::string> out;
  const int count = cuda_device_count();
  if (spec == "all") {
    if (count == 0) throw UsageError("--devices all: no CUDA device is visible");
    for (int i = 0; i < count; ++i) out.push_back("cuda:" + std::to_string(i));
    return out;
  }
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty() || item.size() > 4 || item.find_first_not_of("0123456789") != std::string::npos)
      throw UsageError("--devices '" + spec + "': expected all, or GPU indices like 0,1 (got '" + item + "')");
    const int index = std::stoi(item);
    if (index >= count)
      throw UsageError("--devices '" + spec + "': GPU " + item + " does not exist (" + std::to_string(count) +
                       " CUDA device(s) visible)");
    const std::string name = "cuda:" + item;
    if (std::find(out.begin(), out.end(), name) != out.end())
      throw UsageError("--devices '" + spec + "': GPU " + item + " is listed twice");
    out.push_back(name);
  }
  if (out.empty()) throw UsageError("--devices '" + spec + "': no GPU listed");
  return out;
}

std::filesystem::path relative_to_batch(const std::filesystem::path& batch, const std::string& p) {
  std::filesystem::path q(p);
  return q.is_absolute() ? q : batch.parent_path() / q;
}


// --skip-invalid: problems under /tasks/N drop task N (reported as failed);
// any other problem (the file's structure) still refuses the whole file.
BatchFile keep_valid_tasks(const std::filesystem::path& path, CheckedBatch checked,
                           std::vector<std::pair<std::string, std::string>>& invalid) {
  std::map<size_t, std::string> bad;  // task position -> errors
  std::vector<BatchProblem> fatal;
  for (const auto& p : checked.problems) {
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
  BatchFile& bf = checked.file;
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
  return std::move(bf);
}

void save_estimates(const WorkEstimator& e, const std::filesystem::path& path) {
  if (e.empty()) return;
  try {
    e.save(path);
  } catch (const std::exception& ex) {
    spdlog::warn("could not save the measured estimates: {}", ex.what());
  }
}

// --dry-run: the queue's plan with the estimates measured by earlier runs into
// the same folder; reads model.json only (no weights are loaded).
int print_plan(const std::filesystem::path& batch_path, const BatchFile& batch, const ModelConfig& mc, const RunOptions& o,
               std::uint64_t vram_limit, const std::string& why_no_estimates) {
  const std::uint64_t free_bytes = vram_limit > 0 ? vram_limit - std::min(vram_limit, module_file_bytes(mc)) : UINT64_MAX;
  const BatchPlan plan = plan_batch(batch, o, free_bytes);
  std::printf("plan for %s (model %s, output %s)\n", batch_path.c_str(), mc.name.c_str(), o.out_dir.c_str());
  std::printf("  %d image(s): %d to make, %d already done\n", plan.total, plan.to_make, plan.skipped);
  if (o.estimator->empty())
    std::printf("  estimates: none measured yet (%s); each new size runs alone first and is measured\n",
                why_no_estimates.c_str());
  else
    std::printf("  estimates: measured by earlier runs into this folder (%s)\n", o.estimator->device().c_str());
  if (vram_limit == 0)
    std::printf("  memory budget: not given (--vram-limit); batches are capped by --max-batch %d only\n",
                o.queue.max_batch);
  else
    std::printf("  memory budget %s: weights %s, %s left for work (x%.2f safety)\n", format_bytes(vram_limit).c_str(),
                format_bytes(module_file_bytes(mc)).c_str(), format_bytes(free_bytes).c_str(), o.safety);
  std::printf("  %-4s %-6s %-11s %5s %6s %12s %10s  %s\n", "#", "prio", "size", "steps", "images", "est. memory",
              "est. time", "images");
  int k = 0;
  for (const auto& b : plan.batches) {
    const std::string mem = b.est_peak_bytes >= 0 ? format_bytes(static_cast<std::uint64_t>(b.est_peak_bytes)) : "probe";
    const std::string time = b.est_seconds >= 0 ? format_eta(b.est_seconds) + (b.time_measured ? "" : "~") : "?";
    std::string names;
    for (size_t i = 0; i < b.images.size(); ++i) {
      if (i == 4) {
        names += ", +" + std::to_string(b.images.size() - 4);
        break;
      }
      names += (i ? ", " : "") + b.images[i];
    }
    std::printf("  %-4d %-6s %5dx%-5d %5d %6zu %12s %10s  %s\n", ++k, b.priority.c_str(), b.width, b.height, b.steps,
                b.images.size(), mem.c_str(), time.c_str(), names.c_str());
  }
  std::printf("  %zu batch(es); estimated time %s\n", plan.batches.size(),
              plan.est_seconds >= 0 ? format_eta(plan.est_seconds).c_str() : "unknown until each size is measured");
  return 0;
}

// The model folder: --model, else the batch file's "model" (relative to it).
// This first pass only finds the model; the problems are reported by the
// second pass, which applies the model's defaults and limits.
std::filesystem::path find_model_dir(const RunArgs& a, const std::filesystem::path& batch_path) {
  if (!a.model.model_dir.empty()) return a.model.model_dir;
  std::vector<BatchProblem> probe_problems;
  const BatchFile probe = parse_batch_text(read_batch_text(batch_path), batch_path, GenerationParams{}, &probe_problems);
  if (!probe.model.empty()) return relative_to_batch(batch_path, probe.model);
  throw UsageError("no model: pass --model DIR or set \"model\" in " + batch_path.string());
}

// The batch file checked against the model as `validate` checks it (or its
// valid tasks, with --skip-invalid); any problem refuses the run (exit 2).
BatchFile load_batch(const RunArgs& a, const std::filesystem::path& batch_path, const ModelConfig& mc,
                     std::vector<std::pair<std::string, std::string>>& invalid) {
  BatchCheckInputs inputs;
  inputs.fallback = defaults_of(mc);
  inputs.fallback.clip_skip = a.clip_skip;  // checked against the model by run_run
  if (!a.model.vae_dir.empty())
    inputs.fallback.vae = std::filesystem::absolute(a.model.vae_dir).lexically_normal().string();
  inputs.wildcard_dirs.assign(a.wildcard_dirs.begin(), a.wildcard_dirs.end());
  inputs.embedding_dirs.assign(a.model.embedding_dirs.begin(), a.model.embedding_dirs.end());
  CheckedBatch checked = check_batch_file(batch_path, &mc, inputs);
  for (const std::string& note : checked.notes) spdlog::warn("{}: {}", batch_path.string(), note);
  if (a.skip_invalid) return keep_valid_tasks(batch_path, std::move(checked), invalid);
  if (!checked.problems.empty()) throw UsageError(describe_problems(batch_path, checked.problems));
  return std::move(checked.file);
}

// A duration flag's seconds (0: no limit); UsageError naming the flag for
// anything else than a finite duration of 0 or more.
double duration_flag(const std::string& flag, const std::string& text) {
  try {
    return parse_duration_s(text);
  } catch (const UsageError& e) {
    throw UsageError(flag + ": " + e.what());
  }
}

// The scheduler's options from the flags (resume, shard, queue, retries).
RunOptions run_options(const RunArgs& a) {
  const auto shard = a.shard.empty() ? std::pair<int, int>{0, 1} : parse_shard(a.shard);
  RunOptions o;
  o.force = a.force;
  o.max_runtime_s = a.max_runtime.empty() ? 0.0 : duration_flag("--max-runtime", a.max_runtime);
  o.shard_index = shard.first;
  o.shard_count = shard.second;
  o.queue.max_batch = a.max_batch;
  o.queue.aging_s = duration_flag("--aging", a.aging);
  o.queue.file_order = a.order == "file";
  o.safety = a.safety;
  o.retries = a.retries;
  o.retry_backoff_s = a.retry_backoff;
  o.timeout_s = a.timeout.empty() ? 0.0 : duration_flag("--timeout", a.timeout);
  o.release_every = a.release_every;
  o.writer_threads = a.writer_threads;
  o.overlap = !a.no_overlap;
  return o;
}

// The locks of a run (core/run_lock.h): the folder's lock, exclusive for a plain
// run and shared by shard runs; each shard's own lock; and --lock FILE. Shards
// of one folder must agree on N, or their tasks would overlap.
std::vector<std::unique_ptr<RunLock>> take_locks(const RunArgs& a, const std::filesystem::path& out_dir,
                                                 const RunOptions& o) {
  const bool sharded = o.shard_count > 1;
  const std::vector<std::string> shards = held_shard_locks(out_dir);
  if (!sharded && !shards.empty())
    throw Error(ExitCode::kLocked, "shard run(s) " + shards.front() + (shards.size() > 1 ? " and others" : "") +
                                       " are working in '" + out_dir.string() +
                                       "'; a run without --shard would make their images again: wait for them");
  for (const std::string& k : shards)
    if (sharded && k.substr(k.find('/') + 1) != std::to_string(o.shard_count))
      throw Error(ExitCode::kLocked, "shard run " + k + " is working in '" + out_dir.string() + "'; --shard " +
                                         a.shard + " splits the tasks differently (use the same N)");
  std::vector<std::unique_ptr<RunLock>> locks;
  locks.push_back(std::make_unique<RunLock>(out_dir / ".sdxl-batch.lock",
                                            sharded ? LockMode::kShared : LockMode::kExclusive));
  if (sharded) locks.push_back(std::make_unique<RunLock>(out_dir / shard_lock_name(o.shard_index, o.shard_count)));
  if (!a.lock_file.empty()) locks.push_back(std::make_unique<RunLock>(a.lock_file));
  return locks;
}

// The LoRA cache's hit rate over the lanes for the progress line ("" before any LoRA).
std::string lora_hit_rate(const std::vector<std::unique_ptr<GeneratorLane>>& lanes) {
  std::uint64_t hits = 0, misses = 0;
  for (const auto& lane : lanes) {
    const LoraStats ls = lane->lora_stats();
    hits += ls.hits;
    misses += ls.misses;
  }
  if (hits + misses == 0) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, "LoRA hits %.0f%%", 100.0 * static_cast<double>(hits) / static_cast<double>(hits + misses));
  return buf;
}

// Runs the batch on one lane per device, each with its own model copy loaded
// on the lane's thread when there is an image left to make (several GPUs
// load at once). Saves the measured estimates whatever happens.
int run_on_devices(const RunArgs& a, const BatchFile& batch, const std::filesystem::path& model_dir, RunOptions& o,
                   std::uint64_t vram_limit, WorkEstimator& estimator, const std::filesystem::path& estimates_path) {
  ModelOptions model_opts = a.model;
  model_opts.finish();
  for (const auto& d : batch.embedding_dirs) model_opts.runtime.embedding_dirs.push_back(d);
  o.stop = &g_stop;
  o.allocator = [] { return cuda_allocator_settings(); };  // set by the first CUDA generator
  std::vector<std::unique_ptr<GeneratorLane>> lanes;
  std::vector<DeviceLane*> lane_ptrs;
  for (const std::string& dev : resolve_devices(a.devices, model_opts.runtime.device)) {
    RuntimeOptions ro = model_opts.runtime;
    ro.device = dev;
    lanes.push_back(std::make_unique<GeneratorLane>(model_dir, ro, batch.lora_registry, vram_limit));
    lane_ptrs.push_back(lanes.back().get());
  }
  if (lanes.size() > 1) spdlog::info("{} devices: {}", lanes.size(), a.devices);
  Progress progress(!a.no_progress && Progress::stderr_is_terminal(), a.progress_interval);
  o.on_progress = [&](const ProgressInfo& info) { progress.update(info); };
  o.status_extra = [&] { return lora_hit_rate(lanes); };
  spdlog::info("batch {}: {} task(s) -> {}", batch.path.string(), batch.tasks.size(), o.out_dir.string());
  RunResult r;
  try {
    r = run_batch(batch, o, lane_ptrs);
  } catch (...) {
    progress.finish();
    save_estimates(estimator, estimates_path);
    throw;
  }
  progress.finish();
  save_estimates(estimator, estimates_path);
  return static_cast<int>(r.exit_code());
}

}  // namespace

int run_run(const RunArgs& a) {
  const std::filesystem::path batch_path(a.batch_file);
  RunOptions o = run_options(a);
  const std::filesystem::path model_dir = find_model_dir(a, batch_path);
  const ModelConfig mc = with_unet_precision(load_model_config(model_dir), a.model.runtime.precision, a.model.runtime.dtype);
  verify_model_if_asked(a.model, mc);
  if (a.clip_skip != 0) {
    try {
      check_clip_skip(mc, a.clip_skip);
    } catch (const UsageError& e) {
      throw UsageError(std::string("--clip-skip: ") + e.what());
    }
  }
  std::vector<std::pair<std::string, std::string>> invalid;
  const BatchFile batch = load_batch(a, batch_path, mc, invalid);
  std::vector<const GenerationParams*> task_params;
  for (const BatchTask& t : batch.tasks) task_params.push_back(&t.params);
  verify_task_folders_if_asked(a.model, task_params);
  const std::filesystem::path out_dir = !a.out_dir.empty()          ? std::filesystem::path(a.out_dir)
                                        : !batch.output_dir.empty() ? relative_to_batch(batch_path, batch.output_dir)
                                                                    : std::filesystem::path("out");
  o.out_dir = out_dir;
  o.model_name = mc.name;
  o.model_sources = model_sources(mc);
  o.invalid_tasks = invalid;
  if (o.queue.max_batch > mc.limits.batch_max) {
    spdlog::warn("--max-batch {} is above the batch_max {} of model '{}' (model.json /limits/batch_max; "
                 "export_sdxl.py --batch-max N makes a model for more): batches of at most {} images",
                 o.queue.max_batch, mc.limits.batch_max, mc.name, mc.limits.batch_max);
    o.queue.max_batch = mc.limits.batch_max;
  }
  const std::uint64_t vram_limit = a.vram_limit.empty() ? 0 : parse_size_bytes(a.vram_limit);
  // Memory and time per size measured by earlier runs into this folder on this device.
  const std::string device_key = a.model.runtime.device + "/" + (a.model.runtime.dtype.empty() ? mc.dtype : a.model.runtime.dtype) +
                                 (mc.unet_precision.empty() ? "" : "/unet-" + mc.unet_precision);
  const std::filesystem::path estimates_path = out_dir / "estimates.json";
  std::string why_no_estimates;
  WorkEstimator estimator = WorkEstimator::load(estimates_path, device_key, mc.name, &why_no_estimates);
  o.estimator = &estimator;
  if (a.dry_run) return print_plan(batch_path, batch, mc, o, vram_limit, why_no_estimates);

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw IoError("cannot create output folder '" + out_dir.string() + "': " + ec.message());
  const auto locks = take_locks(a, out_dir, o);
  // A stop request: ^C, kill, a closed terminal or session (SIGHUP), a job
  // scheduler's warning signal (SIGUSR1, e.g. Slurm's --signal=USR1@120).
  for (const int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) std::signal(sig, on_stop_signal);
  return run_on_devices(a, batch, model_dir, o, vram_limit, estimator, estimates_path);
}

}  // namespace sdxl::cli
