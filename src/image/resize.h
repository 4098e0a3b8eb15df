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

}  // namespace sdxl
