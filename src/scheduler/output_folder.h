// The output folder's rules: every image path stays inside it (also through
// links), and temporary files left by a killed run are cleared. torch-free.
#pragma once

#include <filesystem>
#include <string>

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

// Removes the temporary files of write_file_atomic (".<name>.<pid>.<n>.tmp")
// left by a run that was killed; files of a live process (another shard) are
// kept. Returns how many were removed.
int remove_stale_temp_files(const std::filesystem::path& dir);

}  // namespace sdxl
