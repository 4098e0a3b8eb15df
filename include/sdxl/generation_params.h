// What one image needs: prompt, negative prompt, seed and sampling settings,
// plus its A1111-style `parameters` text (the PNG metadata users paste into
// other tools). torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sdxl/lora.h"

namespace sdxl {

struct GenerationParams {
  std::string prompt;
  std::string negative_prompt;
  std::int64_t seed = 0;  // noise seed of this image (task seed + image index)
  int steps = 28;
  double cfg = 7.0;
  int width = 1024;
  int height = 1024;
  std::string sampler = "Euler";
  std::string schedule = "Automatic";  // the model's own schedule (diffusers leading, offset 1)
  std::vector<LoraRef> loras;          // resolved --lora / batch entries; prompt tags are added at generation
};

inline constexpr const char* kProgramName = "sdxl-batch";
inline constexpr const char* kProgramVersion = "0.1.0";

// A1111's format:
//   <prompt>
//   Negative prompt: <negative>          (omitted when empty)
//   Steps: 28, Sampler: Euler, Schedule type: Automatic, CFG scale: 7, Seed: 42,
//   Size: 1024x1024, Model: <model name>, Lora hashes: "name: 0123456789ab", Version: sdxl-batch 0.1.0
// The prompt keeps its <lora:...> tags, as A1111 writes it; `lora_hashes` are the
// applied LoRAs' names and short hashes (A1111's "Lora hashes" field).
std::string a1111_parameters(const GenerationParams& p, const std::string& model_name,
                             const std::vector<std::pair<std::string, std::string>>& lora_hashes = {});

// Seeds are drawn from a 63-bit range so seed + index never overflows.
std::int64_t random_seed();

}  // namespace sdxl
