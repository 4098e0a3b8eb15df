#include "image/vae_decode.h"

#include <torch/script.h>

#include "sdxl/error.h"

namespace sdxl {

std::vector<std::uint8_t> vae_decode_rgb8(SdxlModel& model, const torch::Tensor& latents) {
  const torch::Tensor z = latents.to(model.vae_dtype) / model.config.vae_scaling_factor;
  torch::Tensor image = run_module(model.vae_decoder, "vae_decoder", {z}).toTensor();
  image = (image / 2 + 0.5).clamp(0, 1).to(torch::kCPU).to(torch::kFloat32);
  if (torch::isnan(image).any().item<bool>())
    throw TaskError("VAE decode produced NaN values (in " + std::string(c10::toString(model.vae_dtype)) +
                    "); re-export the model with an fp32 VAE");
  // [1, 3, H, W] -> [H, W, 3] uint8 with numpy's rounding (half to even).
  torch::Tensor hwc = (image[0].permute({1, 2, 0}) * 255).round().to(torch::kUInt8).contiguous();
  const auto* p = hwc.data_ptr<std::uint8_t>();
  return std::vector<std::uint8_t>(p, p + hwc.numel());
}

}  // namespace sdxl
