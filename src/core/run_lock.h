// RunLock: an exclusive, non-blocking flock on a file, held for the whole run,
// so two runs (e.g. overlapping cron jobs) never write one output folder. The
// kernel drops the lock when the process dies, even after kill -9. The lock
// file keeps the holder's pid for the message. torch-free.
#pragma once

#include <filesystem>

namespace sdxl {

class RunLock {
 public:
  // Throws Error(kLocked) naming the file (and the holder's pid) when another
  // process holds it, IoError when the file cannot be opened.
  explicit RunLock(const std::filesystem::path& path);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace sdxl
