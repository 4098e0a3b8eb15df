#include "scheduler/output_folder.h"

#include <signal.h>

#include <cerrno>
#include <system_error>

#include "batch/manifest.h"
#include "core/error.h"

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

int remove_stale_temp_files(const fs::path& dir) {
  int removed = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() < 6 || name[0] != '.' || name.compare(name.size() - 4, 4, ".tmp") != 0) continue;
    const size_t dot_n = name.rfind('.', name.size() - 5);
    const size_t dot_pid = dot_n == std::string::npos || dot_n == 0 ? std::string::npos : name.rfind('.', dot_n - 1);
    if (dot_pid == std::string::npos) continue;
    const std::string pid_text = name.substr(dot_pid + 1, dot_n - dot_pid - 1);
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
    const long pid = std::stol(pid_text);
    if (pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM)) continue;  // still running
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

}  // namespace sdxl
