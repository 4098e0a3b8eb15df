// Session's state and the pieces its parts share (session.cpp, check.cpp,
// run.cpp). torch-free.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <sdxl_batch/sdxl_batch.h>

#include "check/batch_check.h"
#include "model/model_config.h"

namespace sdxl_batch {

struct Session::Impl {
  ModelOptions options;
  sdxl::ModelConfig config;  // model.json, with options.precision applied
  // What the next run makes: one batch file, or tasks submitted in code.
  std::string batch_file;
  std::vector<Task> tasks;
};

}  // namespace sdxl_batch

namespace sdxl::api {

// Session::generate's work (generate.cpp).
sdxl_batch::ImageResult generate_image(sdxl_batch::Session::Impl& s, const sdxl_batch::ImageRequest& r);

// The origin that problems of tasks submitted in code name.
inline const std::filesystem::path kTasksOrigin{"(tasks)"};

// The check layer's inputs from public options; `model` null: no model.
BatchCheckInputs check_inputs(const ModelConfig* model, const std::vector<std::string>& wildcard_dirs,
                              const std::vector<std::string>& embedding_dirs, int clip_skip,
                              const std::string& vae_dir, const std::vector<std::string>& lora_dirs);
// A checked batch as the public report (expansions only with `expand` and no problems).
sdxl_batch::CheckReport public_report(const CheckedBatch& checked, bool expand);

// The batch file text of tasks submitted in code (docs/batch-files.md's format):
// paths made absolute, unset values left to the model's defaults.
std::string tasks_document(const std::vector<sdxl_batch::Task>& tasks);

}  // namespace sdxl::api
