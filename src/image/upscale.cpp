#include "image/upscale.h"

#include <torch/script.h>

#include <algorithm>

#include "core/error.h"

namespace sdxl {

bool is_latent_upscaler(const std::string& name) { return name.rfind("Latent", 0) == 0; }

torch::Tensor upscale_latents(const torch::Tensor& latents, int64_t out_h, int64_t out_w, const std::string& upscaler) {
  const std::vector<int64_t> size = {out_h, out_w};
  const torch::Tensor x = latents;
  if (upscaler == "Latent") return at::upsample_bilinear2d(x, size, /*align_corners=*/false);
  if (upscaler == "Latent (antialiased)") return at::_upsample_bilinear2d_aa(x, size, /*align_corners=*/false);
  if (upscaler == "Latent (bicubic)") return at::upsample_bicubic2d(x, size, /*align_corners=*/false);
  if (upscaler == "Latent (bicubic antialiased)") return at::_upsample_bicubic2d_aa(x, size, /*align_corners=*/false);
  if (upscaler == "Latent (nearest)") return at::upsample_nearest2d(x, size);
  if (upscaler == "Latent (nearest-exact)") return at::_upsample_nearest_exact2d(x, size);
  throw UsageError("'" + upscaler + "' is not a latent-space upscaler");
}

std::vector<std::uint8_t> resize_nearest_rgb8(const std::uint8_t* rgb, int width, int height, int out_w, int out_h) {
  std::vector<std::uint8_t> out(static_cast<size_t>(out_w) * static_cast<size_t>(out_h) * 3);
  const double sx = static_cast<double>(width) / out_w, sy = static_cast<double>(height) / out_h;
  for (int y = 0; y < out_h; ++y) {
    const int src_y = std::min(static_cast<int>((y + 0.5) * sy), height - 1);
    for (int x = 0; x < out_w; ++x) {
      const int src_x = std::min(static_cast<int>((x + 0.5) * sx), width - 1);
      const std::uint8_t* s = rgb + (static_cast<size_t>(src_y) * static_cast<size_t>(width) + static_cast<size_t>(src_x)) * 3;
      std::uint8_t* d = out.data() + (static_cast<size_t>(y) * static_cast<size_t>(out_w) + static_cast<size_t>(x)) * 3;
      std::copy(s, s + 3, d);
    }
  }
  return out;
}

}  // namespace sdxl
