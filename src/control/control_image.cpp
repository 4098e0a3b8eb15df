#include "control/control_image.h"

#include <torch/torch.h>

#include <cmath>

#include "image/resize.h"

namespace sdxl {

torch::Tensor control_image_tensor(const RgbImage& image, int width, int height, torch::Dtype dtype,
                                   const torch::Device& device) {
  std::vector<std::uint8_t> resized;
  if (image.width != width || image.height != height)
    resized = resize_lanczos_rgb8(image.rgb.data(), image.width, image.height, width, height);
  const std::uint8_t* rgb = resized.empty() ? image.rgb.data() : resized.data();
  // from_blob does not own the pixels; the float copy below is made before they go.
  const torch::Tensor u8 = torch::from_blob(const_cast<std::uint8_t*>(rgb), {height, width, 3}, torch::kUInt8);
  // diffusers: np.array(images).astype(np.float32) / 255.0, then .to(dtype)
  const torch::Tensor x = u8.to(torch::kFloat32) / 255.0;
  return x.permute({2, 0, 1}).unsqueeze(0).contiguous().to(device, dtype);
}

std::string control_aspect_note(const std::string& path, const RgbImage& image, int width, int height) {
  const double a = static_cast<double>(image.width) / image.height, b = static_cast<double>(width) / height;
  if (std::abs(a / b - 1.0) <= 0.01) return "";
  return "control image '" + path + "' is " + std::to_string(image.width) + "x" + std::to_string(image.height) +
         ", another aspect ratio than the task's " + std::to_string(width) + "x" + std::to_string(height) +
         ": it is stretched to that size (as diffusers does); crop it first to keep its proportions";
}

}  // namespace sdxl
