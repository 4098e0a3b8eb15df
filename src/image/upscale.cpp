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

}  // namespace sdxl
