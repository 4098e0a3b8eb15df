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
#include "pipeline/generator.h"
#include "scheduler/device_lane.h"
#include "scheduler/run_options.h"

namespace sdxl {

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
  int regions = 0;  // the most regions of one of its images (each a prompt more per UNet row)
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

}  // namespace sdxl
