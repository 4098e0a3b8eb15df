// A test hook: with SDXL_TEST_KILL_AT=NAME in the environment, the process
// kills itself (SIGKILL, no clean-up) the first time it reaches the point NAME,
// so tests can check what a kill at exactly that moment leaves behind. Points:
//   png-written   a PNG renamed into place, its manifest line not yet written
// Without the variable this is one getenv per call. torch-free.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace sdxl {

inline void fault_point(const char* name) {
  const char* at = std::getenv("SDXL_TEST_KILL_AT");
  if (at != nullptr && std::strcmp(at, name) == 0) ::kill(::getpid(), SIGKILL);
}

}  // namespace sdxl
