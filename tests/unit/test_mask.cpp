#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "image/mask.h"

namespace {

// A 13x7 RGB pattern; the expected values are PIL 12's
// Image.filter(ImageFilter.GaussianBlur(r)) of the same pixels (every 17th byte, and the byte sum).
std::vector<std::uint8_t> pattern(int w, int h) {
  std::vector<std::uint8_t> a(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      std::uint8_t* p = &a[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = static_cast<std::uint8_t>((x * 37 + y * 11) % 256);
      p[1] = static_cast<std::uint8_t>((x * x * 5 + y * 29) % 256);
      p[2] = (x > 4 && x < 9 && y > 1) ? 255 : 0;
    }
  return a;
}

void expect_pil(double radius, const std::vector<int>& every17, long sum) {
  const std::vector<std::uint8_t> in = pattern(13, 7);
  const std::vector<std::uint8_t> out = sdxl::gaussian_blur_rgb8(in.data(), 13, 7, radius);
  std::vector<int> got;
  for (size_t i = 0; i < out.size(); i += 17) got.push_back(out[i]);
  EXPECT_EQ(got, every17) << "radius " << radius;
  EXPECT_EQ(std::accumulate(out.begin(), out.end(), 0L), sum) << "radius " << radius;
}

}  // namespace

TEST(Mask, GaussianBlurMatchesPil) {
  expect_pil(1, {19, 12, 151, 158, 22, 83, 76, 0, 119, 205, 75, 122, 164, 179, 171, 79, 0}, 27908);
  expect_pil(4, {85, 46, 135, 110, 47, 109, 140, 27, 126, 162, 59, 127, 113, 71, 132, 142, 50}, 27358);
  expect_pil(2.5, {64, 50, 138, 121, 49, 99, 128, 7, 132, 172, 83, 121, 127, 115, 150, 133, 25}, 27886);
  const std::vector<std::uint8_t> in = pattern(13, 7);
  EXPECT_EQ(sdxl::gaussian_blur_rgb8(in.data(), 13, 7, 0), in);  // 0 = no blur
}

TEST(Mask, LatentMaskIsBinarisedAtHalfAndNearestSampled) {
  sdxl::RgbImage m{16, 8, std::vector<std::uint8_t>(16 * 8 * 3, 0)};
  for (int y = 0; y < 8; ++y)
    for (int x = 0; x < 16; ++x) {
      const std::uint8_t v = x < 8 ? 127 : 128;  // 127 / 255 < 0.5 <= 128 / 255
      for (int c = 0; c < 3; ++c) m.rgb[(static_cast<size_t>(y) * 16 + x) * 3 + c] = v;
    }
  const std::vector<float> lat = sdxl::inpaint_latent_mask(m, 0, 16, 8, 8);
  EXPECT_EQ(lat, (std::vector<float>{0, 1}));
  EXPECT_TRUE(sdxl::mask_marks_anything(m));
  std::fill(m.rgb.begin(), m.rgb.end(), 127);
  EXPECT_FALSE(sdxl::mask_marks_anything(m));
}

TEST(Mask, PixelMaskIsWhatTheLatentMaskSamples) {
  sdxl::RgbImage m{16, 8, std::vector<std::uint8_t>(16 * 8 * 3, 0)};
  for (int y = 0; y < 8; ++y)
    for (int x = 8; x < 16; ++x)  // the right latent cell samples pixel 8 (nearest: floor(1 * 16 / 2))
      for (int c = 0; c < 3; ++c) m.rgb[(static_cast<size_t>(y) * 16 + x) * 3 + c] = 200;
  const std::vector<std::uint8_t> px = sdxl::inpaint_pixel_mask(m, 0, 16, 8);
  ASSERT_EQ(px.size(), 16u * 8u);
  EXPECT_EQ(px[0], 0);
  EXPECT_EQ(px[10], 1);  // 200 / 255 >= 0.5: repainted (0 in the masked image)
  EXPECT_EQ(sdxl::latent_mask_of_pixels(px, 16, 8, 8), sdxl::inpaint_latent_mask(m, 0, 16, 8, 8));
  EXPECT_EQ(sdxl::latent_mask_of_pixels(px, 16, 8, 8), (std::vector<float>{0, 1}));
}

TEST(Mask, ABlurThatFadesASpeckLeavesNothingToRepaint) {
  sdxl::RgbImage m{64, 64, std::vector<std::uint8_t>(64 * 64 * 3, 0)};
  for (int c = 0; c < 3; ++c) m.rgb[(30 * 64 + 30) * 3 + c] = 255;  // one white pixel
  EXPECT_TRUE(sdxl::mask_marks_anything(m));
  EXPECT_FALSE(sdxl::mask_survives_blur(m, 8, false, 32, 64, 64, 8));
  EXPECT_FALSE(sdxl::mask_survives_blur(m, 8, true, 32, 64, 64, 8));
  for (int y = 16; y < 48; ++y)
    for (int x = 16; x < 48; ++x)
      for (int c = 0; c < 3; ++c) m.rgb[(static_cast<size_t>(y) * 64 + x) * 3 + c] = 255;
  EXPECT_TRUE(sdxl::mask_survives_blur(m, 8, false, 32, 64, 64, 8));
  EXPECT_TRUE(sdxl::mask_survives_blur(m, 8, true, 8, 64, 64, 8));
}
