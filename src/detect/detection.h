// What a detector finds (detect/detector.h runs it; detect/image_detector.h is its torch-free face).
// Plain data, torch-free.
#pragma once

#include <cstdint>
#include <vector>

namespace sdxl {

struct DetectSettings {
  double confidence = 0.3;  // Ultralytics' conf (ADetailer's default 0.3)
  double iou = 0.7;         // Ultralytics' iou
  int max_det = 300;
};

struct Detection {
  float x1 = 0, y1 = 0, x2 = 0, y2 = 0;  // image pixels
  float score = 0;
  int class_id = 0;
  // Segment models: the mask in image pixels (Ultralytics' scale_masks of the input-size mask: padding
  // cut, bilinear to the image size, > 0.5), row-major height x width, 1 = inside; and its pixel count.
  std::vector<std::uint8_t> mask;
  std::int64_t mask_area = -1;  // -1 for detect models
};

}  // namespace sdxl
