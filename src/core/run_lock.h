// RunLock: a non-blocking flock on a file, held for the whole run, so two runs
// (e.g. overlapping cron jobs) never write one output folder. The kernel drops
// the lock when the process dies, even after kill -9. Shard runs of one folder
// hold its lock shared (and their own shard's lock exclusively); a plain run
// holds it exclusively, so the two kinds exclude each other.
//
// The lock file is never followed through a symbolic link and never truncated
// unless it is a lock file: the pid of an exclusive holder is written only into
// a file the lock created, or one that holds nothing but an earlier pid (so
// `--lock FILE` naming a user's file only locks it). torch-free.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace sdxl {

enum class LockMode { kExclusive, kShared };

class RunLock {
 public:
  // Throws Error(kLocked) naming the file (and the holder's pid, when known)
  // when another process holds it, UsageError for a link or a non-file,
  // IoError when the file cannot be opened.
  explicit RunLock(const std::filesystem::path& path, LockMode mode = LockMode::kExclusive);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

// Whether some process holds a lock on `path` now (a probe; false when the
// file does not exist or is not a regular file).
bool lock_is_held(const std::filesystem::path& path);

// The shard locks (".sdxl-batch-shard-K-of-N.lock") in `dir` that a running
// shard holds now, as "K/N".
std::vector<std::string> held_shard_locks(const std::filesystem::path& dir);
std::string shard_lock_name(int index, int count);

}  // namespace sdxl
