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

std::vector<std::uint8_t> inpaint_pixel_mask(const RgbImage& mask, int blur, int width, int height) {
  std::vector<std::uint8_t> rgb = gaussian_blur_rgb8(mask.rgb.data(), mask.width, mask.height, blur);
  if (mask.width != width || mask.height != height)
    rgb = resize_lanczos_rgb8(rgb.data(), mask.width, mask.height, width, height);
  std::vector<std::uint8_t> grey = grey_of_rgb8(rgb.data(), width, height);
  for (std::uint8_t& v : grey) v = v / 255.0f >= 0.5f ? 1 : 0;
  return grey;
}

std::vector<float> latent_mask_of_pixels(const std::vector<std::uint8_t>& pixels, int width, int height, int down) {
  const int lw = width / down, lh = height / down;
  std::vector<float> out(static_cast<size_t>(lw) * lh);
  // interpolate(mode="nearest"): source index floor(dst * in / out).
  const double sx = static_cast<double>(width) / lw, sy = static_cast<double>(height) / lh;
  for (int y = 0; y < lh; ++y)
    for (int x = 0; x < lw; ++x) {
      const int iy = std::min(static_cast<int>(std::floor(y * sy)), height - 1);
      const int ix = std::min(static_cast<int>(std::floor(x * sx)), width - 1);
      out[static_cast<size_t>(y) * lw + x] = pixels[static_cast<size_t>(iy) * width + ix] ? 1.0f : 0.0f;
    }
  return out;
}

std::vector<float> inpaint_latent_mask(const RgbImage& mask, int blur, int width, int height, int down) {
  return latent_mask_of_pixels(inpaint_pixel_mask(mask, blur, width, height), width, height, down);
}

bool mask_marks_anything(const RgbImage& mask) {
  const std::vector<std::uint8_t> grey = grey_of_rgb8(mask.rgb.data(), mask.width, mask.height);
  return std::any_of(grey.begin(), grey.end(), [](std::uint8_t v) { return v / 255.0f >= 0.5f; });
}

namespace {

// One axis of get_crop_region's step 3: grow [lo, hi) by `diff`, half before,
// then shift it back inside [0, size).
void grow_axis(int& lo, int& hi, int diff, int size) {
  lo -= diff / 2;
  hi += diff - diff / 2;
  if (hi >= size) {
    const int over = hi - size;
    hi -= over;
    lo -= over;
  }
  if (lo < 0) {
    hi -= lo;
    lo = 0;
  }
  if (hi >= size) hi = size;
}

// PIL's paste of `src` into `dst` at (x0, y0), clipped.
void paste_rgb8(std::vector<std::uint8_t>& dst, int dw, int dh, const std::vector<std::uint8_t>& src, int sw, int sh,
                int x0, int y0) {
  for (int y = std::max(0, -y0); y < sh && y + y0 < dh; ++y)
    for (int x = std::max(0, -x0); x < sw && x + x0 < dw; ++x)
      std::copy_n(&src[(static_cast<size_t>(y) * sw + x) * 3], 3,
                  &dst[(static_cast<size_t>(y + y0) * dw + x + x0) * 3]);
}

std::uint32_t div255(std::uint32_t v) { return (v + 128 + ((v + 128) >> 8)) >> 8; }  // PIL's DIV255, rounded

}  // namespace

CropBox mask_crop_region(const std::vector<std::uint8_t>& grey, int w, int h, int width, int height, int pad) {
  int left = w, right = -1, top = h, bottom = -1;  // the non-zero pixels' extent
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      if (grey[static_cast<size_t>(y) * w + x] != 0) {
        left = std::min(left, x);
        right = std::max(right, x);
        top = std::min(top, y);
        bottom = std::max(bottom, y);
      }
  if (right < 0) return {0, 0, w, h};  // nothing marked: the whole image (get_crop_region's loops run out)
  CropBox b{std::max(left - pad, 0), std::max(top - pad, 0), std::min(right + 1 + pad, w),
            std::min(bottom + 1 + pad, h)};
  const double ratio_crop = static_cast<double>(b.width()) / b.height();
  const double ratio = static_cast<double>(width) / height;
  if (ratio_crop > ratio) {
    const double desired_h = b.width() / ratio;
    grow_axis(b.y1, b.y2, static_cast<int>(desired_h - b.height()), h);
  } else {
    const double desired_w = b.height() * ratio;
    grow_axis(b.x1, b.x2, static_cast<int>(desired_w - b.width()), w);
  }
  return b;
}

std::vector<std::uint8_t> crop_rgb8(const std::uint8_t* rgb, int w, const CropBox& box) {
  std::vector<std::uint8_t> out(static_cast<size_t>(box.width()) * box.height() * 3);
  for (int y = 0; y < box.height(); ++y)
    std::copy_n(rgb + (static_cast<size_t>(y + box.y1) * w + box.x1) * 3, static_cast<size_t>(box.width()) * 3,
                &out[static_cast<size_t>(y) * box.width() * 3]);
  return out;
}

