#include "api/boundary.h"

namespace sdxl::api {

void rethrow_public(const sdxl::Error& e) {
  if (dynamic_cast<const sdxl::UsageError*>(&e)) throw sdxl_batch::UsageError(e.what());
  if (dynamic_cast<const sdxl::ModelError*>(&e)) throw sdxl_batch::ModelError(e.what());
  if (dynamic_cast<const sdxl::IoError*>(&e)) throw sdxl_batch::IoError(e.what());
  if (e.code() == sdxl::ExitCode::kLocked) throw sdxl_batch::LockedError(e.what());
  throw sdxl_batch::Error(static_cast<sdxl_batch::ExitCode>(static_cast<int>(e.code())), e.what());
}

std::vector<sdxl_batch::Problem> public_problems(const std::string& file, const std::vector<BatchProblem>& problems) {
  std::vector<sdxl_batch::Problem> out;
  out.reserve(problems.size());
  for (const BatchProblem& p : problems) out.push_back({file, p.line, p.pointer, p.message});
  return out;
}

void throw_invalid(const std::filesystem::path& file, const std::vector<BatchProblem>& problems) {
  throw sdxl_batch::InvalidInputError(describe_problems(file, problems), public_problems(file.string(), problems));
}

}  // namespace sdxl::api

static_assert(static_cast<int>(sdxl_batch::ExitCode::kFatal) == static_cast<int>(sdxl::ExitCode::kFatal) &&
                  static_cast<int>(sdxl_batch::ExitCode::kUsage) == static_cast<int>(sdxl::ExitCode::kUsage) &&
                  static_cast<int>(sdxl_batch::ExitCode::kTasksFailed) ==
                      static_cast<int>(sdxl::ExitCode::kTasksFailed) &&
                  static_cast<int>(sdxl_batch::ExitCode::kLocked) == static_cast<int>(sdxl::ExitCode::kLocked),
              "the public exit codes are the internal ones");
