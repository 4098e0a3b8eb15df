#include "core/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <regex>
#include <string>

#include "core/error.h"

namespace sdxl {
namespace {

// The file's content when it is nothing but a pid line (a lock file's), else "".
std::string pid_in(int fd) {
  char buf[32] = {0};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "";
  std::string s(buf, static_cast<size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return "";
  return s;
}

bool holds_only_a_pid(int fd) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) return false;
  return st.st_size == 0 || (st.st_size < 32 && !pid_in(fd).empty());
}

// Opens the lock file without following a link; `created` says whether this call made it.
int open_lock_file(const std::filesystem::path& path, bool& created) {
  created = true;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0 && errno == EEXIST) {
    created = false;
    fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  }
  if (fd < 0) {
    if (errno == ELOOP)
      throw UsageError("lock file '" + path.string() +
                       "' is a symbolic link; sdxl-batch does not follow it (remove the link, or name another --lock)");
    throw IoError("cannot open lock file '" + path.string() + "': " + std::strerror(errno));
  }
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UsageError("lock file '" + path.string() + "' is not a regular file");
  }
  return fd;
}

}  // namespace

RunLock::RunLock(const std::filesystem::path& path, LockMode mode) {
  bool created = false;
  fd_ = open_lock_file(path, created);
  const int op = mode == LockMode::kExclusive ? LOCK_EX : LOCK_SH;
  if (::flock(fd_, op | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = pid_in(fd_);
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      throw Error(ExitCode::kLocked, "another sdxl-batch run" + (holder.empty() ? "" : " (pid " + holder + ")") +
                                         " holds the lock '" + path.string() +
                                         "'; wait for it to finish or use another output folder");
    throw IoError("cannot lock '" + path.string() + "': " + std::strerror(err));
  }
  if (mode == LockMode::kExclusive && (created || holds_only_a_pid(fd_))) {
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd_, 0) == 0) {
      [[maybe_unused]] ssize_t w = ::pwrite(fd_, pid.data(), pid.size(), 0);
    }
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

bool lock_is_held(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st{};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  // A shared probe fails only against an exclusive holder, which every shard lock is.
  const bool held = regular && ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return held;
}

std::string shard_lock_name(int index, int count) {
  return ".sdxl-batch-shard-" + std::to_string(index) + "-of-" + std::to_string(count) + ".lock";
}

std::vector<std::string> held_shard_locks(const std::filesystem::path& dir) {
  static const std::regex name(R"(\.sdxl-batch-shard-([0-9]+)-of-([0-9]+)\.lock)");
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string file = e.path().filename().string();
    if (std::regex_match(file, m, name) && lock_is_held(e.path())) out.push_back(m[1].str() + "/" + m[2].str());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace sdxl
