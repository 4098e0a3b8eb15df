#include "image/mask.h"

#include <algorithm>
#include <cmath>

#include "image/resize.h"

namespace sdxl {
namespace {

// Pillow BoxBlur.c _gaussian_blur_radius: the box radius (in float, as the C)
// whose `passes` box blurs have the asked standard deviation.
float box_radius(float radius, int passes) {
  const float sigma2 = radius * radius / static_cast<float>(passes);
  const auto big_l = static_cast<float>(std::sqrt(12.0 * sigma2 + 1.0));
  const auto l = static_cast<float>(std::floor((big_l - 1.0) / 2.0));
  float a = (2 * l + 1) * (l * (l + 1) - 3 * sigma2);
  a /= 6 * (sigma2 - (l + 1) * (l + 1));
  return l + a;
}

// Pillow ImagingLineBoxBlur8 on one channel: `n` values `stride` apart.
// Unsigned 32-bit sums as the C (its wrap-around included).
void box_blur_line(const std::uint8_t* in, std::uint8_t* out, int n, int stride, int radius, std::uint32_t ww,
                   std::uint32_t fw) {
  const int lastx = n - 1;
  const int edge_a = std::min(radius + 1, n), edge_b = std::max(n - radius - 1, 0);
  const auto px = [&](int i) { return static_cast<std::uint32_t>(in[static_cast<std::ptrdiff_t>(i) * stride]); };
  std::uint32_t acc = px(0) * static_cast<std::uint32_t>(radius + 1);
  for (int x = 0; x < edge_a - 1; ++x) acc += px(x);
  acc += px(lastx) * static_cast<std::uint32_t>(radius - edge_a + 1);
  const auto step = [&](int x, int subtract, int add, int left, int right) {
    acc += px(add) - px(subtract);
    const std::uint32_t bulk = acc * ww + (px(left) + px(right)) * fw;
    out[static_cast<std::ptrdiff_t>(x) * stride] = static_cast<std::uint8_t>((bulk + (1u << 23)) >> 24);
  };
  if (edge_a <= edge_b) {
    for (int x = 0; x < edge_a; ++x) step(x, 0, x + radius, 0, x + radius + 1);
    for (int x = edge_a; x < edge_b; ++x) step(x, x - radius - 1, x + radius, x - radius - 1, x + radius + 1);
    for (int x = edge_b; x <= lastx; ++x) step(x, x - radius - 1, lastx, x - radius - 1, lastx);
  } else {
    for (int x = 0; x < edge_b; ++x) step(x, 0, x + radius, 0, x + radius + 1);
    for (int x = edge_b; x < edge_a; ++x) step(x, 0, lastx, 0, lastx);
    for (int x = edge_a; x <= lastx; ++x) step(x, x - radius - 1, lastx, x - radius - 1, lastx);
  }
}

// `passes` box blurs of every line of `lines` lines of `n` values per channel
// (row step `line_step`, value step `stride`), in place through a scratch line.
void box_blur_lines(std::vector<std::uint8_t>& img, int lines, int n, std::ptrdiff_t line_step, int stride,
                    float float_radius, int passes) {
  const int radius = static_cast<int>(float_radius);
  const auto ww = static_cast<std::uint32_t>(static_cast<float>(1u << 24) / (float_radius * 2 + 1));
  const std::uint32_t fw = ((1u << 24) - static_cast<std::uint32_t>(radius * 2 + 1) * ww) / 2;
  std::vector<std::uint8_t> line(static_cast<size_t>(n)), out(static_cast<size_t>(n));
  for (int y = 0; y < lines; ++y)
    for (int c = 0; c < 3; ++c) {
      std::uint8_t* base = img.data() + y * line_step + c;
      for (int x = 0; x < n; ++x) line[static_cast<size_t>(x)] = base[static_cast<std::ptrdiff_t>(x) * stride];
      for (int k = 0; k < passes; ++k) {
        box_blur_line(line.data(), out.data(), n, 1, radius, ww, fw);
        line.swap(out);
      }
      for (int x = 0; x < n; ++x) base[static_cast<std::ptrdiff_t>(x) * stride] = line[static_cast<size_t>(x)];
    }
}

}  // namespace

std::vector<std::uint8_t> gaussian_blur_rgb8(const std::uint8_t* rgb, int width, int height, double radius) {
  std::vector<std::uint8_t> img(rgb, rgb + static_cast<size_t>(width) * height * 3);
  if (radius <= 0) return img;
  constexpr int kPasses = 3;  // ImagingGaussianBlur's
  const float r = box_radius(static_cast<float>(radius), kPasses);
  box_blur_lines(img, height, width, static_cast<std::ptrdiff_t>(width) * 3, 3, r, kPasses);  // rows
  box_blur_lines(img, width, height, 3, width * 3, r, kPasses);                               // columns
  return img;
}

std::vector<std::uint8_t> grey_of_rgb8(const std::uint8_t* rgb, int width, int height) {
  std::vector<std::uint8_t> grey(static_cast<size_t>(width) * height);
  for (size_t i = 0; i < grey.size(); ++i) {
    const std::uint32_t r = rgb[3 * i], g = rgb[3 * i + 1], b = rgb[3 * i + 2];
    grey[i] = static_cast<std::uint8_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
  }
  return grey;
}

std::vector<float> inpaint_latent_mask(const RgbImage& mask, int blur, int width, int height, int down) {
  std::vector<std::uint8_t> rgb = gaussian_blur_rgb8(mask.rgb.data(), mask.width, mask.height, blur);
  if (mask.width != width || mask.height != height)
    rgb = resize_lanczos_rgb8(rgb.data(), mask.width, mask.height, width, height);
  const std::vector<std::uint8_t> grey = grey_of_rgb8(rgb.data(), width, height);
  const int lw = width / down, lh = height / down;
  std::vector<float> out(static_cast<size_t>(lw) * lh);
  // interpolate(mode="nearest"): source index floor(dst * in / out).
  const double sx = static_cast<double>(width) / lw, sy = static_cast<double>(height) / lh;
  for (int y = 0; y < lh; ++y)
    for (int x = 0; x < lw; ++x) {
      const int iy = std::min(static_cast<int>(std::floor(y * sy)), height - 1);
      const int ix = std::min(static_cast<int>(std::floor(x * sx)), width - 1);
      out[static_cast<size_t>(y) * lw + x] = grey[static_cast<size_t>(iy) * width + ix] / 255.0f >= 0.5f ? 1.0f : 0.0f;
    }
  return out;
}

bool mask_marks_anything(const RgbImage& mask) {
  const std::vector<std::uint8_t> grey = grey_of_rgb8(mask.rgb.data(), mask.width, mask.height);
  return std::any_of(grey.begin(), grey.end(), [](std::uint8_t v) { return v / 255.0f >= 0.5f; });
}

}  // namespace sdxl
