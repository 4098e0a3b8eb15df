// A batch file's "pins" (batch_file.h): each pinned folder must be the one whose model.json has the
// pinned sha256, and each file that model.json lists must have the sha256 it records. Checked by
// `validate` and by `run` before any weights load, so a folder replaced on a shared disk (model
// folders are code: docs/unattended-runs.md#model-folders-are-code) is refused instead of run.
// torch-free.
#pragma once

#include <vector>

#include "batch/batch_file.h"

namespace sdxl {

// Adds a problem at the pin's pointer for each folder that is not the pinned one (its model.json
// missing or other, a listed file missing, other, named outside the folder, or without a sha256).
void check_folder_pins(const BatchFile& bf, std::vector<BatchProblem>& problems);

}  // namespace sdxl
