// Non-maximum suppression with torchvision.ops.nms's semantics (its CPU kernel): boxes visited by
// descending score (ties in index order), each kept box suppresses every later box whose IoU with it
// is above the threshold; IoU in float (compared with the double threshold), w and h clamped at 0. torch-free, thread-safe.
#pragma once

#include <cstdint>
#include <vector>

namespace sdxl {

struct NmsBox {
  float x1, y1, x2, y2;
};

// The indices of the kept boxes, by descending score.
std::vector<std::int64_t> nms(const std::vector<NmsBox>& boxes, const std::vector<float>& scores, double iou_threshold);

}  // namespace sdxl
