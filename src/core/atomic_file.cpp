#include "core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "core/error.h"

namespace sdxl {
namespace {

std::string sys_error(const std::string& what, const std::filesystem::path& p) {
  return what + " '" + p.string() + "': " + std::strerror(errno);
}

// Closes the descriptor and removes the temporary file unless released.
class TempFile {
 public:
  explicit TempFile(std::filesystem::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) throw IoError(sys_error("cannot create temporary file", path_));
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  void write_all(const std::uint8_t* data, size_t size) {
    while (size > 0) {
      ssize_t n = ::write(fd_, data, size);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw IoError(sys_error("cannot write", path_));
      }
      data += n;
      size -= static_cast<size_t>(n);
    }
  }
  void sync_and_close() {
    if (::fsync(fd_) != 0) throw IoError(sys_error("cannot fsync", path_));
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw IoError(sys_error("cannot close", path_));
  }
  void commit_to(const std::filesystem::path& target) {
    if (::rename(path_.c_str(), target.c_str()) != 0) throw IoError(sys_error("cannot rename onto", target));
    committed_ = true;
  }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  bool committed_ = false;
};

void fsync_dir(const std::filesystem::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw IoError(sys_error("cannot open folder", dir));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw IoError(sys_error("cannot fsync folder", dir));
}

}  // namespace

void write_file_atomic(const std::filesystem::path& path, std::span<const std::uint8_t> data) {
  static std::atomic<unsigned> counter{0};
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  // Dot-prefixed and suffixed .tmp so a listing of finished images never shows it.
  const std::string tmp_name = "." + path.filename().string() + "." + std::to_string(::getpid()) + "." +
                               std::to_string(counter++) + ".tmp";
  TempFile tmp(dir / tmp_name);
  tmp.write_all(data.data(), data.size());
  tmp.sync_and_close();
  tmp.commit_to(path);
  fsync_dir(dir);
}

void write_file_atomic(const std::filesystem::path& path, std::string_view text) {
  write_file_atomic(path, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
}

}  // namespace sdxl

namespace sdxl {

void append_line_durable(const std::filesystem::path& path, std::string line) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == ELOOP)
      throw IoError("refusing to append to '" + path.string() +
                    "': it is a symbolic link (sdxl-batch writes its own files in the output folder, never through "
                    "a link); remove it");
    throw IoError(sys_error("cannot open", path));
  }
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IoError("refusing to append to '" + path.string() + "': it is not a regular file");
  }
  char last = '\n';
  if (st.st_size > 0 && ::pread(fd, &last, 1, st.st_size - 1) == 1 && last != '\n') line.insert(0, "\n");
  const ssize_t n = ::write(fd, line.data(), line.size());
  const int write_errno = errno;
  const int sync_rc = ::fsync(fd);
  ::close(fd);
  if (n < 0) throw IoError("cannot append to '" + path.string() + "': " + std::strerror(write_errno));
  if (static_cast<size_t>(n) != line.size())
    throw IoError("cannot append to '" + path.string() + "': short write, " + std::to_string(n) + " of " +
                  std::to_string(line.size()) + " bytes (is the disk full?); the next run starts a new line after it");
  if (sync_rc != 0) throw IoError(sys_error("cannot fsync", path));
}

}  // namespace sdxl
