// Batch files: a JSON list of scenes (tasks) with defaults, read and validated
// before any model is loaded. Every problem is reported with the JSON pointer of
// the value and a hint; parse_batch_file() throws UsageError listing them all.
// This is the walking-skeleton subset; issue 7 extends the schema. torch-free.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "sdxl/generation_params.h"

namespace sdxl {

struct BatchTask {
  std::string id;
  GenerationParams params;  // seed is the first image's seed
  bool seed_random = false; // seed was -1: drawn at run time
  int count = 1;            // images; image i uses seed + i
};

struct BatchFile {
  std::filesystem::path path;
  int version = 1;
  std::string model;       // optional model dir, relative to the batch file
  std::string output_dir;  // optional, relative to the batch file
  std::vector<BatchTask> tasks;
};

struct BatchProblem {
  std::string pointer;  // JSON pointer, e.g. /tasks/2/steps
  std::string message;
};

// Parses and validates; `fallback` supplies defaults not set in the file
// (the model's defaults). Throws UsageError with every problem listed.
BatchFile parse_batch_file(const std::filesystem::path& path, const GenerationParams& fallback);
BatchFile parse_batch_text(const std::string& text, const std::filesystem::path& origin,
                           const GenerationParams& fallback, std::vector<BatchProblem>* problems);

// Output file name of image `index` of a task: "<id>-<index>-<seed>.png" with
// characters outside [A-Za-z0-9._-] in the id replaced by '_'.
std::string output_file_name(const BatchTask& task, int index, std::int64_t seed);

}  // namespace sdxl
