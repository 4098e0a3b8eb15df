// libFuzzer target: the safetensors header parser and the LoRA key mapping must
// never crash, hang, overflow or read outside the buffer on any file; a bad file
// is a UsageError, nothing else.
#include <cstddef>
#include <cstdint>
#include <span>

#include "lora/lora_keys.h"
#include "core/error.h"
#include "lora/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const sdxl::ModelParamShapes shapes = [] {
    sdxl::ModelParamShapes s;
    s.params[2]["down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q.weight"] = {64, 64};
    s.params[2]["down_blocks.1.resnets.0.conv1.weight"] = {64, 32, 3, 3};
    s.params[2]["up_blocks.0.upsamplers.0.conv.weight"] = {64, 64, 3, 3};
    s.params[0]["text_model.encoder.layers.0.self_attn.q_proj.weight"] = {32, 32};
    s.params[1]["text_projection.weight"] = {32, 32};
    return s;
  }();
  try {
    const auto h = sdxl::parse_safetensors(std::span<const std::uint8_t>(data, size), "fuzz.safetensors");
    for (const auto& t : h.tensors) {
      // Touch every byte span: ASan catches a span outside the input.
      volatile std::uint8_t sink = 0;
      if (!t.bytes.empty()) sink = static_cast<std::uint8_t>(t.bytes.front() ^ t.bytes.back());
      (void)sink;
      try {
        (void)sdxl::safetensors_scalar(t, "fuzz.safetensors");
      } catch (const sdxl::UsageError&) {
      }
    }
    (void)sdxl::map_lora_keys(h.tensors, shapes, "fuzz.safetensors");
  } catch (const sdxl::UsageError&) {
  }
  return 0;
}
