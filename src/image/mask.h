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

// The same mask at width x height before the latent grid: 1 where the blurred,
// resized grey value / 255 >= 0.5 (repaint) else 0, row-major. A 9-channel
// inpainting UNet's masked image is the init image where this is 0
// (StableDiffusionXLInpaintPipeline: init_image * (mask < 0.5)).
std::vector<std::uint8_t> inpaint_pixel_mask(const RgbImage& mask, int blur, int width, int height);

// inpaint_latent_mask of a pixel mask (inpaint_pixel_mask's output).
std::vector<float> latent_mask_of_pixels(const std::vector<std::uint8_t>& pixels, int width, int height, int down);

// Whether any pixel's grey value is 0.5 or more (something to repaint).
bool mask_marks_anything(const RgbImage& mask);

// "Only masked" inpainting (diffusers' padding_mask_crop, A1111's geometry).
struct CropBox {
  int x1 = 0, y1 = 0, x2 = 0, y2 = 0;  // [x1, x2) x [y1, y2)
  int width() const { return x2 - x1; }
  int height() const { return y2 - y1; }
};

// VaeImageProcessor.get_crop_region: the box around every non-zero pixel of
// `grey` (w x h), grown by `pad` (clamped to the image), then grown along one
// axis to width:height's aspect ratio and shifted back inside the image.
CropBox mask_crop_region(const std::vector<std::uint8_t>& grey, int w, int h, int width, int height, int pad);

// `box` of an RGB image (w wide) cut out.
std::vector<std::uint8_t> crop_rgb8(const std::uint8_t* rgb, int w, const CropBox& box);

// VaeImageProcessor resize_mode "fill" (_resize_and_fill): Lanczos to fit inside
// out_w x out_h keeping the ratio, centred; the strips left (at most a few
// pixels when the ratios differ by rounding) repeat the nearest edge row or
// column (diffusers resamples a zero-width box there: within a grey level).
std::vector<std::uint8_t> resize_and_fill_rgb8(const std::uint8_t* rgb, int w, int h, int out_w, int out_h);

// VaeImageProcessor.apply_overlay with crop_coords: the inpainted image
// (width x height of the task) resized to cover the box and centre-cropped
// ("crop" mode), placed at the box, then the init image laid over it through
// 255 - grey(mask) as alpha (PIL's RGBa paste and alpha_composite). Where the
// mask is 0 (everywhere outside the box) the result is the init image's bytes.
std::vector<std::uint8_t> overlay_inpainted_rgb8(const RgbImage& init, const std::vector<std::uint8_t>& mask_grey,
                                                 const std::uint8_t* inpainted, int width, int height,
                                                 const CropBox& box);

// Whether the run has anything to repaint with `mask` (validate = run): its
// latent-grid mask marks a cell, for the whole image (inpaint_latent_mask) or,
// with `only_masked`, after the blurred mask is cut to its crop box (grown by
// `padding`) and filled to width x height as the run does.
bool mask_survives_blur(const RgbImage& mask, int blur, bool only_masked, int padding, int width, int height, int down);

}  // namespace sdxl
