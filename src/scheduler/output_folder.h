// The output folder's rules: every image path stays inside it (also through
// links), and temporary files left by a killed run are cleared. torch-free.
#pragma once

#include <filesystem>
#include <string>

#include "core/atomic_file.h"

namespace sdxl {

// out_dir_canonical / rel, after checking that its folder resolves inside the
// output folder (links included) and creating that folder. The check comes
// before any folder is created, so nothing is made outside. Throws UsageError
// for a path that leaves the folder, IoError when the folder cannot be made.
std::filesystem::path checked_output_path(const std::filesystem::path& out_dir_canonical, const std::string& rel);

// Refuses (UsageError) an output folder where a manifest or seeds file
// (manifest*.jsonl, seeds*.jsonl: the plain run's and the shards') is a
// symbolic link or not a regular file: the run reads and appends to them and
// never follows a link planted in a shared folder.
void check_own_files(const std::filesystem::path& out_dir);

// A plain run (no --shard) of `batch_path` into a folder holding a job array's shard reports
// (report-shard-K-of-N.json) of another batch file: UsageError naming both files and the report
// (its tasks would be mixed into that array's folder and merged report). A report that cannot be
// read as JSON is left to the report's reader.
void check_plain_run_batch(const std::filesystem::path& out_dir, const std::string& batch_path);

// Whether a temporary file of `owner` is provably dead to `me` (this
// process): the same host (and PID namespace) and either `me`'s own pid or a
// pid that no longer runs there. Another host's file is never dead to `me`:
// its pid means nothing here.
bool temp_file_owner_is_gone(const TempFileOwner& owner, const TempFileOwner& me);

// Run at start-up, before this process writes into `dir`: removes the
// temporary files of write_file_atomic (core/atomic_file.h) under `dir` whose
// owner temp_file_owner_is_gone; keeps every other one (another host's or
// shard's file in flight, a name without a host). Returns how many were removed.
int remove_stale_temp_files(const std::filesystem::path& dir);

}  // namespace sdxl
