#include "core/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/error.h"

extern char** environ;

namespace sdxl {

namespace {

// An unnamed temporary file (O_TMPFILE, else created and unlinked at once).
int anonymous_file() {
  const char* dir = std::getenv("TMPDIR");
  const std::string folder = dir && *dir ? dir : "/tmp";
  int fd = ::open(folder.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  std::string name = folder + "/sdxl-batch-XXXXXX";
  fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) throw IoError("cannot create a temporary file in '" + folder + "': " + std::strerror(errno));
  ::unlink(name.c_str());
  return fd;
}

std::string read_back(int fd) {
  std::string s;
  if (fd < 0 || ::lseek(fd, 0, SEEK_SET) < 0) return s;
  char buf[65536];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) s.append(buf, static_cast<size_t>(n));
  return s;
}

int wait_status(int pid) {
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -1;
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return -1;
}

}  // namespace

Subprocess::Subprocess(const std::vector<std::string>& argv, bool feed_stdin, const std::string& cwd) {
  if (argv.empty()) throw UsageError("no program to run");
  program_ = argv[0];
  out_fd_ = anonymous_file();
  err_fd_ = anonymous_file();
  int in_pipe[2] = {-1, -1};
  if (feed_stdin && ::pipe2(in_pipe, O_CLOEXEC) != 0) throw IoError(std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (feed_stdin) posix_spawn_file_actions_adddup2(&fa, in_pipe[0], 0);
  else posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out_fd_, 1);
  posix_spawn_file_actions_adddup2(&fa, err_fd_, 2);
  if (!cwd.empty()) posix_spawn_file_actions_addchdir_np(&fa, cwd.c_str());
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, program_.c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (feed_stdin) ::close(in_pipe[0]);
  if (rc != 0) {
    if (feed_stdin) ::close(in_pipe[1]);
    ::close(out_fd_), ::close(err_fd_);
    throw IoError("cannot run '" + program_ + "': " + std::strerror(rc) + " (is it installed? scripts/setup.sh)");
  }
  pid_ = pid;
  stdin_fd_ = feed_stdin ? in_pipe[1] : -1;
}

Subprocess::~Subprocess() {
  if (stdin_fd_ >= 0) ::close(stdin_fd_);
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    wait_status(pid_);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
  if (err_fd_ >= 0) ::close(err_fd_);
}

void Subprocess::write(const void* data, size_t size) {
  if (stdin_fd_ < 0) throw IoError("'" + program_ + "' has no input pipe");
  // SIGPIPE is held off while writing: a child that died makes write() fail with EPIPE instead.
  sigset_t pipe_set, old_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
  const char* p = static_cast<const char*>(data);
  int error = 0;
  while (size > 0) {
    const ssize_t n = ::write(stdin_fd_, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      error = errno;
      break;
    }
    p += n, size -= static_cast<size_t>(n);
  }
  if (error == EPIPE) {  // consume the pending signal before unblocking
    const timespec zero{0, 0};
    sigtimedwait(&pipe_set, nullptr, &zero);
  }
  pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
  if (error) {
    const ProgramResult r = finish();
    throw IoError("'" + program_ + "' stopped reading its input (status " + std::to_string(r.status) + "): " + r.err);
  }
}

ProgramResult Subprocess::finish() {
  ProgramResult r;
  if (stdin_fd_ >= 0) ::close(stdin_fd_);
  stdin_fd_ = -1;
  if (pid_ > 0) r.status = wait_status(pid_);
  pid_ = -1;
  r.out = read_back(out_fd_);
  r.err = read_back(err_fd_);
  return r;
}

ProgramResult run_program(const std::vector<std::string>& argv, const std::string& cwd) {
  Subprocess p(argv, /*feed_stdin=*/false, cwd);
  return p.finish();
}

bool program_on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(ss, dir, ':');)
    if (!dir.empty() && ::access((std::filesystem::path(dir) / program).c_str(), X_OK) == 0) return true;
  return false;
}

}  // namespace sdxl
