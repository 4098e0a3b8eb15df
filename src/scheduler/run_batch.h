// run_batch: every image of a (validated) batch into an output folder that
// survives crashes and reruns, in the order of a priority queue, with
// compatible images batched into one UNet call as far as the memory budget
// allows:
//  - each PNG is encoded and written atomically on writer threads (the GPU
//    goes on with the next batch meanwhile), then its manifest line is
//    appended+fsynced;
//  - a rerun skips images whose manifest line matches the task's settings and
//    whose file still has the recorded sha256 (random seeds are taken from the
//    manifest), unless `force`;
//  - `stop` (SIGINT/SIGTERM) and `max_runtime_s` stop taking new batches; the
//    batch in flight is finished, its files written and the report too;
//  - an out-of-memory frees cached blocks and retries the batch in halves
//    (down to one image, then the task's retries apply); a task past its
//    timeout is cancelled between steps; other task errors are retried
//    `retries` times with exponential backoff, then recorded, and the batch
//    goes on; an IoError (disk full, permissions) stops the run after writing
//    the report.
// Writes report.json (report-shard-K-of-N.json with shards) and report.html.
//
// The pipeline: each device (a lane) runs three threads, one per stage —
// text encode, sampling, VAE decode — handing batches on through queues of
// one, so the decode of a batch and the text encode of the next overlap the
// sampling of the one between. Memory stays bounded: a lane holds at most
// three batches, and takes a new one only while the budget covers its
// estimated peak plus that of the batch still in flight; a batch size never
// measured runs alone (and is measured). A LoRA switch waits for the earlier
// batches' sampling (the weights change), after loading the files ahead.
// After an out-of-memory the lane runs one batch at a time.
//
// Several devices (--devices): one lane per device, each with its own model
// replica, all taking whole batches from one queue (priorities hold across
// devices; a lane prefers the LoRA set it has applied; an idle lane takes the
// next batch, so the device with the shortest queue gets it). A device that
// fails — a lost device, or `lane_failures` failed batches in a row while
// another device still works — is given up: its batches go back to the queue
// and the others finish the run; the report says what happened.
//
// The parts: work_list (what is left, resume), dispatcher (admission, next
// batch), lane_loops (the three stage threads), failure_policy, writer_pool,
// run_report; run_state holds what they share. Devices are DeviceLanes
// (device_lane.h). torch-free. run_batch itself is called from one thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "batch/batch_file.h"
#include "core/error.h"
#include "core/memory.h"
#include "lora/lora_stats.h"
#include "pipeline/generator.h"
#include "scheduler/device_lane.h"
#include "scheduler/task_queue.h"
#include "scheduler/work_estimator.h"

namespace sdxl {

// Optional views of the device for the one-function run_batch, for admission
// and the report. A missing `memory` means no accounting (every batch is
// admitted at the queue's size).
struct DeviceHooks {
  std::function<MemorySnapshot()> memory;
  std::function<void()> reset_peak;
  std::function<void()> release_cached;
};

struct ProgressInfo {
  int total = 0, done = 0, skipped = 0, failed = 0;
  double elapsed_s = 0;
  double images_per_minute = 0;
  double eta_s = -1;               // < 0: unknown
  std::uint64_t memory_bytes = 0;  // in use now
  std::string last_file;
  std::string extra;               // e.g. the LoRA cache hit rate
};

// An image in place (its manifest line written): task id, index, seed, and
// its file, relative to the output folder and as a full path.
struct ImageEvent {
  std::string task;
  int index = 0;
  std::int64_t seed = 0;
  std::string file;
  std::filesystem::path path;
};
// An image that failed for good (after its retries), or a task left out by
// --skip-invalid (index 0, seed 0).
struct FailureEvent {
  std::string task;
  int index = 0;
  std::int64_t seed = 0;
  std::string error;
};

struct RunOptions {
  std::filesystem::path out_dir;
  bool force = false;
  double max_runtime_s = 0;  // 0: no limit
  int shard_index = 0, shard_count = 1;
  const std::atomic<bool>* stop = nullptr;
  std::string model_name;
  // What every PNG's parameters say of the model (its files' hashes, when
  // model.json records them: model_sources()); its model_name is model_name's.
  ImageSources model_sources;
  // The one-device overload of run_batch takes its device from these four.
  std::function<std::string()> device_name;            // called after the first image
  std::function<double()> load_seconds;                 // idem
  std::function<LoraStats()> lora_stats;                // optional: LoRA cache counters for the report
  std::function<std::string()> allocator;               // optional: the CUDA allocator settings, for the report
  // Tasks left out by --skip-invalid: reported as failed with these errors.
  std::vector<std::pair<std::string, std::string>> invalid_tasks;  // task id (or pointer), error

