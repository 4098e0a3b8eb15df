// Tiled VAE decode on the tiny model (CPU): tile placement, agreement with
// the whole decode, and no seam along the tile borders.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "image/vae_decode.h"
#include "model/sdxl_model.h"
#include "core/error.h"

namespace fs = std::filesystem;

TEST(VaeTiling, TileStartsCoverEverySide) {
  EXPECT_EQ(sdxl::tile_starts(32, 64, 16), (std::vector<int64_t>{0}));
  EXPECT_EQ(sdxl::tile_starts(64, 64, 16), (std::vector<int64_t>{0}));
  EXPECT_EQ(sdxl::tile_starts(128, 64, 16), (std::vector<int64_t>{0, 48, 64}));
  EXPECT_EQ(sdxl::tile_starts(152, 64, 16), (std::vector<int64_t>{0, 48, 88}));
  EXPECT_EQ(sdxl::tile_starts(32, 16, 4), (std::vector<int64_t>{0, 12, 16}));
  EXPECT_THROW(sdxl::tile_starts(32, 8, 8), sdxl::UsageError);
}

TEST(VaeTiling, TiledDecodeIsCloseToTheWholeOneWithoutSeams) {
  const char* fixtures = std::getenv("SDXL_FIXTURES_DIR");
  if (!fixtures) GTEST_SKIP() << "SDXL_FIXTURES_DIR is not set (run through ctest)";
  at::set_num_threads(1);
  c10::InferenceMode guard;
  const sdxl::ModelConfig cfg = sdxl::load_model_config(fs::path(fixtures) / "tiny-model");
  auto model = sdxl::SdxlModel::load(cfg, torch::Device(torch::kCPU), "");
  // Smooth latents (like a sampled image's), 48x40 latent pixels = 384x320 px.
  torch::manual_seed(3);
  torch::Tensor z = torch::randn({1, 4, 6, 5});
  z = at::upsample_bilinear2d(z, {48, 40}, false) * 3.0;
  const torch::Tensor whole = sdxl::vae_decode_image(*model, z);
  const sdxl::TileGrid grid{32, 12};
  const torch::Tensor tiled = sdxl::vae_decode_image_tiled(*model, z, grid);
  ASSERT_EQ(whole.sizes(), tiled.sizes());
  // Agreement in the 8-bit image: PSNR over [0, 255].
  const torch::Tensor a = (whole / 2 + 0.5).clamp(0, 1) * 255, b = (tiled / 2 + 0.5).clamp(0, 1) * 255;
  const double mse = (a - b).pow(2).mean().item<double>();
  const double psnr = 10 * std::log10(255.0 * 255.0 / std::max(mse, 1e-12));
  RecordProperty("psnr_db", std::to_string(psnr));
  std::printf("tiled vs whole decode: PSNR %.1f dB, max diff %.1f levels\n", psnr, (a - b).abs().max().item<double>());
  EXPECT_GT(psnr, 25.0);
  // Seams: the jump between neighbouring rows/columns at the tile borders is
  // no larger than typical for the tiled image itself (a hard seam would be).
  auto step_at = [&](const torch::Tensor& img, int dim, int64_t pos) {
    return (img.select(dim, pos) - img.select(dim, pos - 1)).abs().mean().item<double>();
  };
  const auto ys = sdxl::tile_starts(48, grid.tile, grid.overlap), xs = sdxl::tile_starts(40, grid.tile, grid.overlap);
  const double typical_y = (b.slice(2, 1) - b.slice(2, 0, -1)).abs().mean().item<double>();
  const double typical_x = (b.slice(3, 1) - b.slice(3, 0, -1)).abs().mean().item<double>();
  for (size_t i = 1; i < ys.size(); ++i) {
    for (int64_t edge : {ys[i] * 8, (ys[i - 1] + grid.tile) * 8}) {
      if (edge <= 0 || edge >= 48 * 8) continue;
      EXPECT_LT(step_at(b, 2, edge), 2.5 * typical_y + 0.5) << "row " << edge;
    }
  }
  for (size_t i = 1; i < xs.size(); ++i) {
    for (int64_t edge : {xs[i] * 8, (xs[i - 1] + grid.tile) * 8}) {
      if (edge <= 0 || edge >= 40 * 8) continue;
      EXPECT_LT(step_at(b, 3, edge), 2.5 * typical_x + 0.5) << "column " << edge;
    }
  }
  // A single tile covering everything is exactly the whole decode.
  const torch::Tensor one = sdxl::vae_decode_image_tiled(*model, z, sdxl::TileGrid{64, 16});
  EXPECT_TRUE(torch::equal(one, whole));
}
