#include "image/resize.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/parallel.h"

namespace sdxl {

std::vector<std::uint8_t> resize_nearest_rgb8(const std::uint8_t* rgb, int width, int height, int out_w, int out_h) {
  // PIL's ImagingScaleAffine: the source position starts at half a step and
  // grows by one step per pixel (accumulated in double, then truncated).
  auto positions = [](int in, int out) {
    std::vector<int> pos(static_cast<size_t>(out));
    const double step = static_cast<double>(in) / out;
    double at = step * 0.5;
    for (int i = 0; i < out; ++i, at += step) pos[static_cast<size_t>(i)] = std::min(static_cast<int>(at), in - 1);
    return pos;
  };
  const std::vector<int> xs = positions(width, out_w), ys = positions(height, out_h);
  std::vector<std::uint8_t> out(static_cast<size_t>(out_w) * static_cast<size_t>(out_h) * 3);
  for (int y = 0; y < out_h; ++y) {
    for (int x = 0; x < out_w; ++x) {
      const std::uint8_t* s = rgb + (static_cast<size_t>(ys[static_cast<size_t>(y)]) * static_cast<size_t>(width) +
                                     static_cast<size_t>(xs[static_cast<size_t>(x)])) * 3;
      std::uint8_t* d = out.data() + (static_cast<size_t>(y) * static_cast<size_t>(out_w) + static_cast<size_t>(x)) * 3;
      std::copy(s, s + 3, d);
    }
  }
  return out;
}

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // PIL's fixed-point weights

double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= std::numbers::pi;
  return std::sin(x) / x;
}

double lanczos3(double x) { return (-3.0 <= x && x < 3.0) ? sinc(x) * sinc(x / 3.0) : 0.0; }

// One output pixel's taps: the first source pixel and a fixed-point weight per tap.
struct Taps {
  int first = 0;
  std::vector<std::int32_t> weights;
};

// PIL's precompute_coeffs + normalize_coeffs_8bpc for one axis: the source span [in0, in1) of
// `in_size` pixels onto `out_size` pixels.
std::vector<Taps> lanczos_taps(int in_size, double in0, double in1, int out_size) {
  const double scale = (in1 - in0) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = 3.0 * filterscale;
  std::vector<Taps> taps(static_cast<size_t>(out_size));
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    const int xmin = std::max(0, static_cast<int>(center - support + 0.5));
    const int xmax = std::min(in_size, static_cast<int>(center + support + 0.5)) - xmin;
    std::vector<double> k(static_cast<size_t>(std::max(xmax, 0)));
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      k[static_cast<size_t>(x)] = lanczos3((x + xmin - center + 0.5) * ss);
      ww += k[static_cast<size_t>(x)];
    }
    Taps& t = taps[static_cast<size_t>(xx)];
    t.first = xmin;
    for (double w : k) {
      if (ww != 0.0) w /= ww;
      const double fixed = w * (1 << kPrecisionBits);
      t.weights.push_back(static_cast<std::int32_t>(w < 0 ? -0.5 + fixed : 0.5 + fixed));
    }
  }
  return taps;
}

std::uint8_t clip8(std::int32_t v) { return static_cast<std::uint8_t>(std::clamp(v >> kPrecisionBits, 0, 255)); }

// out[line, o] for one output pixel `o` of one line (3 channels).
inline void resample_pixel(const std::uint8_t* in, std::uint8_t* out, const Taps& t, size_t in_base, size_t in_pixel) {
  for (int c = 0; c < 3; ++c) {
    std::int32_t acc = 1 << (kPrecisionBits - 1);
    for (size_t i = 0; i < t.weights.size(); ++i)
      acc += static_cast<std::int32_t>(in[(in_base + (t.first + i) * in_pixel) * 3 + c]) * t.weights[i];
    out[c] = clip8(acc);
  }
}

