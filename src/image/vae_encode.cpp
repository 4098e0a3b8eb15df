#include "image/vae_encode.h"

#include <torch/script.h>

#include "core/error.h"

namespace sdxl {

namespace {

// VaeImageProcessor.preprocess: float32 / 255, HWC -> [1, 3, H, W], 2x - 1 (on the CPU, float32).
torch::Tensor preprocess_rgb8(const std::uint8_t* rgb, int width, int height) {
  const torch::Tensor hwc =
      torch::from_blob(const_cast<std::uint8_t*>(rgb), {height, width, 3}, torch::kUInt8).to(torch::kFloat32) / 255.0;
  return hwc.permute({2, 0, 1}).unsqueeze(0) * 2.0 - 1.0;
}

torch::Tensor encode_mean(SdxlModel& model, const torch::Tensor& pixels) {
  const torch::Tensor image = pixels.contiguous().to(model.device, model.vae_dtype);
  torch::Tensor mean = run_module(vae_encoder_module(model), "vae_encoder", {image}).toTensor();
  if (torch::isnan(mean).any().item<bool>())
    throw TaskError("VAE encode produced NaN values (in " + std::string(c10::toString(model.vae_dtype)) + ")");
  return mean.to(model.dtype) * model.config.vae_scaling_factor;
}

}  // namespace

torch::Tensor vae_encode_rgb8(SdxlModel& model, const std::uint8_t* rgb, int width, int height) {
  return encode_mean(model, preprocess_rgb8(rgb, width, height));
}

torch::Tensor vae_encode_masked_rgb8(SdxlModel& model, const std::uint8_t* rgb, const std::uint8_t* repaint,
                                     int width, int height) {
  const torch::Tensor keep =
      torch::from_blob(const_cast<std::uint8_t*>(repaint), {1, 1, height, width}, torch::kUInt8).eq(0);
  return encode_mean(model, preprocess_rgb8(rgb, width, height) * keep.to(torch::kFloat32));
}

}  // namespace sdxl
