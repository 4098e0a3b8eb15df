// libtorch failures as the project's errors: what the scheduler's failure policy
// acts on (an out-of-memory halves the batch; another error fails the task).
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

#include "core/error.h"

namespace sdxl {

// Runs f(); a libtorch failure becomes OutOfMemoryError when its message says
// so (TorchScript reports a CUDA out-of-memory as a generic error), else a
// TaskError, prefixed "<what> failed: " when `what` is given. The project's
// own errors pass through unchanged.
template <typename F>
auto translate_device_errors(const char* what, F&& f) -> decltype(f()) {
  auto fail = [what](const std::string& message) {
    const std::string msg = what && *what ? std::string(what) + " failed: " + message : message;
    if (is_out_of_memory_message(message)) throw OutOfMemoryError(msg);
    throw TaskError(msg);
  };
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    fail(e.what_without_backtrace());
  } catch (const std::exception& e) {
    fail(e.what());
  }
  throw TaskError("unreachable");
}

}  // namespace sdxl
