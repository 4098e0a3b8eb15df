// Reading what a user points at (batch files, init images, LoRAs, wildcard
// files, model files): only a regular file is opened for reading — a FIFO, a
// device such as /dev/zero or a folder is refused before anything can block or
// run without bound — and at most a stated size is read. torch-free.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace sdxl {

// Why `path` cannot be read as an input file of at most `max_bytes` bytes
// ("does not exist", "is a folder", "is a FIFO, not a regular file", "is
// larger than 64 MiB", ...), or "" when it can. Links are followed: they are
// where the user pointed.
std::string input_file_problem(const std::filesystem::path& path, std::uint64_t max_bytes);

// A read-only descriptor of a regular file (closed by the destructor), opened
// so that a FIFO does not block the open; `error` is set instead when it
// cannot be used (see input_file_problem).
class InputFile {
 public:
  InputFile(const std::filesystem::path& path, std::uint64_t max_bytes);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  bool ok() const { return fd_ >= 0; }
  const std::string& error() const { return error_; }
  int fd() const { return fd_; }
  std::uint64_t size() const { return size_; }
  // The whole file; sets error() on a read error.
  std::string read_all();

 private:
  int fd_ = -1;
  std::uint64_t size_ = 0;
  std::string error_;
};

// Reads the whole input file; throws UsageError "WHAT 'PATH' WHY".
std::string read_input_file(const std::filesystem::path& path, const std::string& what, std::uint64_t max_bytes);

}  // namespace sdxl
