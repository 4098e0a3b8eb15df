// Precompiled header of sdxl_core: the torch includes, compiled once per build.
// torch/script.h (tensors + TorchScript modules), not the much larger torch/torch.h.
#pragma once
#include <torch/script.h>
