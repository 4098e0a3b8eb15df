// Textual-inversion embeddings for SDXL, as diffusers' load_textual_inversion
// and A1111 load them: a .safetensors file with "clip_l" [n, 768] and "clip_g"
// [n, 1280] (the widths of the model's two text encoders). The file's stem is
// the name a prompt uses ("easynegative" in a negative prompt); it stands for
// n new tokens whose rows are appended to each encoder's token embedding.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "model/sdxl_model.h"

namespace sdxl {

struct LoadedEmbedding {
  std::string name;  // the file's stem: what prompts write
  std::filesystem::path path;
  int vectors = 0;
};

// Loads every *.safetensors in `dirs` (each folder's files in name order) into
// the model's tokenizers and text encoders. Throws UsageError naming the file
// for an SD 1.x embedding, missing or mis-shaped tensors, NaN/Inf, or a name
// that is already a token or loaded twice.
std::vector<LoadedEmbedding> load_embeddings(SdxlModel& model, const std::vector<std::filesystem::path>& dirs);

}  // namespace sdxl
