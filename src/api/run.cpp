// Session::run: what was submitted, checked as `validate` checks it, into an
// output folder on one lane per device (scheduler/run_batch.h), with the run's
// events passed on to an EventSink.
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <sstream>

#include "api/boundary.h"
#include "api/options.h"
#include "check/model_files.h"
#include "api/session_impl.h"
#include "core/run_lock.h"
#include "scheduler/generator_lane.h"
#include "scheduler/night_report.h"
#include "scheduler/run_batch.h"

namespace sdxl::api {

namespace {

namespace fs = std::filesystem;

// RunOptions::devices: "all" (every CUDA device) or indices "0,1" -> "cuda:0",
// "cuda:1"; "": the model's one device. Throws UsageError.
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
    if (std::stoi(item) >= count)
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

// The scheduler's options from the public run options (resume, shard, queue, retries).
RunOptions scheduler_options(const sdxl_batch::RunOptions& a) {
  if (a.shard_count < 1 || a.shard_index < 0 || a.shard_index >= a.shard_count)
    throw UsageError("shard " + std::to_string(a.shard_index) + "/" + std::to_string(a.shard_count) +
                     ": expected K/N with 0 <= K < N");
  if (a.max_batch < 1) throw UsageError("max_batch " + std::to_string(a.max_batch) + ": at least 1");
  RunOptions o;
  o.force = a.force;
  o.max_runtime_s = a.max_runtime_s;
  o.shard_index = a.shard_index;
  o.shard_count = a.shard_count;
  o.stop = a.stop;
  o.queue.max_batch = a.max_batch;
  o.queue.aging_s = a.aging_s;
  o.queue.file_order = a.file_order;
  o.safety = a.safety;
  o.retries = a.retries;
  o.retry_backoff_s = a.retry_backoff_s;
  o.timeout_s = a.timeout_s;
  o.release_every = a.release_every;
  o.writer_threads = a.writer_threads;
  o.overlap = a.overlap;
  return o;
}

// The locks of a run (core/run_lock.h): the folder's lock, exclusive for a plain
// run and shared by shard runs; each shard's own lock; and the lock file. Shards
// of one folder must agree on N, or their tasks would overlap.
std::vector<std::unique_ptr<RunLock>> take_locks(const std::string& lock_file, const fs::path& out_dir,
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
                                         std::to_string(o.shard_index) + "/" + std::to_string(o.shard_count) +
                                         " splits the tasks differently (use the same N)");
  std::vector<std::unique_ptr<RunLock>> locks;
  locks.push_back(
      std::make_unique<RunLock>(out_dir / ".sdxl-batch.lock", sharded ? LockMode::kShared : LockMode::kExclusive));
  if (sharded) locks.push_back(std::make_unique<RunLock>(out_dir / shard_lock_name(o.shard_index, o.shard_count)));
  if (!lock_file.empty()) locks.push_back(std::make_unique<RunLock>(lock_file));
  return locks;
}

// What was submitted, checked against the model as `validate` checks it (or
// its valid tasks, with skip_invalid); a problem refuses the run (InvalidInputError).
BatchFile load_submitted(const sdxl_batch::Session::Impl& s, const sdxl_batch::RunOptions& a,
                         std::vector<std::pair<std::string, std::string>>& invalid) {
  const BatchCheckInputs in =
      check_inputs(&s.config, a.wildcard_dirs, s.options.embedding_dirs, a.clip_skip, s.options.vae_dir,
                   s.options.lora_dirs);
  const bool from_file = !s.batch_file.empty();
  if (!from_file && s.tasks.empty()) throw UsageError("nothing to run: submit a batch file or tasks first");
  CheckedBatch checked = from_file ? check_batch_file(s.batch_file, &s.config, in)
                                   : check_batch_text(tasks_document(s.tasks), kTasksOrigin, &s.config, in);
  for (const std::string& note : checked.notes) spdlog::warn("{}: {}", checked.file.path.string(), note);
  if (a.skip_invalid) return keep_valid_tasks(std::move(checked), invalid);
  if (!checked.problems.empty()) throw_invalid(checked.file.path, checked.problems);
  return std::move(checked.file);
}

// The LoRA cache's hit rate over the lanes, for progress ("" before any LoRA).
std::string lora_hit_rate(const std::vector<std::unique_ptr<GeneratorLane>>& lanes) {
  std::uint64_t hits = 0, misses = 0;
  for (const auto& lane : lanes) {
    const LoraStats ls = lane->lora_stats();
    hits += ls.hits;
    misses += ls.misses;
  }
  if (hits + misses == 0) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, "LoRA hits %.0f%%",
                100.0 * static_cast<double>(hits) / static_cast<double>(hits + misses));
  return buf;
}

