// Reading what a user points at (batch files, init images, LoRAs, wildcard
// files, model files): only a regular file is opened for reading — a FIFO, a
// device such as /dev/zero or a folder is refused before anything can block or
// run without bound — and at most a stated size is read. torch-free.
//
// Confinement rule (the variants with a `root`): a file named relative to a
// folder (a wildcard file in a wildcards folder, an embedding, a LoRA found in
// a --lora-dir, a file that a model folder's model.json names, an image a batch
// file names) is read only when the file actually opened lies inside that
// folder once every symbolic link is resolved. A link inside the folder to a
// file inside it is followed; a link, as the file or as a folder on the way,
// that leads out of the folder is refused with its target named. The folder
// itself may be a link: it is where the user pointed. The check is made on the
// opened descriptor, so a link swapped in after the check cannot redirect the
// read (a hard link cannot be told from the file; see docs/unattended-runs.md).
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
// The same, and "leads out of 'ROOT' through a symbolic link (to 'TARGET')..."
// when the file is not inside `root` (the confinement rule).
std::string input_file_problem(const std::filesystem::path& path, std::uint64_t max_bytes,
                               const std::filesystem::path& root);

// `path` made absolute (against the current folder) and lexically normal; never throws: a
// path the system cannot make absolute (the empty one) comes back only normalised.
std::filesystem::path absolute_normal(const std::filesystem::path& path);

// Why the file opened as `fd` is not inside `root` once links are resolved, or "".
std::string outside_folder_problem(int fd, const std::filesystem::path& root);
// The same for `path`; "" too when it cannot be opened (other checks say why).
std::string outside_folder_problem(const std::filesystem::path& path, const std::filesystem::path& root);

// A read-only descriptor of a regular file (closed by the destructor), opened
// so that a FIFO does not block the open; `error` is set instead when it
// cannot be used (see input_file_problem).
class InputFile {
 public:
  InputFile(const std::filesystem::path& path, std::uint64_t max_bytes);
  // Confined to `root` (an empty root: not confined).
  InputFile(const std::filesystem::path& path, std::uint64_t max_bytes, const std::filesystem::path& root);
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
// Confined to `root` (the confinement rule).
std::string read_input_file(const std::filesystem::path& path, const std::string& what, std::uint64_t max_bytes,
                            const std::filesystem::path& root);

}  // namespace sdxl