std::vector<std::uint8_t> resize_and_fill_rgb8(const std::uint8_t* rgb, int w, int h, int out_w, int out_h) {
  const double ratio = static_cast<double>(out_w) / out_h, src_ratio = static_cast<double>(w) / h;
  const int src_w = ratio < src_ratio ? out_w : w * out_h / h;
  const int src_h = ratio >= src_ratio ? out_h : h * out_w / w;
  const std::vector<std::uint8_t> resized = (src_w == w && src_h == h)
                                                ? std::vector<std::uint8_t>(rgb, rgb + static_cast<size_t>(w) * h * 3)
                                                : resize_lanczos_rgb8(rgb, w, h, src_w, src_h);
  std::vector<std::uint8_t> out(static_cast<size_t>(out_w) * out_h * 3, 0);
  const int x0 = out_w / 2 - src_w / 2, y0 = out_h / 2 - src_h / 2;
  paste_rgb8(out, out_w, out_h, resized, src_w, src_h, x0, y0);
  for (int y = 0; y < out_h; ++y)
    for (int x = 0; x < out_w; ++x) {
      const int sx = std::clamp(x - x0, 0, src_w - 1), sy = std::clamp(y - y0, 0, src_h - 1);
      if (sx == x - x0 && sy == y - y0) continue;
      std::copy_n(&resized[(static_cast<size_t>(sy) * src_w + sx) * 3], 3, &out[(static_cast<size_t>(y) * out_w + x) * 3]);
    }
  return out;
}

std::vector<std::uint8_t> overlay_inpainted_rgb8(const RgbImage& init, const std::vector<std::uint8_t>& mask_grey,
                                                 const std::uint8_t* inpainted, int width, int height,
                                                 const CropBox& box) {
  // resize_mode "crop" (_resize_and_crop): cover the box, keep the centre.
  const int w = box.width(), h = box.height();
  const double ratio = static_cast<double>(w) / h, src_ratio = static_cast<double>(width) / height;
  const int src_w = ratio > src_ratio ? w : width * h / height;
  const int src_h = ratio <= src_ratio ? h : height * w / width;
  const std::vector<std::uint8_t> resized = resize_lanczos_rgb8(inpainted, width, height, src_w, src_h);
  std::vector<std::uint8_t> fitted(static_cast<size_t>(w) * h * 3, 0);
  paste_rgb8(fitted, w, h, resized, src_w, src_h, w / 2 - src_w / 2, h / 2 - src_h / 2);
  std::vector<std::uint8_t> base(static_cast<size_t>(init.width) * init.height * 3, 0);
  paste_rgb8(base, init.width, init.height, fitted, w, h, box.x1, box.y1);
  // The init image premultiplied by alpha = 255 - mask (an RGBa paste onto
  // transparent black), back to straight RGBA, composited over the base.
  constexpr std::uint32_t kBits = 7;  // Pillow AlphaComposite.c PRECISION_BITS
  for (size_t i = 0; i < mask_grey.size(); ++i) {
    const std::uint32_t a = 255u - mask_grey[i];
    for (int c = 0; c < 3; ++c) {
      std::uint8_t& out = base[3 * i + c];
      if (a == 255) {
        out = init.rgb[3 * i + c];
        continue;
      }
      if (a == 0) continue;
      const std::uint32_t pm = div255(init.rgb[3 * i + c] * a);
      const std::uint32_t src = std::min<std::uint32_t>(255, pm * 255 / a);
      const std::uint32_t coef1 = a * 255 * 255 * (1u << kBits) / (255 * 255);
      const std::uint32_t coef2 = 255 * (1u << kBits) - coef1;
      const std::uint32_t tmp = src * coef1 + out * coef2 + (0x80u << kBits);
      out = static_cast<std::uint8_t>((((tmp >> 8) + tmp) >> 8) >> kBits);
    }
  }
  return base;
}

bool mask_survives_blur(const RgbImage& mask, int blur, bool only_masked, int padding, int width, int height,
                        int down) {
  std::vector<float> m;
  if (!only_masked) {
    m = inpaint_latent_mask(mask, blur, width, height, down);
  } else {
    std::vector<std::uint8_t> blurred = gaussian_blur_rgb8(mask.rgb.data(), mask.width, mask.height, blur);
    if (mask.width != width || mask.height != height)
      blurred = resize_lanczos_rgb8(blurred.data(), mask.width, mask.height, width, height);
    const CropBox box = mask_crop_region(grey_of_rgb8(blurred.data(), width, height), width, height, width, height,
                                         padding);
    const std::vector<std::uint8_t> cut = crop_rgb8(blurred.data(), width, box);
    const RgbImage filled{width, height, resize_and_fill_rgb8(cut.data(), box.width(), box.height(), width, height)};
    m = inpaint_latent_mask(filled, 0, width, height, down);
  }
  return std::any_of(m.begin(), m.end(), [](float v) { return v > 0; });
}

}  // namespace sdxl
