// Ultralytics' preprocessing of an image for a fixed-size YOLO model (ultralytics.data.augment.LetterBox
// with auto=False, center=True, scaleup=True, padding value 114): the image scaled by
// r = min(H / h, W / w) to round(w r) x round(h r) (Python's round: half to even, at least 1 px) with
// OpenCV's cv2.resize INTER_LINEAR, then padded to H x W, round(pad - 0.1) px on the top / left side.
// torch-free, thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <vector>

namespace sdxl {

struct LetterboxGeometry {
  int src_w = 0, src_h = 0;    // the image
  int dst_w = 0, dst_h = 0;    // the model's input
  int new_w = 0, new_h = 0;    // the scaled image inside it
  int left = 0, top = 0;       // its offset (the padding before it)
};

LetterboxGeometry letterbox_geometry(int src_w, int src_h, int dst_w, int dst_h);

// cv2.resize(src, (dst_w, dst_h), interpolation=INTER_LINEAR) of 8-bit interleaved pixels, bit for bit:
// half-pixel centres, coefficients in 11-bit fixed point (OpenCV's INTER_RESIZE_COEF_BITS), columns
// clamped at the borders with their coefficient, rows clamped with the unclamped coefficient, and the
// vertical pass rounded as OpenCV's SIMD kernel rounds it (VResizeLinearVec_32s8u).
std::vector<std::uint8_t> resize_linear_cv(const std::uint8_t* src, int src_w, int src_h, int channels, int dst_w,
                                           int dst_h);

// RGB (src_w x src_h) letterboxed to g.dst_w x g.dst_h RGB.
std::vector<std::uint8_t> letterbox_rgb8(const std::uint8_t* rgb, const LetterboxGeometry& g);

}  // namespace sdxl
