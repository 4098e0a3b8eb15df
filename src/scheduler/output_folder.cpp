#include "scheduler/output_folder.h"

#include <signal.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <regex>
#include <system_error>

#include "batch/manifest.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/json_shape.h"

namespace sdxl {

namespace fs = std::filesystem;

fs::path checked_output_path(const fs::path& out_dir_canonical, const std::string& rel) {
  const fs::path p = out_dir_canonical / rel;
  std::error_code ec;
  const fs::path parent = fs::weakly_canonical(p.parent_path(), ec);
  const std::string base = out_dir_canonical.string();
  const std::string got = parent.string();
  if (ec || got.compare(0, base.size(), base) != 0 || (got.size() > base.size() && got[base.size()] != '/'))
    throw UsageError("output file '" + rel + "' would leave the output folder '" + base + "' (through a link?)");
  fs::create_directories(p.parent_path(), ec);
  if (ec) throw IoError("cannot create folder '" + p.parent_path().string() + "': " + ec.message());
  return p;
}

bool temp_file_owner_is_gone(const TempFileOwner& owner, const TempFileOwner& me) {
  if (owner.host != me.host || owner.pid <= 0) return false;  // another host's pid says nothing here
  if (owner.pid == me.pid) return true;                        // this process's own: nothing is in flight yet
  return ::kill(static_cast<pid_t>(owner.pid), 0) != 0 && errno == ESRCH;
}

int remove_stale_temp_files(const fs::path& dir) {
  const TempFileOwner me = this_temp_file_owner();
  int removed = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::optional<TempFileOwner> owner = parse_temp_file_name(it->path().filename().string());
    if (!owner || !temp_file_owner_is_gone(*owner, me)) continue;
    std::error_code rm_ec;
    if (fs::remove(it->path(), rm_ec)) ++removed;
  }
  return removed;
}

void check_own_files(const std::filesystem::path& out_dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(out_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!is_manifest_file_name(name) && !is_seeds_file_name(name)) continue;
    const auto st = std::filesystem::symlink_status(e.path(), ec);
    if (st.type() == std::filesystem::file_type::symlink)
      throw UsageError("'" + e.path().string() + "' is a symbolic link; sdxl-batch reads and appends to its own " +
                       "files and does not follow links in the output folder (remove the link)");
    if (st.type() != std::filesystem::file_type::regular)
      throw UsageError("'" + e.path().string() + "' is not a regular file (remove it)");
  }
}

void check_plain_run_batch(const fs::path& out_dir, const std::string& batch_path) {
  static const std::regex shard_report(R"(report-shard-[0-9]+-of-[0-9]+\.json)");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!std::regex_match(name, shard_report)) continue;
    InputFile in(e.path(), 256ull << 20);
    const std::string text = in.ok() ? in.read_all() : std::string();
    if (!in.ok() || check_json_shape(text).too_deep) continue;
    const nlohmann::json r = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!r.is_object() || !r.contains("batch") || !r["batch"].is_string()) continue;
    const std::string other = r["batch"].get<std::string>();
    if (other.empty() || other == batch_path || fs::equivalent(other, batch_path, ec)) continue;
    throw UsageError(out_dir.string() + " holds shard runs of batch file '" + other + "' (" + name +
                     "); this run is of '" + batch_path +
                     "': give each batch file its own --out folder (--force runs it there anyway)");
  }
}

}  // namespace sdxl
