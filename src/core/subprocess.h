// Running another program (ffmpeg, ffprobe) found on PATH, without a shell: arguments are passed
// as they are, never parsed. Its stdout and stderr go to anonymous temporary files (so a chatty
// child never blocks on a full pipe) and are read back when it exits. A Subprocess may feed the
// child's stdin through a pipe; its destructor kills and reaps a child still running (RAII).
// Writing to a child that died raises no SIGPIPE (it is ignored while writing) but throws IoError.
// torch-free; one thread per Subprocess.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace sdxl {

struct ProgramResult {
  int status = -1;  // exit status; 128 + signal when killed by one; 127 when it could not start
  std::string out, err;
};

class Subprocess {
 public:
  // Starts argv[0] (looked up on PATH). With `feed_stdin` the child reads a pipe fed by write();
  // else /dev/null. `cwd` (not empty): the child's working folder. Throws IoError when the program
  // cannot be started (naming it).
  Subprocess(const std::vector<std::string>& argv, bool feed_stdin, const std::string& cwd = "");
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  // Writes all `size` bytes to the child's stdin; throws IoError when the child closed it (it
  // exited: its stderr is in the message).
  void write(const void* data, size_t size);
  // Closes stdin, waits for the exit and returns the status and output.
  ProgramResult finish();

 private:
  std::string program_;
  int pid_ = -1;
  int stdin_fd_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
};

// Runs a program to its end (stdin /dev/null).
ProgramResult run_program(const std::vector<std::string>& argv, const std::string& cwd = "");

// Whether `program` is found on PATH.
bool program_on_path(const std::string& program);

}  // namespace sdxl
