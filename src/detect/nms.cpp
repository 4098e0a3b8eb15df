#include "detect/nms.h"

#include <algorithm>
#include <numeric>

namespace sdxl {

std::vector<std::int64_t> nms(const std::vector<NmsBox>& boxes, const std::vector<float>& scores, double iou_threshold) {
  const std::size_t n = boxes.size();
  std::vector<std::int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return scores[a] > scores[b]; });
  std::vector<float> areas(n);
  for (std::size_t i = 0; i < n; ++i)
    areas[i] = (boxes[i].x2 - boxes[i].x1) * (boxes[i].y2 - boxes[i].y1);
  std::vector<char> suppressed(n, 0);
  std::vector<std::int64_t> keep;
  for (std::size_t oi = 0; oi < n; ++oi) {
    const std::int64_t i = order[oi];
    if (suppressed[i]) continue;
    keep.push_back(i);
    const NmsBox& a = boxes[i];
    for (std::size_t oj = oi + 1; oj < n; ++oj) {
      const std::int64_t j = order[oj];
      if (suppressed[j]) continue;
      const NmsBox& b = boxes[j];
      const float w = std::max(0.f, std::min(a.x2, b.x2) - std::max(a.x1, b.x1));
      const float h = std::max(0.f, std::min(a.y2, b.y2) - std::max(a.y1, b.y1));
      const float inter = w * h;
      if (inter / (areas[i] + areas[j] - inter) > iou_threshold) suppressed[j] = 1;
    }
  }
  return keep;
}

}  // namespace sdxl
