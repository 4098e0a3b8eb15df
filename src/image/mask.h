// Inpainting masks as diffusers prepares them for StableDiffusionXLInpaintPipeline:
// VaeImageProcessor.blur (PIL ImageFilter.GaussianBlur), the mask processor's
// resize (PIL Lanczos), grey conversion (PIL "L") and binarisation at 0.5, and
// prepare_mask_latents' nearest interpolation to the latent grid.
// torch-free, thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "image/png_reader.h"

namespace sdxl {

// PIL's image.filter(ImageFilter.GaussianBlur(radius)) on 8-bit RGB: three
// box-blur passes along rows, then three along columns, each with PIL's
// fractional box edge and 8.24 fixed-point weights, edges repeated. radius 0
// returns the image unchanged.
std::vector<std::uint8_t> gaussian_blur_rgb8(const std::uint8_t* rgb, int width, int height, double radius);

// PIL's convert("L") of 8-bit RGB: (R*19595 + G*38470 + B*7471 + 0x8000) >> 16.
std::vector<std::uint8_t> grey_of_rgb8(const std::uint8_t* rgb, int width, int height);

// The mask the pipeline blends with: `mask` blurred by `blur` (0 = none),
// resized to width x height (Lanczos, when its size differs), grey, 1 where
// the grey value / 255 >= 0.5 else 0; then nearest-sampled to the latent grid
// (width / down x height / down; torch interpolate "nearest"). Row-major.
std::vector<float> inpaint_latent_mask(const RgbImage& mask, int blur, int width, int height, int down);

// Whether any pixel's grey value is 0.5 or more (something to repaint).
bool mask_marks_anything(const RgbImage& mask);

}  // namespace sdxl
