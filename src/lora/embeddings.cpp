#include "lora/embeddings.h"

#include <spdlog/spdlog.h>
#include <torch/script.h>

#include "core/error.h"
#include "core/sha256.h"
#include "lora/embedding_files.h"
#include "lora/lora_cache.h"
#include "lora/safetensors.h"

namespace sdxl {
namespace {

// The token-embedding submodule of a traced CLIP text encoder (its "weight" is [vocab, width]).
torch::jit::Module token_embedding(torch::jit::Module& encoder, const std::string& which) {
  for (const auto& m : encoder.named_modules())
    if (m.name.size() >= 15 && m.name.compare(m.name.size() - 15, 15, "token_embedding") == 0 &&
        m.value.hasattr("weight"))
      return m.value;
  throw ModelError(which + ": no token_embedding module in the exported text encoder");
}

// Rows of one encoder, [n, width] (check_embedding_vectors checked dtype, width and values).
torch::Tensor rows_of(const SafetensorsFile& f, const char* key, const torch::Tensor& weight) {
  return safetensors_to_tensor(*f.find(key), f.label(), weight.device()).to(weight.dtype());
}

void append_rows(torch::jit::Module& embedding, const std::vector<torch::Tensor>& rows) {
  if (rows.empty()) return;
  std::vector<torch::Tensor> all{embedding.attr("weight").toTensor()};
  all.insert(all.end(), rows.begin(), rows.end());
  embedding.setattr("weight", torch::cat(all, 0).detach());
}

}  // namespace

std::vector<EmbeddingFile> load_embeddings(SdxlModel& model, const std::vector<std::filesystem::path>& dirs) {
  std::vector<EmbeddingFile> files = scan_embedding_files(dirs);
  torch::jit::Module e1 = token_embedding(model.text_encoder, "text_encoder");
  torch::jit::Module e2 = token_embedding(model.text_encoder_2, "text_encoder_2");
  const torch::Tensor w1 = e1.attr("weight").toTensor(), w2 = e2.attr("weight").toTensor();
  std::vector<torch::Tensor> rows1, rows2;  // every file read and checked before the model changes
  for (EmbeddingFile& e : files) {
    const SafetensorsFile f = SafetensorsFile::open(e.path);
    check_embedding_vectors(f, w1.size(1), w2.size(1));  // the checks `validate` makes too
    rows1.push_back(rows_of(f, "clip_l", w1));
    rows2.push_back(rows_of(f, "clip_g", w2));
    e.short_hash = sha256_hex(f.bytes()).substr(0, 12);  // the bytes just checked, not a second read
  }
  add_embedding_tokens(*model.tokenizer, files, static_cast<std::int32_t>(w1.size(0)));
  add_embedding_tokens(*model.tokenizer_2, files, static_cast<std::int32_t>(w2.size(0)));
  append_rows(e1, rows1);
  append_rows(e2, rows2);
  for (const EmbeddingFile& e : files)
    spdlog::info("embedding '{}': {} vector(s) from {} (hash {})", e.name, e.vectors, e.path.string(), e.short_hash);
  return files;
}

}  // namespace sdxl
