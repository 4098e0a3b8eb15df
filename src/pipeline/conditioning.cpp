#include "pipeline/conditioning.h"

#include "core/error.h"

namespace sdxl {
namespace {

// Runs one encoder on every chunk (one call, batch = chunks) and applies the
// emphasis multipliers with A1111's mean restoration, per chunk.
torch::Tensor encode_weighted(torch::jit::Module& encoder, const char* name, const std::vector<PromptChunk>& chunks,
                              const torch::Device& device, torch::Tensor* pooled_first) {
  const auto k = static_cast<int64_t>(chunks.size());
  std::vector<int64_t> ids;
  std::vector<float> mult;
  bool weighted = false;
  for (const PromptChunk& c : chunks) {
    ids.insert(ids.end(), c.ids.begin(), c.ids.end());
    mult.insert(mult.end(), c.multipliers.begin(), c.multipliers.end());
    for (float m : c.multipliers) weighted |= m != 1.0f;
  }
  const int64_t n = ClipTokenizer::kMaxLength;
  const c10::IValue out = run_module(encoder, name, {torch::tensor(ids, torch::kInt64).reshape({k, n}).to(device)});
  if (!out.isTuple() || out.toTupleRef().elements().size() < 2)
    throw TaskError(std::string(name) + " returned no (hidden, pooled) tuple: re-export the model");
  torch::Tensor z = out.toTupleRef().elements()[0].toTensor();  // [k, 77, H]
  if (pooled_first) *pooled_first = out.toTupleRef().elements()[1].toTensor().slice(0, 0, 1);
  if (weighted) {
    const torch::Tensor m = torch::tensor(mult).reshape({k, n, 1}).to(device, z.scalar_type());
    const torch::Tensor original_mean = z.mean({1, 2}, /*keepdim=*/true);
    z = z * m;
    z = z * (original_mean / z.mean({1, 2}, /*keepdim=*/true));
  }
  return z.reshape({1, k * n, z.size(2)});  // chunks one after another along the sequence
}

}  // namespace

SdxlPromptTokens tokenize_sdxl_prompt(const SdxlModel& model, const std::string& text) {
  SdxlPromptTokens t;
  t.te1 = tokenize_prompt(*model.tokenizer, text, &t.warnings);
  t.te2 = tokenize_prompt(*model.tokenizer_2, text, nullptr);  // same syntax: warn once
  // Tokenizer 2 treats its pad token "!" as special, so counts can differ.
  pad_sdxl_prompt(model, t, std::max(t.te1.size(), t.te2.size()));
  return t;
}

void pad_sdxl_prompt(const SdxlModel& model, SdxlPromptTokens& tokens, size_t count) {
  pad_chunks(*model.tokenizer, tokens.te1, count);
  pad_chunks(*model.tokenizer_2, tokens.te2, count);
}

PromptEmbeds encode_prompt_tokens(SdxlModel& model, const SdxlPromptTokens& tokens) {
  PromptEmbeds e;
  const torch::Tensor h1 = encode_weighted(model.text_encoder, "text_encoder", tokens.te1, model.device, nullptr);
  const torch::Tensor h2 = encode_weighted(model.text_encoder_2, "text_encoder_2", tokens.te2, model.device, &e.pooled);
  e.context = torch::cat({h1, h2}, -1).to(model.dtype);
  e.pooled = e.pooled.to(model.dtype);
  return e;
}

PromptEmbeds zero_embeds(const PromptEmbeds& like) {
  return {torch::zeros_like(like.context), torch::zeros_like(like.pooled)};
}

torch::Tensor sdxl_time_ids(int width, int height, torch::Dtype dtype, const torch::Device& device) {
  std::vector<float> v = {static_cast<float>(height), static_cast<float>(width), 0.f, 0.f,
                          static_cast<float>(height), static_cast<float>(width)};
  return torch::tensor(v).reshape({1, 6}).to(device, dtype);
}

}  // namespace sdxl
