// The work list: every image of a (validated) batch file that this run (or
// shard) still has to make, with its seed resolved, and the queue built from
// it. A rerun skips images whose manifest line matches the task's settings
// and whose file still has the recorded sha256 (unless `force`); random seeds
// come back from the manifest, so a rerun makes the same images. torch-free.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "batch/batch_file.h"
#include "batch/generation_params.h"
#include "batch/manifest.h"
#include "batch/priority.h"
#include "batch/task_keys.h"
#include "scheduler/task_queue.h"

namespace sdxl {

struct DetailerProgress;  // scheduler/detailer_flow.h

struct WorkItem {
  const BatchTask* task = nullptr;
  int index = 0;
  GenerationParams params;  // seed resolved
  std::string file;         // relative to the output folder
  Priority priority = Priority::kMid;
  double deadline_unix = -1;
  int attempts = 0;          // failed attempts so far (retries)
  double not_before_s = 0;   // run clock: retry backoff
  std::vector<std::string> wildcard_choices;  // what the prompt's wildcards picked for this image
  // A detailer region's pass (params: the region's inpainting): the image it details.
  std::shared_ptr<DetailerProgress> detailer;
};

struct WorkList {
  std::vector<WorkItem> work;
  nlohmann::json skipped = nlohmann::json::array();  // the report's "skipped" records
  int total = 0, skipped_count = 0;
  // Random-seed tasks whose base seed was drawn now (none recorded yet): the
  // run records them (Manifest::record_base_seed) before making any image.
  std::vector<std::pair<std::string, std::int64_t>> drawn_seeds;
};

struct WorkListOptions {
  bool force = false;
  int shard_index = 0, shard_count = 1;
  std::string unet_precision;  // the run's (ManifestEntry::unet_precision): images made in another are made again
};

// What is left to make in `out_dir` (read only: creates nothing).
WorkList build_work(const BatchFile& batch, const WorkListOptions& o, const Manifest& manifest,
                    const std::filesystem::path& out_dir, const std::string& date, double start_unix);

// The queue of `work`: handle = index into `work`, priority, deadline on the
// run clock, batch group and LoRA set.
TaskQueue make_queue(const std::vector<WorkItem>& work, const QueuePolicy& policy, double start_unix);


// "task#index", for logs and plans.
std::string image_label(const WorkItem& w);

// Today's local date as YYYY-MM-DD (output name templates), and the Unix time now.
std::string local_date();
double unix_now();

}  // namespace sdxl
