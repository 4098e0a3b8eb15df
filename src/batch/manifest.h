// manifest.jsonl: one JSON line per finished image (task id, index, seed, file,
// sha256, seconds, every parameter), appended and fsynced after the image's
// file was renamed into place. It is what a rerun resumes from. A torn last
// line (a crash mid-append) is ignored on reading. append() is safe from
// several processes sharing the folder (O_APPEND, one write per line) and is
// serialised within one process. torch-free.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "batch/generation_params.h"

namespace sdxl {

struct ManifestEntry {
  std::string task;
  int index = 0;
  std::int64_t seed = 0;
  std::string file;  // relative to the output folder
  std::string sha256;
  double seconds = 0;
  GenerationParams params;
  std::string model;
  std::string finished;  // UTC ISO-8601
  // Where the prompt came from (story batch files): the task's prompt as
  // written, its characters and style, and what each wildcard picked. Written
  // only when set; not read back (an image is matched by its final prompt).
  std::string source_prompt;
  std::vector<std::string> characters;
  std::string style;
  std::vector<std::string> wildcards;
};

class Manifest {
 public:
  // Reads PATH if it exists (the file is created on the first append).
  explicit Manifest(std::filesystem::path path);

  // The newest entry for (task, index), if any.
  std::optional<ManifestEntry> find(const std::string& task, int index) const;
  // The base seed of a task drawn with seed -1: the newest one recorded in
  // seeds.jsonl (beside the manifest) before its images were made, else one
  // from any finished image of it (seed - its index), if there is one.
  std::optional<std::int64_t> task_base_seed(const std::string& task) const;
  // Records a task's freshly drawn base seed in seeds.jsonl, durably, before
  // any of its images is made: a kill at any later moment cannot make a rerun
  // draw another seed (and so another image) for it.
  void record_base_seed(const std::string& task, std::int64_t base);
  size_t size() const;
  int torn_lines() const { return torn_lines_; }

  // Appends one line and fsyncs (append_line_durable: no links, torn lines
  // repaired). Throws IoError naming the file.
  void append(const ManifestEntry& e);

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  mutable std::mutex mu_;
  std::filesystem::path seeds_path_;
  std::map<std::pair<std::string, int>, ManifestEntry> latest_;
  std::map<std::string, std::int64_t> base_seeds_;
  int torn_lines_ = 0;
};

std::string utc_now_iso8601();

}  // namespace sdxl
