// LoRA key mapping: the tensor names of a LoRA file (kohya `lora_unet_*` /
// `lora_te1_*` / `lora_te2_*` with lora_down/lora_up/alpha, in diffusers or
// SGM block names, LoCon convs; diffusers/peft `unet.*` / `text_encoder.*` /
// `text_encoder_2.*` with lora_A/lora_B or .lora.down/.lora.up) to the
// parameter names of the exported modules. The lookup tables are built from
// the modules' real parameter names, never guessed. torch-free, pure.
// Throws UsageError when the file was made for another base model (SD 1.x/2.x)
// or a factor's shape does not fit its weight.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lora/safetensors.h"

namespace sdxl {

enum class LoraTarget : int { kTextEncoder = 0, kTextEncoder2 = 1, kUnet = 2 };
const char* lora_target_name(LoraTarget t);

// Parameter name -> shape, per module (text_encoder, text_encoder_2, unet).
struct ModelParamShapes {
  std::array<std::map<std::string, std::vector<std::int64_t>>, 3> params;
  const std::map<std::string, std::vector<std::int64_t>>& of(LoraTarget t) const {
    return params[static_cast<int>(t)];
  }
};

struct LoraLayerKeys {
  LoraTarget target = LoraTarget::kUnet;
  std::string param;            // e.g. down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q.weight
  std::string down, up, alpha;  // tensor names in the file; alpha "" when absent (scale 1)
};

struct LoraKeyMap {
  std::string format;                  // "kohya" | "diffusers" (peft and old .lora.down names)
  std::vector<LoraLayerKeys> layers;   // sorted by (target, param)
  std::vector<std::string> unmatched;  // file keys that map to no parameter
};

LoraKeyMap map_lora_keys(const std::vector<SafetensorsTensor>& tensors, const ModelParamShapes& model,
                         const std::string& label);

// The SGM/LDM ("input_blocks.4.1...") spelling of a diffusers UNet module path,
// "" when it has none. Kohya's SDXL trainer names UNet layers this way.
// Mapping as diffusers' _maybe_map_sgm_blocks_to_diffusers and
// _convert_unet_lora_key (loaders/lora_conversion_utils.py), inverted.
std::string sgm_module_name(const std::string& diffusers_module, int down_layers, int up_layers,
                            const std::vector<bool>& up_block_has_attentions);

}  // namespace sdxl
