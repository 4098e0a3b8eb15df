#include "text/conditioning.h"

#include "sdxl/error.h"

namespace sdxl {
namespace {

torch::Tensor ids_tensor(const ClipTokenizer& tok, const std::string& text, const torch::Device& device) {
  std::vector<int64_t> ids = tok.encode_padded(text);
  return torch::tensor(ids, torch::kInt64).reshape({1, static_cast<int64_t>(ids.size())}).to(device);
}

std::pair<torch::Tensor, torch::Tensor> encoder_outputs(const c10::IValue& out, const char* name) {
  if (!out.isTuple() || out.toTupleRef().elements().size() < 2)
    throw TaskError(std::string(name) + " returned no (hidden, pooled) tuple: re-export the model");
  const auto& el = out.toTupleRef().elements();
  return {el[0].toTensor(), el[1].toTensor()};
}

}  // namespace

PromptEmbeds encode_prompt(SdxlModel& model, const std::string& text) {
  auto [h1, p1] = encoder_outputs(
      run_module(model.text_encoder, "text_encoder", {ids_tensor(*model.tokenizer, text, model.device)}), "text_encoder");
  auto [h2, p2] = encoder_outputs(
      run_module(model.text_encoder_2, "text_encoder_2", {ids_tensor(*model.tokenizer_2, text, model.device)}),
      "text_encoder_2");
  (void)p1;  // SDXL pools encoder 2 only
  PromptEmbeds e;
  e.context = torch::cat({h1, h2}, -1).to(model.dtype);
  e.pooled = p2.to(model.dtype);
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
