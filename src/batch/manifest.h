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
  std::string unet_precision;  // "" = the model's dtype; "fp8" (--precision fp8): a resume compares it
  std::string finished;  // UTC ISO-8601
  // Where the prompt came from (story batch files): the task's prompt as
  // written, its characters and style, and what each wildcard picked. Written
  // only when set; not read back (an image is matched by its final prompt).
  std::string source_prompt;
  std::vector<std::string> characters;
  std::string style;
  std::vector<std::string> wildcards;
};

// The manifest a run appends to: "manifest.jsonl", or for a shard run
// "manifest-shard-K-of-N.jsonl" — appends from several hosts to one file are
// not atomic on every network file system, so each shard has its own file.
// Its seeds go to "seeds.jsonl" / "seeds-shard-K-of-N.jsonl" beside it.
std::string manifest_file_name(int shard_index, int shard_count);
// Whether `name` is a manifest or seeds file of a run (plain or shard).
bool is_manifest_file_name(const std::string& name);
bool is_seeds_file_name(const std::string& name);

class Manifest {
 public:
  // Appends go to PATH (created on the first append). Reads PATH and every
  // other manifest and seeds file in its folder (the shards' and the plain
  // run's), so each run sees every finished image; for an image or a task
  // found in several, the newest record wins.
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
  // The newest entry of every image, by (task, index).
  std::vector<ManifestEntry> entries() const;
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
  struct RecordedSeed {
    std::int64_t base = 0;
    std::int64_t at_ns = 0;  // when it was recorded (newest wins across files)
  };
  std::map<std::string, RecordedSeed> base_seeds_;
  void read_manifest_file(const std::filesystem::path& p);
  void read_seeds_file(const std::filesystem::path& p);
  int torn_lines_ = 0;
};

std::string utc_now_iso8601();

}  // namespace sdxl
