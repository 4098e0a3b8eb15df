#include "core/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cerrno>
#include <cstdlib>
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

InputFile::InputFile(const std::filesystem::path& path, std::uint64_t max_bytes)
    : InputFile(path, max_bytes, std::filesystem::path()) {}

InputFile::InputFile(const std::filesystem::path& path, std::uint64_t max_bytes, const std::filesystem::path& root) {
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
  else if (!root.empty()) error_ = outside_folder_problem(fd, root);
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

std::string input_file_problem(const std::filesystem::path& path, std::uint64_t max_bytes,
                               const std::filesystem::path& root) {
  return InputFile(path, max_bytes, root).error();
}

std::string outside_folder_problem(int fd, const std::filesystem::path& root) {
  char buf[PATH_MAX + 1];
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(proc.c_str(), buf, PATH_MAX);
  if (n <= 0)
    return "cannot be checked to lie inside '" + root.string() + "' (" + proc + ": " + std::strerror(errno) + ")";
  const std::string opened(buf, static_cast<size_t>(n));
  char* real_root = ::realpath(root.c_str(), nullptr);
  if (real_root == nullptr)
    return "is in a folder '" + root.string() + "' that cannot be resolved: " + std::strerror(errno);
  std::string base(real_root);
  std::free(real_root);
  if (base.empty() || base.back() != '/') base.push_back('/');
  if (opened.compare(0, base.size(), base) == 0) return "";
  return "leads out of its folder '" + root.string() + "' through a symbolic link (to '" + opened +
         "'): inputs are read only inside the folder they are named relative to";
}

std::filesystem::path absolute_normal(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(path, ec);
  return (ec ? path : abs).lexically_normal();
}

std::string outside_folder_problem(const std::filesystem::path& path, const std::filesystem::path& root) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "";
  std::string why = outside_folder_problem(fd, root);
  ::close(fd);
  return why;
}

std::string read_input_file(const std::filesystem::path& path, const std::string& what, std::uint64_t max_bytes) {
  return read_input_file(path, what, max_bytes, std::filesystem::path());
}

std::string read_input_file(const std::filesystem::path& path, const std::string& what, std::uint64_t max_bytes,
                            const std::filesystem::path& root) {
  InputFile f(path, max_bytes, root);
  std::string text = f.ok() ? f.read_all() : std::string();
  if (!f.error().empty()) throw UsageError(what + " '" + path.string() + "' " + f.error());
  return text;
}

}  // namespace sdxl
