// What one image needs: prompt, negative prompt, seed and sampling settings,
// plus its A1111-style `parameters` text (the PNG metadata users paste into
// other tools). torch-free.
#pragma once

#include <cstdint>
#include <string>

namespace sdxl {

struct GenerationParams {
  std::string prompt;
  std::string negative_prompt;
  std::int64_t seed = 0;  // noise seed of this image (task seed + image index)
  int steps = 28;
  double cfg = 7.0;
  int width = 1024;
  int height = 1024;
  std::string sampler = "Euler";       // A1111 sampler name (sdxl/sampler_plan.h), canonical after validation
  std::string schedule = "Automatic";  // A1111 schedule type; Automatic = the model's own (diffusers leading, offset 1)
  double guidance_rescale = 0.0;       // diffusers' guidance_rescale (0 = off)
};

// Validates sampler + schedule (throws UsageError listing the valid names) and
// rewrites them to their canonical A1111 spelling: "dpm++ 2m karras" ->
// sampler "DPM++ 2M", schedule "Karras".
void canonicalize_sampler(GenerationParams& p);

inline constexpr const char* kProgramName = "sdxl-batch";
inline constexpr const char* kProgramVersion = "0.1.0";

// A1111's format:
//   <prompt>
//   Negative prompt: <negative>          (omitted when empty)
//   Steps: 28, Sampler: Euler, Schedule type: Automatic, CFG scale: 7, Seed: 42,
//   Size: 1024x1024, Model: <model name>, Version: sdxl-batch 0.1.0
// "Guidance rescale: <phi>" follows the CFG scale when it is not 0.
std::string a1111_parameters(const GenerationParams& p, const std::string& model_name);

// Seeds are drawn from a 63-bit range so seed + index never overflows.
std::int64_t random_seed();

}  // namespace sdxl
