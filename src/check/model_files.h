// --verify-model: the files of a model folder, and of the VAE, ControlNet and
// IP-Adapter folders tasks name, against the sha256 sums their model.json
// records. Logs what was checked and how long it took; a folder that records no
// sums is a warning. Throws ModelError naming the first file that differs.
// torch-free.
#pragma once

#include <vector>

#include "batch/generation_params.h"
#include "model/model_config.h"

namespace sdxl {

void verify_model_folder(const ModelConfig& mc);
// Each folder once, however many tasks name it.
void verify_task_folders(const std::vector<const GenerationParams*>& params);

}  // namespace sdxl
