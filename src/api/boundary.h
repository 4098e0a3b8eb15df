// The API's boundary: internal errors (core/error.h) become the public ones of
// sdxl_batch/sdxl_batch.h, and internal problem lists public Problems. Every
// public function runs its body through guarded(), so nothing else leaves the
// library (std::bad_alloc excepted). torch-free.
#pragma once

#include <filesystem>
#include <new>
#include <string>
#include <vector>

#include <sdxl_batch/sdxl_batch.h>

#include "batch/batch_file.h"
#include "core/error.h"

namespace sdxl::api {

// The public error for an internal one, by type and exit code.
[[noreturn]] void rethrow_public(const sdxl::Error& e);

template <class F>
auto guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const sdxl_batch::Error&) {
    throw;
  } catch (const sdxl::Error& e) {
    rethrow_public(e);
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {  // a bug or the environment (filesystem, JSON library)
    throw sdxl_batch::Error(sdxl_batch::ExitCode::kFatal, std::string("unexpected error: ") + e.what());
  }
}

std::vector<sdxl_batch::Problem> public_problems(const std::string& file, const std::vector<BatchProblem>& problems);

// InvalidInputError listing `problems` of `file` (describe_problems' text).
[[noreturn]] void throw_invalid(const std::filesystem::path& file, const std::vector<BatchProblem>& problems);

}  // namespace sdxl::api
