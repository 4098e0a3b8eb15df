#include "lora/embeddings.h"

#include <spdlog/spdlog.h>
#include <torch/script.h>

#include "core/error.h"
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

// Rows of one encoder: [n, width] where width is the encoder's; a clear error otherwise.
torch::Tensor rows_of(const SafetensorsFile& f, const char* key, std::int64_t width, const torch::Tensor& like) {
  const SafetensorsTensor* t = f.find(key);
  if (t == nullptr)
    throw UsageError("embedding '" + f.label() + "' has no '" + key + "' tensor: an SDXL embedding holds clip_l and " +
                     "clip_g (an SD 1.x embedding, with emb_params or string_to_param, does not fit SDXL)");
  if (t->shape.size() != 2 || t->shape[1] != width || t->shape[0] < 1)
    throw UsageError("embedding '" + f.label() + "': '" + key + "' has shape [" +
                     (t->shape.empty() ? std::string() : std::to_string(t->shape[0])) +
                     (t->shape.size() > 1 ? ", " + std::to_string(t->shape[1]) : std::string()) + "], this model needs [n, " +
                     std::to_string(width) + "]");
  return safetensors_to_tensor(*t, f.label(), like.device()).to(like.dtype());
}

void append_rows(torch::jit::Module& embedding, const torch::Tensor& rows) {
  const torch::Tensor weight = embedding.attr("weight").toTensor();
  embedding.setattr("weight", torch::cat({weight, rows}, 0).detach());
}

LoadedEmbedding load_one(SdxlModel& model, const std::filesystem::path& path) {
  const SafetensorsFile f = SafetensorsFile::open(path);
  torch::jit::Module e1 = token_embedding(model.text_encoder, "text_encoder");
  torch::jit::Module e2 = token_embedding(model.text_encoder_2, "text_encoder_2");
  const torch::Tensor w1 = e1.attr("weight").toTensor(), w2 = e2.attr("weight").toTensor();
  const torch::Tensor l = rows_of(f, "clip_l", w1.size(1), w1), g = rows_of(f, "clip_g", w2.size(1), w2);
  if (l.size(0) != g.size(0))
    throw UsageError("embedding '" + f.label() + "': clip_l has " + std::to_string(l.size(0)) + " vectors, clip_g " +
                     std::to_string(g.size(0)));
  LoadedEmbedding out{path.stem().string(), path, static_cast<int>(l.size(0))};
  // Tokenizers first: they refuse a name that is a token already, before any weight changes.
  model.tokenizer->add_embedding(out.name, static_cast<int32_t>(w1.size(0)), out.vectors);
  model.tokenizer_2->add_embedding(out.name, static_cast<int32_t>(w2.size(0)), out.vectors);
  append_rows(e1, l);
  append_rows(e2, g);
  return out;
}

}  // namespace

std::vector<LoadedEmbedding> load_embeddings(SdxlModel& model, const std::vector<std::filesystem::path>& dirs) {
  std::vector<LoadedEmbedding> out;
  for (const auto& f : list_embedding_files(dirs)) {
    try {
      out.push_back(load_one(model, f));
    } catch (const ModelError& e) {  // the tokenizer's refusal of a name: the user's file, not the model
      throw UsageError("'" + f.string() + "': " + e.what());
    }
    spdlog::info("embedding '{}': {} vector(s) from {}", out.back().name, out.back().vectors, f.string());
  }
  return out;
}

}  // namespace sdxl
