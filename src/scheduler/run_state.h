// RunState: everything the parts of one run share — the work list and queue,
// each lane's pipeline bookkeeping, the counters and the report's records —
// behind one mutex. Fields marked "mu" are read and written with `mu` held;
// the lane threads, the writer threads and run_batch's thread all use it.
// `cv` wakes lanes that wait for work, for room or for a LoRA switch.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "batch/manifest.h"
#include "scheduler/bounded_queue.h"
#include "scheduler/device_lane.h"
#include "scheduler/run_options.h"
#include "scheduler/task_queue.h"
#include "scheduler/work_list.h"

namespace sdxl {

using RunClock = std::chrono::steady_clock;

// A batch on its way through a lane's pipeline. Times are on the run clock.
struct InFlightBatch {
  std::vector<QueuedImage> picked;
  std::vector<GenerationParams> params;
  int n = 0;
  int est_w = 0, est_h = 0;                // the size its memory and time are keyed by (hires: the output size)
  std::optional<std::uint64_t> est_peak;   // estimated work bytes (accounted lanes only)
  bool solo = false;                       // size never measured: runs with nothing else on its lane
  bool lora_switch = false;                // its LoRA set differs from the lane's previous batch
  bool sampled = false;                    // through the sample stage (or failed before it)
  bool alone = true;                       // no other batch of its lane was in sample/decode meanwhile
  double timeout = 0;                      // per image (s), 0: none
  double picked_s = 0;
  double text_s[2] = {0, 0}, sample_s[2] = {0, 0}, decode_s[2] = {0, 0};
  std::uint64_t base_allocated = 0;        // lane's allocation when it was taken in
  std::uint64_t sample_peak = 0, decode_peak = 0;  // work bytes above base (measured alone)
  std::uint64_t sample_frag = 0, decode_frag = 0;  // reserved - allocated after the stage
  StageHandle handle;
};
using BatchPtr = std::shared_ptr<InFlightBatch>;

// What a lane did, for the report (mu).
struct LaneFigures {
  int images = 0, batches = 0, failed_batches = 0, oom = 0;
  double text_total = 0, sample_total = 0, decode_total = 0;
  std::vector<std::pair<double, double>> intervals;  // every stage's [start, end]
  std::uint64_t weights_bytes = 0, peak_allocated = 0, peak_reserved = 0;
  std::uint64_t sample_peak = 0, decode_peak = 0, sample_frag = 0, decode_frag = 0;
};

// One device's pipeline bookkeeping.
struct LaneState {
  LaneState(DeviceLane& d, int i) : device(d), index(i) {}
  DeviceLane& device;
  int index;
  bool alive = true, overlap = true, started = false;  // mu (started: the text thread's own)
  std::string failure;                 // why it was given up (mu)
  std::string current_lora;            // the LoRA set of the last batch taken in (mu)
  std::string prefetched_lora;         // the last set loaded ahead (the text thread's own)
  std::vector<BatchPtr> in_flight;     // taken in, not finished (mu)
  std::vector<BatchPtr> active;        // in the sample or decode stage now (mu)
  int unsampled = 0;                   // in_flight not through the sample stage yet (mu)
  int failures_in_a_row = 0;           // (mu)
  std::uint64_t base_allocated = 0;    // allocated when the lane was last idle: weights, LoRA cache (mu)
  BoundedQueue<BatchPtr> to_sample{1}, to_decode{1};
  std::thread encode_thread, sample_thread, decode_thread;
  LaneFigures fig;                     // (mu)
};

// The report's per-image, per-batch and per-event records (mu).
struct RunRecords {
  nlohmann::json images = nlohmann::json::array(), failures = nlohmann::json::array(),
                 batches = nlohmann::json::array(), deadline_misses = nlohmann::json::array(),
                 device_events = nlohmann::json::array(), skipped = nlohmann::json::array();
};

struct RunState {
  // Reads the manifest in `out_dir` (canonical, existing) and builds the work list.
  RunState(const BatchFile& batch, const RunOptions& opts, std::filesystem::path out_dir,
           const std::vector<DeviceLane*>& lanes);

  const BatchFile& batch;
  const RunOptions& opts;
  const std::filesystem::path out_dir;
  Manifest manifest;
  const std::string date, started;  // local YYYY-MM-DD; UTC ISO-8601
  const double start_unix;
  const RunClock::time_point t_run;

  std::mutex mu;
  std::condition_variable cv;
  RunResult res;                       // mu
  RunRecords rec;                      // mu
  std::vector<WorkItem> work;          // mu (attempts, not_before_s)
  TaskQueue queue;                     // mu
  std::vector<QueuedImage> waiting;    // retries in backoff (mu)
  std::map<std::string, int> oom_cap;  // group -> batch size known to fit after an OOM (mu)
  std::vector<std::unique_ptr<LaneState>> lanes;
  std::string fatal;                   // an output error: the run stops (mu)
  std::exception_ptr model_error;      // a model that cannot load on the last device: rethrown (mu)
  int dropped = 0;                     // generated but not written after an output error (mu)
  int images_since_release = 0;        // (mu)
  int detailing = 0;                   // images between their batch and their detailer's next step (mu)

  // Seconds since the run started.
  double elapsed() const;
  // The following need mu held.
  int alive_lanes() const;
  bool anything_in_flight() const;
  // Why the run stops taking batches ("" = it goes on).
  std::string stop_reason_now() const;
  void record_failure(const WorkItem& w, const std::string& error);
  // Calls opts.on_progress after an image.
  void progress(const std::string& file, std::uint64_t memory_bytes);
};

}  // namespace sdxl