// f(sink) with a handler's exception logged and dropped (EventSink's contract).
template <class F>
void deliver(sdxl_batch::EventSink* sink, const char* what, F&& f) {
  if (!sink) return;
  try {
    f(*sink);
  } catch (const std::exception& e) {
    spdlog::warn("EventSink::{} threw: {}", what, e.what());
  } catch (...) {
    spdlog::warn("EventSink::{} threw", what);
  }
}

// The scheduler's event hooks, passed on to `sink`.
void connect_sink(RunOptions& o, sdxl_batch::EventSink* sink) {
  o.on_progress = [sink](const ProgressInfo& p) {
    deliver(sink, "on_progress", [&](sdxl_batch::EventSink& s) {
      s.on_progress({p.total, p.done, p.skipped, p.failed, p.elapsed_s, p.images_per_minute, p.eta_s, p.memory_bytes,
                     p.last_file, p.extra});
    });
  };
  o.on_image = [sink](const ImageEvent& e) {
    deliver(sink, "on_image", [&](sdxl_batch::EventSink& s) {
      s.on_image({e.task, e.index, e.seed, e.path.string(), e.file});
    });
  };
  o.on_failure = [sink](const FailureEvent& e) {
    deliver(sink, "on_task_failed", [&](sdxl_batch::EventSink& s) {
      s.on_task_failed({e.task, e.index, e.seed, e.error});
    });
  };
}

void save_estimates(const WorkEstimator& e, const fs::path& path) {
  if (e.empty()) return;
  try {
    e.save(path);
  } catch (const std::exception& ex) {
    spdlog::warn("could not save the measured estimates: {}", ex.what());
  }
}

sdxl_batch::RunResult public_result(const RunResult& r, const fs::path& out_dir) {
  sdxl_batch::RunResult p;
  p.total = r.total;
  p.done = r.done;
  p.skipped = r.skipped;
  p.failed = r.failed;
  p.not_started = r.not_started;
  p.batches = r.batches;
  p.oom_recoveries = r.oom_recoveries;
  p.retries = r.retries;
  p.deadlines_missed = r.deadlines_missed;
  p.devices_failed = r.devices_failed;
  p.stop_reason = r.stop_reason;
  p.out_dir = out_dir.string();
  p.report_path = r.report_path.string();
  return p;
}

// RunOptions::out_dir, else the batch file's output.dir (relative to the file), else ./out.
fs::path output_folder(const sdxl_batch::RunOptions& a, const BatchFile& batch) {
  if (!a.out_dir.empty()) return a.out_dir;
  if (batch.output_dir.empty()) return "out";
  const fs::path d(batch.output_dir);
  return d.is_absolute() ? d : batch.path.parent_path() / d;
}

// The lanes (one model copy per device, loaded on the lane's thread when there
// is an image to make), run_batch, and the measured estimates saved whatever happens.
RunResult run_on_lanes(const sdxl_batch::Session::Impl& s, const sdxl_batch::RunOptions& a, const BatchFile& batch,
                       RunOptions& o, WorkEstimator& estimator, const std::vector<fs::path>& estimates_paths) {
  const RuntimeOptions runtime = runtime_options(s.options, batch.embedding_dirs);
  const std::uint64_t vram_limit = a.vram_limit_bytes;
  std::vector<std::unique_ptr<GeneratorLane>> lanes;
  std::vector<DeviceLane*> lane_ptrs;
  for (const std::string& dev : resolve_devices(a.devices, runtime.device)) {
    RuntimeOptions ro = runtime;
    ro.device = dev;
    lanes.push_back(std::make_unique<GeneratorLane>(s.options.model_dir, ro, batch.lora_registry, vram_limit));
    lane_ptrs.push_back(lanes.back().get());
  }
  if (lanes.size() > 1) spdlog::info("{} devices: {}", lanes.size(), a.devices);
  o.allocator = [] { return cuda_allocator_settings(); };  // set by the first CUDA generator
  o.status_extra = [&] { return lora_hit_rate(lanes); };
  spdlog::info("batch {}: {} task(s) -> {}", batch.path.string(), batch.tasks.size(), o.out_dir.string());
  try {
    const RunResult r = run_batch(batch, o, lane_ptrs);
    for (const fs::path& path : estimates_paths) save_estimates(estimator, path);
    return r;
  } catch (...) {
    for (const fs::path& path : estimates_paths) save_estimates(estimator, path);
    throw;
  }
}

