// Loads textual-inversion embeddings into a model, as diffusers'
// load_textual_inversion and A1111 do: each file found by
// lora/embedding_files.h adds n tokens (its name) to both tokenizers and its
// "clip_l" [n, 768] and "clip_g" [n, 1280] rows to the two text encoders'
// token embeddings.
#pragma once

#include <filesystem>
#include <vector>

#include "lora/embedding_files.h"
#include "model/sdxl_model.h"

namespace sdxl {

// Every *.safetensors in `dirs`. Throws UsageError naming the file for an
// SD 1.x embedding, mis-shaped tensors, NaN/Inf, or a name that is already a
// token or loaded twice; nothing of the model changes then. The returned files
// carry their short hashes (the PNG's "TI hashes").
std::vector<EmbeddingFile> load_embeddings(SdxlModel& model, const std::vector<std::filesystem::path>& dirs);

}  // namespace sdxl
