#include "lora/embedding_files.h"

#include <algorithm>

#include "core/error.h"
#include "lora/safetensors.h"

namespace sdxl {

std::vector<std::filesystem::path> list_embedding_files(const std::vector<std::filesystem::path>& dirs) {
  std::vector<std::filesystem::path> out;
  for (const auto& dir : dirs) {
    std::error_code ec;
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
      if (e.path().extension() == ".safetensors") files.push_back(e.path());
    if (ec) throw UsageError("embedding folder '" + dir.string() + "': " + ec.message());
    std::sort(files.begin(), files.end());
    out.insert(out.end(), files.begin(), files.end());
  }
  return out;
}

std::vector<EmbeddingFile> scan_embedding_files(const std::vector<std::filesystem::path>& dirs) {
  std::vector<EmbeddingFile> out;
  for (const auto& path : list_embedding_files(dirs)) {
    const SafetensorsFile f = SafetensorsFile::open(path);
    const SafetensorsTensor* l = f.find("clip_l");
    const SafetensorsTensor* g = f.find("clip_g");
    if (l == nullptr || g == nullptr)
      throw UsageError("embedding '" + f.label() + "' has no '" + (l == nullptr ? "clip_l" : "clip_g") +
                       "' tensor: an SDXL embedding holds clip_l and clip_g (an SD 1.x embedding, with emb_params " +
                       "or string_to_param, does not fit SDXL)");
    if (l->shape.size() != 2 || g->shape.size() != 2 || l->shape[0] != g->shape[0] || l->shape[0] < 1)
      throw UsageError("embedding '" + f.label() + "': clip_l and clip_g must be [n, width] with the same n");
    out.push_back({path.stem().string(), path, static_cast<int>(l->shape[0])});
  }
  return out;
}

void add_embedding_tokens(ClipTokenizer& tokenizer, const std::vector<EmbeddingFile>& files, std::int32_t first_id) {
  std::int32_t next = first_id;
  for (const EmbeddingFile& e : files) {
    try {
      tokenizer.add_embedding(e.name, next, e.vectors);
    } catch (const ModelError& err) {
      throw UsageError("'" + e.path.string() + "': " + err.what());
    }
    next += e.vectors;
  }
}

}  // namespace sdxl
