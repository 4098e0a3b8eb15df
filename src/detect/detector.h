// A detector folder (export_sdxl.py --detector: an Ultralytics YOLO detect or segment model) run as
// Ultralytics' predictor runs it (DetectionPredictor / SegmentationPredictor, predict with a fixed-size
// TorchScript model): the image letterboxed (detect/letterbox.h), RGB / 255, the module, then
// non_max_suppression (candidates whose best class score is above the confidence, xywh -> xyxy, the
// best class, at most 30000 by score, class-aware NMS at IoU 0.7 with boxes offset by class x 7680,
// at most 300 kept), for segment models process_mask (coefficients x prototypes, bilinear upsample
// to the input size, logit > 0, cropped to the box) and detections without mask pixels dropped, and
// scale_boxes (padding removed, divided by the gain, clipped to the image).
// One Detector is used by one thread at a time.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <filesystem>
#include <vector>

#include "detect/detection.h"
#include "model/detector_config.h"

namespace sdxl {

class Detector {
 public:
  // ModelError when the folder is not a detector folder or its module does not load.
  Detector(const std::filesystem::path& dir, const torch::Device& device);
  const DetectorConfig& config() const { return config_; }
  // The bytes of the loaded module's parameters and buffers (its weights on the device).
  std::uint64_t weight_bytes() const;
  // Detections of one 8-bit RGB image, by descending score. keep_masks: fill Detection::mask.
  std::vector<Detection> detect(const std::uint8_t* rgb, int width, int height, const DetectSettings& settings,
                                bool keep_masks = false);

 private:
  DetectorConfig config_;
  torch::Device device_;
  torch::jit::Module module_;
};

}  // namespace sdxl
