#include "pipeline/text_encode.h"

#include <optional>
#include <utility>

#include "core/error.h"
#include "device/device_errors.h"

namespace sdxl {
namespace {

// (hidden, pooled) of one encoder call. Clip skip 0..2: forward(ids) ->
// (hidden_states[-2], pooled). N >= 3: the hidden_states(ids) method ->
// (every hidden state stacked [L + 1, k, 77, H], pooled), of which
// hidden_states[-N] is taken.
std::pair<torch::Tensor, torch::Tensor> run_encoder(torch::jit::Module& encoder, const char* name,
                                                    const torch::Tensor& ids, int clip_skip) {
  c10::IValue out;
  if (clip_skip <= 2) {
    out = run_module(encoder, name, {ids});
  } else {
    const std::optional<torch::jit::Method> method = encoder.find_method("hidden_states");
    if (!method)
      throw TaskError("clip skip " + std::to_string(clip_skip) + ": " + name +
                      " has no hidden_states method (the model was exported before clip skip was supported): "
                      "export it again with scripts/export_sdxl.py");
    out = translate_device_errors(name, [&] { return (*method)({ids}); });
  }
  if (!out.isTuple() || out.toTupleRef().elements().size() < 2)
    throw TaskError(std::string(name) + " returned no (hidden, pooled) tuple: re-export the model");
  torch::Tensor hidden = out.toTupleRef().elements()[0].toTensor();
  const torch::Tensor pooled = out.toTupleRef().elements()[1].toTensor();
  if (clip_skip <= 2) return {hidden, pooled};
  if (hidden.dim() != 4 || clip_skip > hidden.size(0))  // [L + 1, k, 77, H]
    throw UsageError("clip skip " + std::to_string(clip_skip) + " is more than " + name + "'s " +
                     std::to_string(hidden.dim() == 4 ? hidden.size(0) : 0) + " hidden states");
  return {hidden.select(0, hidden.size(0) - clip_skip), pooled};
}

// Runs one encoder on every chunk (one call, batch = chunks), takes the layer
// clip skip picks, and applies the emphasis multipliers with A1111's mean
// restoration, per chunk.
torch::Tensor encode_weighted(torch::jit::Module& encoder, const char* name, const std::vector<PromptChunk>& chunks,
                              const torch::Device& device, int clip_skip, torch::Tensor* pooled_first) {
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
  auto [z, pooled] = run_encoder(encoder, name, torch::tensor(ids, torch::kInt64).reshape({k, n}).to(device), clip_skip);
  if (pooled_first) *pooled_first = pooled.slice(0, 0, 1);  // z: [k, 77, H]
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

PromptEmbeds encode_prompt_tokens(SdxlModel& model, const SdxlPromptTokens& tokens, int clip_skip) {
  PromptEmbeds e;
  const torch::Tensor h1 =
      encode_weighted(model.text_encoder, "text_encoder", tokens.te1, model.device, clip_skip, nullptr);
  const torch::Tensor h2 =
      encode_weighted(model.text_encoder_2, "text_encoder_2", tokens.te2, model.device, clip_skip, &e.pooled);
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