  QueuePolicy queue;             // priorities, aging, batch size cap
  double safety = 1.2;           // admission: estimated peak × safety must fit in what is free
  int retries = 0;               // extra attempts of a failed image (not for bad settings or timeouts)
  double retry_backoff_s = 2.0;  // first wait; doubles per attempt
  double timeout_s = 0;          // per image when the task sets none; 0: no timeout
  int release_every = 0;         // free cached device blocks every N images (0: only after an OOM)
  int writer_threads = 2;        // PNG encode + write
  DeviceHooks device;
  bool overlap = true;           // pipeline: stages of consecutive batches at once (false: one batch at a time)
  int lane_failures = 3;         // failed batches in a row after which a device is given up (if another works)
  WorkEstimator* estimator = nullptr;  // measured memory/time, refined during the run
  // Events, called one at a time (from the lane and writer threads, with the
  // run's mutex held): they must return quickly and not throw.
  std::function<void(const ProgressInfo&)> on_progress;  // after each image
  std::function<void(const ImageEvent&)> on_image;       // after an image's manifest line
  std::function<void(const FailureEvent&)> on_failure;   // an image failed for good, an invalid task
  std::function<std::string()> status_extra;             // appended to progress (LoRA hit rate)
};

struct RunResult {
  int total = 0, done = 0, skipped = 0, failed = 0, not_started = 0;
  int batches = 0, oom_recoveries = 0, retries = 0, deadlines_missed = 0;
  int devices_failed = 0;
  int detailer_regions = 0, detailer_batches = 0;  // region passes made, and the UNet batches they went in
  std::string stop_reason;  // "" when every image was attempted
  std::filesystem::path report_path;
  ExitCode exit_code() const {
    return (failed > 0 || not_started > 0) ? ExitCode::kTasksFailed : ExitCode::kOk;
  }
};

// Generates compatible images together; returns one image per params entry, in order.
using GenerateBatchFn = std::function<std::vector<GeneratedImage>(const std::vector<GenerationParams>&, const StepHook&)>;

// One device, the whole generation in one function (run as the sample stage).
RunResult run_batch(const BatchFile& batch, const RunOptions& opts, const GenerateBatchFn& generate);
// One lane per device (opts.device, device_name, load_seconds and lora_stats
// are not used: each lane brings its own). The lanes outlive the call.
RunResult run_batch(const BatchFile& batch, const RunOptions& opts, const std::vector<DeviceLane*>& lanes);

// --dry-run: the plan without a model: what is left to make (resume applied),
// in queue order, grouped into batches with the estimated memory and time.
struct PlannedBatch {
  std::string group;
  std::vector<std::string> images;  // "task#index"
  int width = 0, height = 0, steps = 0;
  std::string priority;
  std::int64_t est_peak_bytes = -1;  // -1: not measured yet (runs alone first)
  double est_seconds = -1;           // -1: unknown
  bool time_measured = false;
};
// A task's detailer in the plan: its units and the region passes its images will need, from the
// regions per image that earlier runs into the folder measured per detector folder (WorkEstimator).
struct PlannedDetailer {
  std::string task;
  int images = 0;                          // the task's images to make
  std::vector<std::string> detectors;      // its units' detector folders, in order
  std::vector<double> regions_per_image;   // per unit (at most its "max"); -1: unknown until detection
  double est_regions = -1;                 // passes of its images; -1: a unit is unknown
  double est_seconds = -1;                 // their time; -1: unknown
};
struct BatchPlan {
  int total = 0, skipped = 0, to_make = 0;
  std::vector<PlannedBatch> batches;
  std::vector<PlannedDetailer> detailers;  // tasks with a detailer, in the order of their first image
  bool detailer_unknown = false;           // some region passes are unknown until detection (not in est_seconds)
  double est_seconds = -1;  // -1: unknown for at least one batch; counts the known region passes
  std::uint64_t free_bytes = 0;
};
BatchPlan plan_batch(const BatchFile& batch, const RunOptions& opts, std::uint64_t free_bytes);

// "report.json", or "report-shard-K-of-N.json" when sharded.
std::string report_file_name(int shard_index, int shard_count);

}  // namespace sdxl
