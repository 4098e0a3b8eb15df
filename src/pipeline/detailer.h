// The detailer's regions (ADetailer's semantics; docs/detailer.md): a unit's detections turned into
// inpainting masks — the box (PIL's rectangle of the truncated corners, both inclusive) or the
// segment, dilated (dilate > 0) or eroded (< 0) with a square kernel as OpenCV's cv2.dilate / cv2.erode
// do, all-black masks dropped, the `max` largest kept — and the inpainting pass of one region
// ("only masked" at the image's size, seed + region index). torch-free.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "batch/generation_params.h"
#include "detect/detection.h"

namespace sdxl {

struct DetailerRegion {
  float x1 = 0, y1 = 0, x2 = 0, y2 = 0;  // the detection's box, image pixels
  float score = 0;
  int class_id = 0;
  std::shared_ptr<const PixelImage> mask;  // width x height, white = repaint
};

// OpenCV's morphology with a k x k kernel of ones (anchor k / 2, pixels outside the image ignored) on an
// 8-bit single-channel mask: the maximum (dilate) or minimum (erode) of each pixel's window.
std::vector<std::uint8_t> dilate_erode_mask(const std::vector<std::uint8_t>& mask, int width, int height, int value);

// The regions of `detections` (by descending score) in a width x height image, in ADetailer's order:
// when unit.max > 0 the max largest by box area (largest first), then each mask made, dilated or
// eroded, and dropped when nothing is left.
std::vector<DetailerRegion> detailer_regions(const std::vector<Detection>& detections, int width, int height,
                                             const DetailerUse& unit);

// The pass of region `j` of unit `unit` of an image made with `image` (its prompt, seed and size): an
// only-masked inpainting of `init` through `mask` at init's size with the unit's blur, padding,
// denoising strength and steps, seed image.seed + j, prompts per detailer_prompt; no hires, frame,
// ControlNet, IP-Adapter or detailer of its own (as ADetailer turns its scripts off).
GenerationParams detailer_pass_params(const GenerationParams& image, const DetailerUse& unit, int j,
                                      std::shared_ptr<const PixelImage> init, std::shared_ptr<const PixelImage> mask);

}  // namespace sdxl
