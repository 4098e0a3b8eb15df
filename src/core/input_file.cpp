#include "core/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace sdxl {
namespace {

std::string type_problem(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "is a folder, not a file";
  if (S_ISFIFO(mode)) return "is a FIFO (named pipe), not a regular file";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "is a device, not a regular file";
  if (S_ISSOCK(mode)) return "is a socket, not a regular file";
  return "is not a regular file";
}

std::string size_text(std::uint64_t bytes) {
  if (bytes % (1ull << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}

}  // namespace

std::string input_file_problem(const std::filesystem::path& path, std::uint64_t max_bytes) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return errno == ENOENT ? "does not exist" : std::strerror(errno);
  if (std::string why = type_problem(st.st_mode); !why.empty()) return why;
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) return "is larger than " + size_text(max_bytes);
  return "";
}

InputFile::InputFile(const std::filesystem::path& path, std::uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    error_ = errno == ENOENT ? "does not exist" : std::strerror(errno);
    return;
  }
  struct stat st{};
  if (::fstat(fd, &st) != 0) error_ = std::strerror(errno);
  else if (std::string why = type_problem(st.st_mode); !why.empty()) error_ = why;
  else if (static_cast<std::uint64_t>(st.st_size) > max_bytes) error_ = "is larger than " + size_text(max_bytes);
  if (!error_.empty()) {
    ::close(fd);
    return;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  fd_ = fd;
  size_ = static_cast<std::uint64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::string InputFile::read_all() {
  std::string out(size_, '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::pread(fd_, out.data() + got, out.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      error_ = std::string("cannot be read: ") + std::strerror(errno);
      return {};
    }
    if (n == 0) break;  // the file shrank while being read
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

std::string read_input_file(const std::filesystem::path& path, const std::string& what, std::uint64_t max_bytes) {
  InputFile f(path, max_bytes);
  std::string text = f.ok() ? f.read_all() : std::string();
  if (!f.error().empty()) throw UsageError(what + " '" + path.string() + "' " + f.error());
  return text;
}

}  // namespace sdxl
