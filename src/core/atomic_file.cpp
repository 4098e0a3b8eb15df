#include "core/atomic_file.h"
#include "core/atomic_stream.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
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

// Letters, digits, '-', '_' and '@' kept; anything else (the separators '~' and '.') becomes '_'.
std::string name_safe(std::string_view text, size_t max_size) {
  std::string out(text.substr(0, max_size));
  for (char& c : out) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
                    c == '@';
    if (!ok) c = '_';
  }
  return out;
}

// "<hostname>@<pid namespace inode>" ("@" part left out where /proc does not say).
std::string host_identity() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "unknown-host");
  std::string id = name_safe(host, 64);
  char ns[64] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof ns - 1);  // "pid:[4026531836]"
  const std::string link(ns, n > 0 ? static_cast<size_t>(n) : 0);
  const size_t open = link.find('['), close = link.find(']');
  if (open != std::string::npos && close != std::string::npos && close > open + 1)
    id += "@" + name_safe(link.substr(open + 1, close - open - 1), 20);
  return id;
}

std::mutex g_tag_mu;
std::string g_tag;  // guarded by g_tag_mu

}  // namespace

TempFileOwner this_temp_file_owner() {
  static const std::string host = host_identity();
  TempFileOwner o{host, static_cast<long>(::getpid()), ""};
  const std::lock_guard lk(g_tag_mu);
  o.tag = g_tag;
  return o;
}

void set_temp_file_tag(const std::string& tag) {
  const std::lock_guard lk(g_tag_mu);
  g_tag = name_safe(tag, 40);
}

std::string temp_file_name(const std::string& target_name, const TempFileOwner& owner, unsigned n) {
  const std::string tail = "~" + name_safe(owner.host, 100) + "~" + std::to_string(owner.pid) + "~" +
                           name_safe(owner.tag, 40) + "~" + std::to_string(n) + ".tmp";
  const size_t room = 255 - 1 - tail.size();  // a file name has at most 255 bytes
  return "." + target_name.substr(0, room) + tail;
}

std::optional<TempFileOwner> parse_temp_file_name(const std::string& name) {
  if (name.size() < 6 || name[0] != '.' || name.compare(name.size() - 4, 4, ".tmp") != 0) return std::nullopt;
  std::string fields[4];  // n, tag, pid, host: from the end
  size_t end = name.size() - 4;
  for (std::string& f : fields) {
    const size_t sep = name.rfind('~', end - 1);
    if (sep == std::string::npos || sep == 0) return std::nullopt;
    f = name.substr(sep + 1, end - sep - 1);
    end = sep;
  }
  const auto digits = [](const std::string& s) {
    return !s.empty() && s.size() <= 12 && s.find_first_not_of("0123456789") == std::string::npos;
  };
  if (!digits(fields[0]) || !digits(fields[2]) || fields[3].empty()) return std::nullopt;
  return TempFileOwner{fields[3], std::stol(fields[2]), fields[1]};
}

void write_file_atomic(const std::filesystem::path& path, std::span<const std::uint8_t> data) {
  write_file_atomic_streamed(path, [&](const std::function<void(std::string_view)>& write) {
    write(std::string_view(reinterpret_cast<const char*>(data.data()), data.size()));
  });
}

void write_file_atomic_streamed(const std::filesystem::path& path,
                                const std::function<void(const std::function<void(std::string_view)>&)>& produce) {
  static std::atomic<unsigned> counter{0};
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  TempFile tmp(dir / temp_file_name(path.filename().string(), this_temp_file_owner(), counter++));
  produce([&tmp](std::string_view piece) {
    tmp.write_all(reinterpret_cast<const std::uint8_t*>(piece.data()), piece.size());
  });
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