// A run's inputs checked and resolved, what run() and plan() share. Held by
// pointer: `o.estimator` points at `estimator`.
struct PreparedRun {
  BatchFile batch;
  RunOptions o;
  fs::path out_dir, estimates_path;
  WorkEstimator estimator;
  std::string why_no_estimates;  // when the estimator is empty
  fs::path shared_estimates;     // run --estimates FILE, when the run writes its figures back there
};

// run --estimates FILE: figures measured into other output folders fill what this folder's
// estimates.json lacks. A file that holds no estimates stops the run (it is never overwritten);
// one of another device or model is left as it is, unused. Returns whether the run writes its
// figures back to FILE (absent, or of this device and model).
bool read_shared_estimates(const fs::path& file, const std::string& device_key, const std::string& model,
                           WorkEstimator& est) {
  const fs::path folder = file.has_parent_path() ? file.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(folder, ec))
    throw UsageError("--estimates '" + file.string() + "': folder '" + folder.string() + "' does not exist");
  if (fs::is_directory(file, ec)) throw UsageError("--estimates '" + file.string() + "' is a folder: name a file");
  WorkEstimator shared(device_key, model);
  std::string why;
  switch (WorkEstimator::read(file, device_key, model, shared, &why)) {
    case WorkEstimator::Saved::missing:
      return true;
    case WorkEstimator::Saved::invalid:
      throw UsageError("--estimates: " + why.substr(0, why.rfind("; starting afresh")) +
                       ": name a new file or one that sdxl-batch wrote");
    case WorkEstimator::Saved::other_device_or_model:
      spdlog::warn("--estimates: {}: not used, and left as it is", why);
      return false;
    case WorkEstimator::Saved::ok:
      break;
  }
  est.fill_from(shared);
  spdlog::info("--estimates: measured figures from {}", file.string());
  return true;
}

// What was submitted, checked; the scheduler's options; the estimates earlier
// runs measured in the output folder (and in --estimates FILE). Reads files only.
std::unique_ptr<PreparedRun> prepare_run(const sdxl_batch::Session::Impl& s, const sdxl_batch::RunOptions& a) {
  const ModelConfig& mc = s.config;
  auto p = std::make_unique<PreparedRun>();
  RunOptions& o = p->o;
  o = scheduler_options(a);
  if (a.clip_skip != 0) {
    try {
      check_clip_skip(mc, a.clip_skip);
    } catch (const UsageError& e) {
      throw UsageError(std::string("--clip-skip: ") + e.what());
    }
  }
  std::vector<std::pair<std::string, std::string>> invalid;
  p->batch = load_submitted(s, a, invalid);
  if (s.options.verify) {
    std::vector<const GenerationParams*> params;
    for (const BatchTask& task : p->batch.tasks) params.push_back(&task.params);
    verify_task_folders(params);
  }
  p->out_dir = output_folder(a, p->batch);
  o.out_dir = p->out_dir;
  o.model_name = mc.name;
  o.model_sources = model_sources(mc);
  o.invalid_tasks = invalid;
  if (o.queue.max_batch > mc.limits.batch_max) {
    spdlog::warn(
        "--max-batch {} is above the batch_max {} of model '{}' (model.json /limits/batch_max; "
        "export_sdxl.py --batch-max N makes a model for more): batches of at most {} images",
        o.queue.max_batch, mc.limits.batch_max, mc.name, mc.limits.batch_max);
    o.queue.max_batch = mc.limits.batch_max;
  }
  // Memory and time per size measured by earlier runs into this folder on this device.
  const std::string device_key = s.options.device + "/" + (s.options.dtype.empty() ? mc.dtype : s.options.dtype) +
                                 (mc.unet_precision.empty() ? "" : "/unet-" + mc.unet_precision);
  p->estimates_path = p->out_dir / "estimates.json";
  p->estimator = WorkEstimator::load(p->estimates_path, device_key, mc.name, &p->why_no_estimates);
  if (!a.estimates_file.empty() && read_shared_estimates(a.estimates_file, device_key, mc.name, p->estimator))
    p->shared_estimates = a.estimates_file;
  o.estimator = &p->estimator;
  return p;
}