// One pass along an axis: `lines` lines of `in_len` pixels, `in_pixel` apart within a line and
// `in_line` between lines (in pixels of 3 bytes). Rows are walked in memory order: a horizontal
// pass line by line, a vertical pass output row by output row (each row of taps read left to right).
void resample_axis(const std::uint8_t* in, std::uint8_t* out, const std::vector<Taps>& taps, int lines,
                   size_t in_pixel, size_t in_line, size_t out_pixel, size_t out_line) {
  double work = 0;
  for (const Taps& t : taps) work += static_cast<double>(t.weights.size()) * lines;
  if (in_pixel == 1) {  // horizontal: each line is a row
    parallel_ranges(static_cast<size_t>(lines), work, [&](size_t l0, size_t l1) {
      for (size_t l = l0; l < l1; ++l)
        for (size_t o = 0; o < taps.size(); ++o)
          resample_pixel(in, out + (l * out_line + o * out_pixel) * 3, taps[o], l * in_line, in_pixel);
    });
  } else {  // vertical: each output row from its taps' rows
    parallel_ranges(taps.size(), work, [&](size_t o0, size_t o1) {
      for (size_t o = o0; o < o1; ++o)
        for (size_t l = 0; l < static_cast<size_t>(lines); ++l)
          resample_pixel(in, out + (l * out_line + o * out_pixel) * 3, taps[o], l * in_line, in_pixel);
    });
  }
}

}  // namespace

std::vector<std::uint8_t> resize_lanczos_rgb8(const std::uint8_t* rgb, int width, int height, int out_w, int out_h) {
  std::vector<std::uint8_t> cur(rgb, rgb + static_cast<size_t>(width) * static_cast<size_t>(height) * 3);
  int w = width, h = height;
  auto horizontal = [&] {  // each row
    std::vector<std::uint8_t> next(static_cast<size_t>(out_w) * static_cast<size_t>(h) * 3);
    resample_axis(cur.data(), next.data(), lanczos_taps(w, 0, w, out_w), h, 1, static_cast<size_t>(w), 1,
                  static_cast<size_t>(out_w));
    cur.swap(next);
    w = out_w;
  };
  auto vertical = [&] {  // each column
    std::vector<std::uint8_t> next(static_cast<size_t>(w) * static_cast<size_t>(out_h) * 3);
    resample_axis(cur.data(), next.data(), lanczos_taps(h, 0, h, out_h), w, static_cast<size_t>(w), 1,
                  static_cast<size_t>(w), 1);
    cur.swap(next);
    h = out_h;
  };
  // Pillow 13 resamples vertically first when the height shrinks by more than
  // twice the pixels the width does (ImagingResampleInner); the 8-bit rounding
  // between the passes makes the order visible.
  const bool vertical_first = out_h < height && height - out_h > 2 * (width - out_w);
  if (vertical_first && out_h != height) vertical();
  if (out_w != width) horizontal();
  if (!vertical_first && out_h != height) vertical();
  return cur;
}

std::vector<std::uint8_t> resize_lanczos_box_rgb8(const std::uint8_t* rgb, int width, int height, int out_w, int out_h,
                                                  const ResizeBox& box_in) {
  // PIL passes the box as C floats.
  const double x0 = static_cast<float>(box_in.x0), y0 = static_cast<float>(box_in.y0);
  const double x1 = static_cast<float>(box_in.x1), y1 = static_cast<float>(box_in.y1);
  const std::vector<Taps> vert = lanczos_taps(height, y0, y1, out_h);
  // The horizontal pass reads only the rows the vertical pass uses.
  const int row0 = vert.front().first;
  const int row1 = vert.back().first + static_cast<int>(vert.back().weights.size());
  const int rows = std::max(row1 - row0, 1);
  std::vector<std::uint8_t> mid(static_cast<size_t>(out_w) * static_cast<size_t>(rows) * 3);
  resample_axis(rgb + static_cast<size_t>(row0) * static_cast<size_t>(width) * 3, mid.data(),
                lanczos_taps(width, x0, x1, out_w), rows, 1, static_cast<size_t>(width), 1, static_cast<size_t>(out_w));
  std::vector<Taps> shifted = vert;
  for (Taps& t : shifted) t.first -= row0;
  std::vector<std::uint8_t> out(static_cast<size_t>(out_w) * static_cast<size_t>(out_h) * 3);
  resample_axis(mid.data(), out.data(), shifted, out_w, static_cast<size_t>(out_w), 1, static_cast<size_t>(out_w), 1);
  return out;
}

}  // namespace sdxl
