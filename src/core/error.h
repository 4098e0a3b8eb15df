// Error hierarchy of sdxl-batch: exceptions inside, exit codes at the edge.
// Each error carries the exit code the CLI returns for it (docs/unattended-runs.md):
// 0 all done, 1 fatal (model or environment), 2 bad arguments or batch file,
// 3 finished with failed tasks, 4 another run holds the lock.
#pragma once

#include <stdexcept>
#include <string>

namespace sdxl {

enum class ExitCode : int { kOk = 0, kFatal = 1, kUsage = 2, kTasksFailed = 3, kLocked = 4 };

class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& what) : std::runtime_error(what), code_(code) {}
  ExitCode code() const noexcept { return code_; }

 private:
  ExitCode code_;
};

// A model directory or module that cannot be loaded or used (names the file).
class ModelError : public Error {
 public:
  explicit ModelError(const std::string& what) : Error(ExitCode::kFatal, what) {}
};

// Bad command-line value or batch file content (names the flag / JSON pointer).
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& what) : Error(ExitCode::kUsage, what) {}
};

// f(), with a ModelError turned into a UsageError: for the folders a task names
// (its VAE, ControlNets, IP-Adapter), whose failure to load fails that task,
// not the run.
template <class F>
auto task_folder_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const ModelError& e) {
    throw UsageError(e.what());
  }
}

// Something one task asked for that cannot be done; fails that task alone.
class TaskError : public Error {
 public:
  explicit TaskError(const std::string& what) : Error(ExitCode::kTasksFailed, what) {}
};

// The device ran out of memory during a task (recognised from the message a
// TorchScript module throws). The runner frees cached blocks and retries smaller.
class OutOfMemoryError : public TaskError {
 public:
  explicit OutOfMemoryError(const std::string& what) : TaskError(what) {}
};

// A task ran past its timeout (checked between sampling steps).
class TimeoutError : public TaskError {
 public:
  explicit TimeoutError(const std::string& what) : TaskError(what) {}
};

// Whether an error message is an out-of-memory of CUDA, cuBLAS/cuDNN or the
// CPU allocator (TorchScript turns them all into a generic error).
bool is_out_of_memory_message(const std::string& message);
// Whether an error message says the device itself is gone or unusable (a
// sticky CUDA error: illegal address, launch failure, ECC, device lost),
// after which nothing more can run on it in this process.
bool is_device_lost_message(const std::string& message);

// I/O failure writing outputs (disk full, permissions): fatal for the run.
class IoError : public Error {
 public:
  explicit IoError(const std::string& what) : Error(ExitCode::kFatal, what) {}
};

}  // namespace sdxl
