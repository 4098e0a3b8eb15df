// The weights regions give each attention grid (pipeline/region_weights.h): a box's cells by their
// centres, a mask's area average, the task's prompt at region_base inside regions, normalisation,
// padding rows, and a reference's mask as diffusers' IPAdapterMaskProcessor.downsample makes it.
// Against diffusers itself: tests/parity/parity_regions.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "image/png_writer.h"
#include "pipeline/region_weights.h"

namespace {

sdxl::RegionUse box(double x0, double y0, double x1, double y1, double weight = 1.0) {
  sdxl::RegionUse r;
  r.x0 = x0, r.y0 = y0, r.x1 = x1, r.y1 = y1;
  r.weight = weight;
  return r;
}

}  // namespace

TEST(RegionWeights, GridSidesRoundUpAtEachHalving) {
  EXPECT_EQ(sdxl::attention_grid_side(8, 1), 8);
  EXPECT_EQ(sdxl::attention_grid_side(7, 2), 4);
  EXPECT_EQ(sdxl::attention_grid_side(7, 4), 2);
  EXPECT_EQ(sdxl::attention_grid_side(128, 4), 32);
}

TEST(RegionWeights, BoxesWeighTheirCellsAndTheTaskKeepsRegionBase) {
  sdxl::GenerationParams p;
  p.region_base = 0.2;
  p.regions = {box(0, 0, 0.5, 1)};
  // A latent of 8 x 8: grids of 4 x 4 (downscale 2) and 2 x 2 (downscale 4); 4 prompt rows (2 padding).
  const auto w = sdxl::region_prompt_weights(p, {2, 4}, 8, 8, 4);
  ASSERT_EQ(w.size(), 2u);
  ASSERT_EQ(w[0].sizes(), (std::vector<std::int64_t>{4, 16}));
  for (int cell = 0; cell < 16; ++cell) {
    const bool inside = cell % 4 < 2;  // centres 0.125 and 0.375 are left of 0.5
    EXPECT_NEAR(w[0][0][cell].item<float>(), inside ? 0.2 / 1.2 : 1.0, 1e-6) << cell;
    EXPECT_NEAR(w[0][1][cell].item<float>(), inside ? 1.0 / 1.2 : 0.0, 1e-6) << cell;
    EXPECT_EQ(w[0][2][cell].item<float>(), 0.f);
    EXPECT_EQ(w[0][3][cell].item<float>(), 0.f);
  }
  EXPECT_TRUE(torch::allclose(w[1].sum(0), torch::ones({4})));
  // A box edge on a cell's centre: x0 <= cx holds, cx < x1 does not.
  p.regions = {box(0.375, 0, 0.625, 1)};
  const auto e = sdxl::region_prompt_weights(p, {2}, 8, 8, 2);
  EXPECT_GT(e[0][1][1].item<float>(), 0.f);   // centre 0.375
  EXPECT_EQ(e[0][1][2].item<float>(), 0.f);   // centre 0.625
}

TEST(RegionWeights, OverlapsShareByWeightAndNoRegionsMeansOnePrompt) {
  sdxl::GenerationParams p;
  p.region_base = 0;
  p.regions = {box(0, 0, 1, 1, 1.0), box(0, 0, 1, 1, 3.0)};
  const auto w = sdxl::region_prompt_weights(p, {1}, 2, 2, 3);
  EXPECT_NEAR(w[0][0][0].item<float>(), 0.0, 1e-7);
  EXPECT_NEAR(w[0][1][0].item<float>(), 0.25, 1e-7);
  EXPECT_NEAR(w[0][2][0].item<float>(), 0.75, 1e-7);
  sdxl::GenerationParams plain;
  const auto one = sdxl::region_prompt_weights(plain, {2}, 8, 8, 3);
  EXPECT_TRUE(torch::equal(one[0][0], torch::ones({16})));
  EXPECT_TRUE(torch::equal(one[0][1], torch::zeros({16})));
}

TEST(RegionWeights, MasksAreAreaAveragedAndReferencesFollowDiffusersDownsample) {
  const auto path = std::filesystem::temp_directory_path() / ("sdxl-rw-" + std::to_string(::getpid()) + ".png");
  std::vector<std::uint8_t> rgb(16 * 16 * 3, 0);
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 4; ++x)
      for (int c = 0; c < 3; ++c) rgb[static_cast<size_t>((y * 16 + x) * 3 + c)] = 255;  // the left quarter
  sdxl::write_png(path, 16, 16, 3, rgb.data(), {});
  sdxl::GenerationParams p;
  p.region_base = 1;  // the task's prompt keeps weight 1: the region's share is m / (1 + m)
  sdxl::RegionUse m;
  m.mask = path.string();
  p.regions = {m};
  const auto w = sdxl::region_prompt_weights(p, {4}, 8, 8, 2);  // 2 x 2 grid: the left cells half covered
  EXPECT_NEAR(w[0][1][0].item<float>(), 0.5 / 1.5, 1e-6);
  EXPECT_NEAR(w[0][1][1].item<float>(), 0.0, 1e-7);

  const torch::Tensor px = sdxl::reference_pixel_mask(&p.regions[0], 32, 32);  // Lanczos to 32 x 32, binarised
  EXPECT_EQ(px.sizes(), (std::vector<std::int64_t>{32, 32}));
  EXPECT_EQ(px.index({0, 7}).item<float>(), 1.f);
  EXPECT_EQ(px.index({0, 8}).item<float>(), 0.f);
  const torch::Tensor whole = sdxl::downsample_reference_mask(sdxl::reference_pixel_mask(nullptr, 32, 48), 24);
  EXPECT_TRUE(torch::allclose(whole, torch::ones({24})));
  // diffusers: mask_h = int(sqrt(24 / (48 / 32))) = 4, 24 % 4 == 0 -> 4 x 6.
  const sdxl::RegionUse left = box(0, 0, 0.5, 1);
  const torch::Tensor half = sdxl::downsample_reference_mask(sdxl::reference_pixel_mask(&left, 48, 32), 24);
  EXPECT_NEAR(half[0].item<float>(), 1.0, 1e-5);
  EXPECT_NEAR(half[5].item<float>(), 0.0, 1e-5);
  std::filesystem::remove(path);
}
