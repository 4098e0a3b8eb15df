// run_batch: every image of a (validated) batch, one after another, into an
// output folder that survives crashes and reruns:
//  - each PNG is written atomically, then its manifest line is appended+fsynced;
//  - a rerun skips images whose manifest line matches the task's settings and
//    whose file still has the recorded sha256 (random seeds are taken from the
//    manifest), unless `force`;
//  - `stop` (SIGINT/SIGTERM) and `max_runtime_s` stop taking new images; the
//    image in flight is finished and the report is written;
//  - a failing image (TaskError/UsageError) is recorded and the batch goes on;
//    an IoError (disk full, permissions) stops the run after writing the report.
// Writes report.json (report-shard-K-of-N.json with shards). torch-free: the
// caller passes the generator as a function. Not thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "sdxl/batch_file.h"
#include "sdxl/error.h"
#include "sdxl/generator.h"

namespace sdxl {

struct RunOptions {
  std::filesystem::path out_dir;
  bool force = false;
  double max_runtime_s = 0;  // 0: no limit
  int shard_index = 0, shard_count = 1;
  const std::atomic<bool>* stop = nullptr;
  std::string model_name;
  std::function<std::string()> device_name;            // called after the first image
  std::function<double()> load_seconds;                 // idem
  std::function<std::uint64_t()> memory_bytes;          // in use now, for the report (optional)
  std::function<std::uint64_t()> peak_memory_bytes;     // optional
  std::function<LoraStats()> lora_stats;                // optional: LoRA cache counters for the report
  // Tasks left out by --skip-invalid: reported as failed with these errors.
  std::vector<std::pair<std::string, std::string>> invalid_tasks;  // task id (or pointer), error
};

struct RunResult {
  int total = 0, done = 0, skipped = 0, failed = 0, not_started = 0;
  std::string stop_reason;  // "" when every image was attempted
  std::filesystem::path report_path;
  ExitCode exit_code() const {
    return (failed > 0 || not_started > 0) ? ExitCode::kTasksFailed : ExitCode::kOk;
  }
};

using GenerateFn = std::function<GeneratedImage(const GenerationParams&)>;

RunResult run_batch(const BatchFile& batch, const RunOptions& opts, const GenerateFn& generate);

// "report.json", or "report-shard-K-of-N.json" when sharded.
std::string report_file_name(int shard_index, int shard_count);

}  // namespace sdxl
