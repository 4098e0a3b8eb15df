// Resizing 8-bit RGB images exactly as PIL's Image.resize does, so that images
// sdxl-batch resizes match the ones diffusers' image processors make.
// torch-free, thread-safe.
#pragma once

#include <cstdint>
#include <vector>

namespace sdxl {

// PIL Image.resize((out_w, out_h), Image.NEAREST): source pixel int(step / 2 + x * step), the
// position accumulated in double as PIL does (step = in / out).
std::vector<std::uint8_t> resize_nearest_rgb8(const std::uint8_t* rgb, int width, int height, int out_w, int out_h);

// PIL Image.resize((out_w, out_h), Image.LANCZOS) as Pillow 13 does it (diffusers' VaeImageProcessor
// default): separable Lanczos-3 with PIL's support widening when shrinking and
// its 22-bit fixed-point weights, each pass rounded and
// clipped to 8 bits (vertical pass first when the height shrinks much more);
// a dimension of the same size is not resampled.
std::vector<std::uint8_t> resize_lanczos_rgb8(const std::uint8_t* rgb, int width, int height, int out_w, int out_h);

// A region of the source in pixels (floating point): PIL's `box` argument.
struct ResizeBox {
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

// PIL Image.resize((out_w, out_h), Image.LANCZOS, box=(x0, y0, x1, y1)) for a box that is not the
// whole image: the same taps over the box's span (its corners as C floats, as PIL takes them), the
// horizontal pass first over the rows the vertical pass reads, each pass rounded to 8 bits.
// The box must lie inside the image with x0 < x1, y0 < y1.
std::vector<std::uint8_t> resize_lanczos_box_rgb8(const std::uint8_t* rgb, int width, int height, int out_w, int out_h,
                                                  const ResizeBox& box);

}  // namespace sdxl
