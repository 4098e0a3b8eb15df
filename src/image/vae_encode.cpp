#include "image/vae_encode.h"

#include <torch/script.h>

#include "core/error.h"

namespace sdxl {

torch::Tensor vae_encode_rgb8(SdxlModel& model, const std::uint8_t* rgb, int width, int height) {
  // VaeImageProcessor.preprocess: float32 / 255, HWC -> CHW, 2x - 1.
  const torch::Tensor hwc =
      torch::from_blob(const_cast<std::uint8_t*>(rgb), {height, width, 3}, torch::kUInt8).to(torch::kFloat32) / 255.0;
  const torch::Tensor image = (hwc.permute({2, 0, 1}).unsqueeze(0) * 2.0 - 1.0).contiguous().to(model.device, model.vae_dtype);
  torch::Tensor mean = run_module(vae_encoder_module(model), "vae_encoder", {image}).toTensor();
  if (torch::isnan(mean).any().item<bool>())
    throw TaskError("VAE encode produced NaN values (in " + std::string(c10::toString(model.vae_dtype)) + ")");
  return mean.to(model.dtype) * model.config.vae_scaling_factor;
}

}  // namespace sdxl