sdxl_batch::RunResult run_session(const sdxl_batch::Session::Impl& s, const sdxl_batch::RunOptions& a,
                                  sdxl_batch::EventSink* sink) {
  const std::unique_ptr<PreparedRun> p = prepare_run(s, a);
  std::error_code ec;
  fs::create_directories(p->out_dir, ec);
  if (ec) throw IoError("cannot create output folder '" + p->out_dir.string() + "': " + ec.message());
  const auto locks = take_locks(a.lock_file, p->out_dir, p->o);
  connect_sink(p->o, sink);
  std::vector<fs::path> estimates_paths{p->estimates_path};
  if (!p->shared_estimates.empty()) estimates_paths.push_back(p->shared_estimates);
  const RunResult r = run_on_lanes(s, a, p->batch, p->o, p->estimator, estimates_paths);
  return public_result(r, fs::canonical(p->out_dir));
}

sdxl_batch::PlannedBatch public_batch(const PlannedBatch& b) {
  sdxl_batch::PlannedBatch out;
  out.priority = b.priority;
  out.width = b.width;
  out.height = b.height;
  out.steps = b.steps;
  out.images = b.images;
  out.est_peak_bytes = b.est_peak_bytes;
  out.est_seconds = b.est_seconds;
  out.time_measured = b.time_measured;
  out.regions = b.regions;
  return out;
}

// The queue's plan with the estimates measured by earlier runs into the same
// folder; reads model.json and the folder only.
sdxl_batch::Plan plan_session(const sdxl_batch::Session::Impl& s, const sdxl_batch::RunOptions& a) {
  const std::unique_ptr<PreparedRun> p = prepare_run(s, a);
  sdxl_batch::Plan plan;
  plan.model_name = s.config.name;
  plan.out_dir = p->out_dir.string();
  plan.weights_bytes = module_file_bytes(s.config);
  plan.vram_limit_bytes = a.vram_limit_bytes;
  plan.free_bytes =
      a.vram_limit_bytes > 0 ? a.vram_limit_bytes - std::min(a.vram_limit_bytes, plan.weights_bytes) : UINT64_MAX;
  plan.safety = p->o.safety;
  plan.max_batch = p->o.queue.max_batch;
  plan.estimates_device = p->estimator.device();
  plan.estimates_measured = !p->estimator.empty();
  plan.why_no_estimates = p->why_no_estimates;
  const BatchPlan bp = plan_batch(p->batch, p->o, plan.free_bytes);
  plan.total = bp.total;
  plan.to_make = bp.to_make;
  plan.skipped = bp.skipped;
  plan.est_seconds = bp.est_seconds;
  for (const PlannedBatch& b : bp.batches) plan.batches.push_back(public_batch(b));
  for (const PlannedDetailer& d : bp.detailers)
    plan.detailers.push_back({d.task, d.images, d.detectors, d.regions_per_image, d.est_regions, d.est_seconds});
  plan.detailer_unknown = bp.detailer_unknown;
  return plan;
}

}  // namespace

}  // namespace sdxl::api

namespace sdxl_batch {

RunResult Session::run(const RunOptions& options, EventSink* sink) {
  return sdxl::api::guarded([&] { return sdxl::api::run_session(*impl_, options, sink); });
}

Plan Session::plan(const RunOptions& options) const {
  return sdxl::api::guarded([&] { return sdxl::api::plan_session(*impl_, options); });
}

FolderReport write_folder_report(const std::string& out_dir) {
  return sdxl::api::guarded([&] {
    const nlohmann::json r = sdxl::merge_run_reports(out_dir);
    FolderReport f;
    f.path = sdxl::write_night_report(out_dir, r).string();
    // Sums over the runs' reports, each count below 2^31: their sum may not be.
    auto count = [&r](const char* key) {
      return static_cast<int>(std::clamp(r.value(key, 0.0), 0.0, static_cast<double>(INT_MAX)));
    };
    f.images_total = count("images_total");
    f.images_done = count("images_done");
    f.images_failed = count("images_failed");
    f.runs = static_cast<int>(r["runs"].size());
    f.hosts = static_cast<int>(r["hosts"].size());
    return f;
  });
}

}  // namespace sdxl_batch
