#include "detect/letterbox.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace sdxl {

namespace {

constexpr int kCoefBits = 11;  // OpenCV's INTER_RESIZE_COEF_BITS
constexpr int kCoefScale = 1 << kCoefBits;
constexpr std::uint8_t kPad = 114;

// Python's round() of a double: half to even (nearbyint in the default rounding mode).
int py_round(double v) { return static_cast<int>(std::nearbyint(v)); }

// OpenCV's saturate_cast<short>(float): round to nearest, ties to even.
int coef(float v) { return static_cast<int>(std::nearbyint(v)); }

struct Taps {
  std::vector<int> ofs;     // the first source index
  std::vector<int> a0, a1;  // its weight and the next one's, in kCoefScale units
};

// cv::resize's coefficient tables for one axis. clamp: the column rule (an index outside the image is
// moved inside with weight (1, 0)); rows keep the unclamped index and weights (the row fetch clamps).
Taps taps(int src, int dst, bool clamp) {
  const double scale = 1.0 / (static_cast<double>(dst) / src);
  Taps t;
  for (int d = 0; d < dst; ++d) {
    float f = static_cast<float>((d + 0.5) * scale - 0.5);
    int s = static_cast<int>(std::floor(f));
    f -= static_cast<float>(s);
    if (clamp && s < 0) f = 0.f, s = 0;
    if (clamp && s >= src - 1) f = 0.f, s = src - 1;
    t.ofs.push_back(s);
    t.a0.push_back(coef((1.f - f) * kCoefScale));
    t.a1.push_back(coef(f * kCoefScale));
  }
  return t;
}

}  // namespace

LetterboxGeometry letterbox_geometry(int src_w, int src_h, int dst_w, int dst_h) {
  LetterboxGeometry g{src_w, src_h, dst_w, dst_h};
  const double r = std::min(static_cast<double>(dst_h) / src_h, static_cast<double>(dst_w) / src_w);
  g.new_w = std::max(py_round(src_w * r), 1);
  g.new_h = std::max(py_round(src_h * r), 1);
  g.left = py_round((dst_w - g.new_w) / 2.0 - 0.1);
  g.top = py_round((dst_h - g.new_h) / 2.0 - 0.1);
  return g;
}

std::vector<std::uint8_t> resize_linear_cv(const std::uint8_t* src, int src_w, int src_h, int channels, int dst_w,
                                           int dst_h) {
  const Taps tx = taps(src_w, dst_w, /*clamp=*/true), ty = taps(src_h, dst_h, /*clamp=*/false);
  const int row = dst_w * channels;
  // Horizontal pass of every source row (exact integers: pixel x kCoefScale).
  std::vector<std::int32_t> horiz(static_cast<std::size_t>(src_h) * row);
  for (int y = 0; y < src_h; ++y) {
    const std::uint8_t* s = src + static_cast<std::size_t>(y) * src_w * channels;
    std::int32_t* d = horiz.data() + static_cast<std::size_t>(y) * row;
    for (int x = 0; x < dst_w; ++x) {
      const int sx = tx.ofs[x];
      for (int c = 0; c < channels; ++c) {
        const int p0 = s[sx * channels + c];
        d[x * channels + c] = sx + 1 < src_w ? p0 * tx.a0[x] + s[(sx + 1) * channels + c] * tx.a1[x]
                                             : p0 * kCoefScale;
      }
    }
  }
  std::vector<std::uint8_t> out(static_cast<std::size_t>(dst_h) * row);
  for (int y = 0; y < dst_h; ++y) {
    const int r0 = std::clamp(ty.ofs[y], 0, src_h - 1), r1 = std::clamp(ty.ofs[y] + 1, 0, src_h - 1);
    const std::int32_t* s0 = horiz.data() + static_cast<std::size_t>(r0) * row;
    const std::int32_t* s1 = horiz.data() + static_cast<std::size_t>(r1) * row;
    const std::int32_t b0 = ty.a0[y], b1 = ty.a1[y];
    std::uint8_t* d = out.data() + static_cast<std::size_t>(y) * row;
    for (int x = 0; x < row; ++x) {
      // v_mul_hi of the 4-bit-shifted sums (16-bit lanes), then a rounding shift by 2.
      const std::int32_t v = (((s0[x] >> 4) * b0) >> 16) + (((s1[x] >> 4) * b1) >> 16);
      d[x] = static_cast<std::uint8_t>(std::clamp((v + 2) >> 2, 0, 255));
    }
  }
  return out;
}

std::vector<std::uint8_t> letterbox_rgb8(const std::uint8_t* rgb, const LetterboxGeometry& g) {
  std::vector<std::uint8_t> scaled;
  const std::uint8_t* body = rgb;
  if (g.new_w != g.src_w || g.new_h != g.src_h) {
    scaled = resize_linear_cv(rgb, g.src_w, g.src_h, 3, g.new_w, g.new_h);
    body = scaled.data();
  }
  std::vector<std::uint8_t> out(static_cast<std::size_t>(g.dst_w) * g.dst_h * 3, kPad);
  const int rows = std::min(g.new_h, g.dst_h - g.top), cols = std::min(g.new_w, g.dst_w - g.left);
  for (int y = 0; y < rows; ++y)
    std::memcpy(out.data() + ((static_cast<std::size_t>(g.top) + y) * g.dst_w + g.left) * 3,
                body + static_cast<std::size_t>(y) * g.new_w * 3, static_cast<std::size_t>(cols) * 3);
  return out;
}

}  // namespace sdxl
