// What a run is asked to do (RunOptions: the output folder, resume and shards, the queue's policy,
// retries and timeouts, memory admission, the events it reports) and what it says it did
// (RunResult), with the events' records. Shared by run_batch (run_batch.h) and the state its parts
// share (run_state.h). torch-free.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "batch/generation_params.h"
#include "core/error.h"
#include "core/memory.h"
#include "lora/lora_stats.h"
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
  // Panels with regions (docs/story-tools.md#regions) that the UNet made, and the UNet batches they went in
  // (with panels without regions or not).
  int panels_with_regions = 0, region_batches = 0;
  std::string stop_reason;  // "" when every image was attempted
  std::filesystem::path report_path;
  ExitCode exit_code() const {
    return (failed > 0 || not_started > 0) ? ExitCode::kTasksFailed : ExitCode::kOk;
  }
};

}  // namespace sdxl
