// The pipeline's options (pipeline/generator.h) from the public ModelOptions:
// the one mapping of the model flags, used by Session::run and by the commands
// not yet on the public API (generate, sdxl-lora-bench). torch-free.
#pragma once

#include <filesystem>
#include <vector>

#include <sdxl_batch/sdxl_batch.h>

#include "pipeline/generator.h"

namespace sdxl::api {

// `batch_embedding_dirs` (a batch file's "embeddings_dir") come after the options' own.
RuntimeOptions runtime_options(const sdxl_batch::ModelOptions& m,
                               const std::vector<std::filesystem::path>& batch_embedding_dirs = {});

}  // namespace sdxl::api
