// `sdxl-batch run`: every image of a batch file into an output folder, resumable.
// A client of the public API (include/sdxl_batch/sdxl_batch.h): the flags become
// ModelOptions and RunOptions, the batch file a Session's submission, and the
// run's events the progress line. The batch is checked (schema and the model's
// limits) before any module is loaded; the model loads only when there is an
// image left to make.
#include <sdxl_batch/sdxl_batch.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>
#include <cstdio>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "cli/progress.h"

namespace sdxl::cli {

struct RunArgs {
  ModelFlags model;
  std::string batch_file, out_dir, lock_file, estimates_file, max_runtime, shard, vram_limit, timeout, aging = "15m", order = "queue";
  std::string devices;
  std::vector<std::string> wildcard_dirs;
  bool force = false, skip_invalid = false, dry_run = false, no_progress = false, no_overlap = false;
  int max_batch = sdxl_batch::RunOptions{}.max_batch;  // the library's default
  int retries = 1, release_every = 0, writer_threads = 2;
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
  cmd->add_option("--shard", args->shard, "Take share K of N of the tasks: K/N (0 <= K < N), or auto / auto/N from a Slurm job array or a Kubernetes Indexed Job");
  cmd->add_option("--lock", args->lock_file,
                  "Also hold this lock file (e.g. one per machine for cron); the output folder's own lock is always held");
  cmd->add_option("--estimates", args->estimates_file,
                  "Measured memory and time per size shared between output folders (one device and model per "
                  "file): read where the output folder has none, updated after the run, so a fresh folder "
                  "batches at once instead of measuring each new size alone first");
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

// A duration flag's seconds (0: no limit); UsageError naming the flag for
// anything else than a finite duration of 0 or more.
double duration_flag(const std::string& flag, const std::string& text) {
  try {
    return sdxl_batch::parse_duration_seconds(text);
  } catch (const sdxl_batch::UsageError& e) {
    throw sdxl_batch::UsageError(flag + ": " + e.what());
  }
}

// The run's options from the flags (resume, shard, queue, retries, devices).
sdxl_batch::RunOptions run_options(const RunArgs& a) {
  sdxl_batch::RunOptions o;
  o.out_dir = a.out_dir;
  o.force = a.force;
  o.skip_invalid = a.skip_invalid;
  o.max_runtime_s = a.max_runtime.empty() ? 0.0 : duration_flag("--max-runtime", a.max_runtime);
  if (!a.shard.empty()) std::tie(o.shard_index, o.shard_count) = sdxl_batch::parse_shard(a.shard);
  o.lock_file = a.lock_file;
  o.estimates_file = a.estimates_file;
  o.wildcard_dirs = a.wildcard_dirs;
  o.clip_skip = a.clip_skip;
  o.vram_limit_bytes = a.vram_limit.empty() ? 0 : sdxl_batch::parse_size_bytes(a.vram_limit);
  o.max_batch = a.max_batch;
  o.safety = a.safety;
  o.retries = a.retries;
  o.retry_backoff_s = a.retry_backoff;
  o.timeout_s = a.timeout.empty() ? 0.0 : duration_flag("--timeout", a.timeout);
  o.aging_s = duration_flag("--aging", a.aging);
  o.release_every = a.release_every;
  o.writer_threads = a.writer_threads;
  o.file_order = a.order == "file";
  o.devices = a.devices;
  o.overlap = !a.no_overlap;
  return o;
}

// The images of a planned batch: the first four names, then "+N".
std::string batch_images(const std::vector<std::string>& images) {
  std::string names;
  for (size_t i = 0; i < images.size(); ++i) {
    if (i == 4) return names + ", +" + std::to_string(images.size() - 4);
    names += (i ? ", " : "") + images[i];
  }
  return names;
}

// --dry-run: the queue's plan with the estimates measured by earlier runs into
// the same folder; reads model.json only (no weights are loaded).
// The tasks with a detailer: each unit's detector and the region passes expected (from the regions per
// image earlier runs into the folder found), or "unknown until detection".
void print_plan_detailers(const sdxl_batch::Plan& plan) {
  if (plan.detailers.empty()) return;
  std::printf("  detailer: %zu task(s) redraw regions after their decode (one pass per region, through the queue)\n",
              plan.detailers.size());
  for (const sdxl_batch::PlannedDetailer& d : plan.detailers) {
    std::string units;
    for (size_t k = 0; k < d.detectors.size(); ++k) {
      const double r = k < d.regions_per_image.size() ? d.regions_per_image[k] : -1;
      char per[64];
      std::snprintf(per, sizeof per, "%.2f region(s)/image measured", r);
      units += (units.empty() ? "" : ", ") + std::filesystem::path(d.detectors[k]).filename().string() + " (" +
               (r >= 0 ? std::string(per) : std::string("unknown until detection")) + ")";
    }
    std::string passes = "region passes unknown until detection";
    if (d.est_regions >= 0) {
      char n[64];
      std::snprintf(n, sizeof n, "%.1f region pass(es)", d.est_regions);
      passes = std::string(n) + ", est. time " + (d.est_seconds >= 0 ? format_eta(d.est_seconds) : "?");
    }
    std::printf("    %s (%d image(s)): %s; %s\n", d.task_id.c_str(), d.images, units.c_str(), passes.c_str());
  }
}

int print_plan(const std::string& batch_path, const sdxl_batch::Plan& plan) {
  std::printf("plan for %s (model %s, output %s)\n", batch_path.c_str(), plan.model_name.c_str(), plan.out_dir.c_str());
  std::printf("  %d image(s): %d to make, %d already done\n", plan.total, plan.to_make, plan.skipped);
  if (!plan.estimates_measured)
    std::printf("  estimates: none measured yet (%s); each new size runs alone first and is measured\n",
                plan.why_no_estimates.c_str());
  else
    std::printf("  estimates: measured by earlier runs into this folder or the --estimates file (%s)\n",
                plan.estimates_device.c_str());
  if (plan.vram_limit_bytes == 0)
    std::printf("  memory budget: not given (--vram-limit); batches are capped by --max-batch %d only\n",
                plan.max_batch);
  else
    std::printf("  memory budget %s: weights %s, %s left for work (x%.2f safety)\n",
                format_bytes(plan.vram_limit_bytes).c_str(), format_bytes(plan.weights_bytes).c_str(),
                format_bytes(plan.free_bytes).c_str(), plan.safety);
  std::printf("  %-4s %-6s %-11s %5s %6s %12s %10s  %s\n", "#", "prio", "size", "steps", "images", "est. memory",
              "est. time", "images");
  int k = 0;
  for (const auto& b : plan.batches) {
    const std::string mem = b.est_peak_bytes >= 0 ? format_bytes(static_cast<std::uint64_t>(b.est_peak_bytes)) : "probe";
    const std::string time = b.est_seconds >= 0 ? format_eta(b.est_seconds) + (b.time_measured ? "" : "~") : "?";
    std::printf("  %-4d %-6s %5dx%-5d %5d %6zu %12s %10s  %s\n", ++k, b.priority.c_str(), b.width, b.height, b.steps,
                b.images.size(), mem.c_str(), time.c_str(),
                (batch_images(b.images) + (b.regions > 0 ? " (regions: up to " + std::to_string(b.regions) + " a panel)" : ""))
                    .c_str());
  }
  print_plan_detailers(plan);
  std::printf("  %zu batch(es); estimated time %s%s\n", plan.batches.size(),
              plan.est_seconds >= 0 ? format_eta(plan.est_seconds).c_str() : "unknown until each size is measured",
              plan.detailer_unknown ? " + the region passes unknown until detection" : "");
  return 0;
}

// The run's progress events on the status line (a bar on a terminal, else log lines).
class ProgressSink final : public sdxl_batch::EventSink {
 public:
  explicit ProgressSink(Progress& progress) : progress_(progress) {}
  void on_progress(const sdxl_batch::Progress& p) override { progress_.update(p); }

 private:
  Progress& progress_;
};

}  // namespace

int run_run(const RunArgs& a) {
  sdxl_batch::ModelOptions model = a.model.resolved();
  if (model.model_dir.empty()) model.model_dir = sdxl_batch::batch_file_model_dir(a.batch_file);
  if (model.model_dir.empty())
    throw sdxl_batch::UsageError("no model: pass --model DIR or set \"model\" in " + a.batch_file);
  sdxl_batch::RunOptions o = run_options(a);
  sdxl_batch::Session session(std::move(model));
  session.submit_batch_file(a.batch_file);
  if (a.dry_run) return print_plan(a.batch_file, session.plan(o));
  // A stop request: ^C, kill, a closed terminal or session (SIGHUP), a job
  // scheduler's warning signal (SIGUSR1, e.g. Slurm's --signal=USR1@120).
  for (const int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) std::signal(sig, on_stop_signal);
  o.stop = &g_stop;
  Progress progress(!a.no_progress && Progress::stderr_is_terminal(), a.progress_interval);
  ProgressSink sink(progress);
  const sdxl_batch::RunResult r = session.run(o, &sink);
  progress.finish();
  return static_cast<int>(r.exit_code());
}

}  // namespace sdxl::cli
