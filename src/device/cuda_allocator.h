// The CUDA caching allocator's settings (--cuda-allocator), torch-free so that
// the CLI and the report can name them without torch headers.
#pragma once

#include <string>

namespace sdxl {

// What to apply for --cuda-allocator MODE given the environment variables
// PYTORCH_ALLOC_CONF and PYTORCH_CUDA_ALLOC_CONF (nullptr or "" = unset):
// `apply` is the string for the allocator ("" = leave it as it is), `report` what
// the report shows. Throws UsageError for an unknown mode.
struct AllocatorChoice {
  std::string apply, report;
};
AllocatorChoice choose_cuda_allocator(const std::string& mode, const char* env_alloc_conf, const char* env_cuda_alloc_conf);

// Applies --cuda-allocator MODE once per process, before the first CUDA
// allocation; later calls change nothing.
void configure_cuda_allocator(const std::string& mode);

// The settings the run uses, for the report: what configure_cuda_allocator
// applied ("expandable_segments:True", "default") or the environment's value;
// "" while nothing was configured.
std::string cuda_allocator_settings();

}  // namespace sdxl
