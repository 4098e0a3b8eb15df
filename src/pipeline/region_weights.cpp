#include "pipeline/region_weights.h"

#include <torch/nn/functional/pooling.h>
#include <torch/nn/functional/upsampling.h>

#include <algorithm>
#include <cmath>

#include "image/mask.h"
#include "image/png_reader.h"
#include "image/resize.h"

namespace sdxl {

std::int64_t attention_grid_side(std::int64_t n, int downscale) {
  for (; downscale > 1; downscale /= 2) n = (n + 1) / 2;
  return n;
}

namespace {

// A mask PNG's grey levels / 255, [1, 1, H, W] float32 (PIL's convert("L")).
torch::Tensor mask_levels(const std::string& path) {
  const RgbImage img = read_png_rgb(path, "region mask");
  std::vector<std::uint8_t> grey = grey_of_rgb8(img.rgb.data(), img.width, img.height);
  return torch::from_blob(grey.data(), {1, 1, img.height, img.width}, torch::kUInt8).to(torch::kFloat32) / 255.0;
}

// Region r's coverage of each cell of a gh x gw grid, [gh * gw]; `levels`: its mask's (mask_levels).
torch::Tensor region_cover(const RegionUse& r, const torch::Tensor& levels, std::int64_t gh, std::int64_t gw) {
  if (!r.mask.empty()) {
    namespace F = torch::nn::functional;
    return F::adaptive_avg_pool2d(levels, F::AdaptiveAvgPool2dFuncOptions({gh, gw})).reshape({-1});
  }
  const torch::Tensor cy = (torch::arange(gh, torch::kFloat64) + 0.5) / static_cast<double>(gh);
  const torch::Tensor cx = (torch::arange(gw, torch::kFloat64) + 0.5) / static_cast<double>(gw);
  const torch::Tensor in_y = (cy >= r.y0).logical_and(cy < r.y1).unsqueeze(1);
  const torch::Tensor in_x = (cx >= r.x0).logical_and(cx < r.x1).unsqueeze(0);
  return in_y.logical_and(in_x).to(torch::kFloat32).reshape({-1});
}

}  // namespace

std::vector<torch::Tensor> region_prompt_weights(const GenerationParams& p, const std::vector<int>& downscales,
                                                 std::int64_t latent_h, std::int64_t latent_w, std::int64_t prompts) {
  std::vector<torch::Tensor> levels;  // each mask read once for every grid
  for (const RegionUse& r : p.regions) levels.push_back(r.mask.empty() ? torch::Tensor() : mask_levels(r.mask));
  std::vector<torch::Tensor> out;
  for (const int d : downscales) {
    const std::int64_t gh = attention_grid_side(latent_h, d), gw = attention_grid_side(latent_w, d);
    torch::Tensor w = torch::zeros({prompts, gh * gw}, torch::kFloat32);
    if (p.regions.empty()) {
      w[0].fill_(1.0);
      out.push_back(w);
      continue;
    }
    torch::Tensor most = torch::zeros({gh * gw}, torch::kFloat32);
    for (size_t i = 0; i < p.regions.size(); ++i) {
      const torch::Tensor m = region_cover(p.regions[i], levels[i], gh, gw);
      w[static_cast<std::int64_t>(i) + 1] = m * p.regions[i].weight;
      most = torch::maximum(most, m);
    }
    w[0] = 1.0 - (1.0 - p.region_base) * most;
    out.push_back(w / w.sum(0, /*keepdim=*/true));
  }
  return out;
}

torch::Tensor reference_pixel_mask(const RegionUse* region, int width, int height) {
  if (!region) return torch::ones({height, width}, torch::kFloat32);
  if (region->mask.empty()) {
    const torch::Tensor cy = (torch::arange(height, torch::kFloat64) + 0.5) / static_cast<double>(height);
    const torch::Tensor cx = (torch::arange(width, torch::kFloat64) + 0.5) / static_cast<double>(width);
    const torch::Tensor in_y = (cy >= region->y0).logical_and(cy < region->y1).unsqueeze(1);
    const torch::Tensor in_x = (cx >= region->x0).logical_and(cx < region->x1).unsqueeze(0);
    return in_y.logical_and(in_x).to(torch::kFloat32);
  }
  // VaeImageProcessor (IPAdapterMaskProcessor): grey, PIL Lanczos to the panel, / 255, binarised at 0.5.
  const RgbImage img = read_png_rgb(region->mask, "region mask");
  const std::vector<std::uint8_t> grey = grey_of_rgb8(img.rgb.data(), img.width, img.height);
  std::vector<std::uint8_t> rgb(grey.size() * 3);
  for (size_t k = 0; k < grey.size(); ++k) rgb[3 * k] = rgb[3 * k + 1] = rgb[3 * k + 2] = grey[k];
  const std::vector<std::uint8_t> sized =
      img.width == width && img.height == height ? rgb : resize_lanczos_rgb8(rgb.data(), img.width, img.height, width, height);
  torch::Tensor levels = torch::from_blob(const_cast<std::uint8_t*>(sized.data()), {height, width, 3}, torch::kUInt8)
                             .select(2, 0)
                             .to(torch::kFloat32) /
                         255.0;
  return (levels >= 0.5).to(torch::kFloat32);
}

torch::Tensor downsample_reference_mask(const torch::Tensor& pixel_mask, std::int64_t tokens) {
  const double ratio = static_cast<double>(pixel_mask.size(1)) / static_cast<double>(pixel_mask.size(0));
  std::int64_t mask_h = static_cast<std::int64_t>(std::sqrt(static_cast<double>(tokens) / ratio));
  mask_h = mask_h + (tokens % mask_h != 0 ? 1 : 0);
  const std::int64_t mask_w = tokens / mask_h;
  namespace F = torch::nn::functional;
  torch::Tensor small = F::interpolate(pixel_mask.unsqueeze(0).unsqueeze(0),
                                       F::InterpolateFuncOptions()
                                           .size(std::vector<std::int64_t>{mask_h, mask_w})
                                           .mode(torch::kBicubic)
                                           .align_corners(false))
                            .reshape({-1});
  if (small.size(0) < tokens) return torch::cat({small, torch::zeros({tokens - small.size(0)}, small.options())});
  return small.slice(0, 0, tokens);
}

}  // namespace sdxl
