#include "control/clip_image.h"

#include <ATen/ATen.h>

#include "core/error.h"

namespace sdxl {

torch::Tensor clip_image_tensor(const RgbImage& image, int size, const std::vector<double>& mean,
                                const std::vector<double>& std) {
  if (image.width < 1 || image.height < 1 || mean.size() != 3 || std.size() != 3)
    throw UsageError("an empty reference image, or no CLIP mean/std");
  const std::int64_t h = image.height, w = image.width, s = size;
  // [1, 3, h, w] uint8 in the channels-last layout torchvision gives a single image
  torch::Tensor x = torch::from_blob(const_cast<std::uint8_t*>(image.rgb.data()), {1, h, w, 3}, torch::kUInt8)
                        .permute({0, 3, 1, 2});
  // transformers' get_resize_output_image_size(default_to_square=False)
  const std::int64_t shorter = std::min(h, w), longer = std::max(h, w);
  const auto new_long = static_cast<std::int64_t>(static_cast<double>(s * longer) / static_cast<double>(shorter));
  const std::int64_t nh = w <= h ? new_long : s, nw = w <= h ? s : new_long;
  if (nh != h || nw != w) x = at::_upsample_bicubic2d_aa(x, {nh, nw}, /*align_corners=*/false);  // uint8 in, uint8 out
  const auto top = static_cast<std::int64_t>(static_cast<double>(nh - s) / 2.0);
  const auto left = static_cast<std::int64_t>(static_cast<double>(nw - s) / 2.0);
  x = x.slice(2, top, top + s).slice(3, left, left + s);
  // the fused rescale + normalise: mean and std times 1 / (1 / 255), in float32
  const double to_255 = 1.0 / (1.0 / 255.0);
  const torch::Tensor m = torch::tensor({mean[0], mean[1], mean[2]}, torch::kFloat32).mul(to_255).view({1, 3, 1, 1});
  const torch::Tensor d = torch::tensor({std[0], std[1], std[2]}, torch::kFloat32).mul(to_255).view({1, 3, 1, 1});
  return x.to(torch::kFloat32).sub_(m).div_(d).contiguous();
}

}  // namespace sdxl
