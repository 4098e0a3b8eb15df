#include "detect/image_detector.h"

#include <torch/torch.h>

#include "detect/detector.h"
#include "device/device.h"

namespace sdxl {

struct ImageDetector::Impl {
  std::unique_ptr<Detector> detector;
};

ImageDetector::ImageDetector(const std::filesystem::path& dir, const std::string& device)
    : impl_(std::make_unique<Impl>()) {
  const std::string dev = device == "auto" ? (torch::cuda::is_available() ? "cuda" : "cpu") : device;
  impl_->detector = std::make_unique<Detector>(dir, parse_device(dev));
}

ImageDetector::~ImageDetector() = default;
const std::vector<std::string>& ImageDetector::class_names() const { return impl_->detector->config().classes; }
const std::string& ImageDetector::task() const { return impl_->detector->config().task; }

std::vector<Detection> ImageDetector::detect(const std::uint8_t* rgb, int width, int height,
                                             const DetectSettings& settings, bool keep_masks) {
  return impl_->detector->detect(rgb, width, height, settings, keep_masks);
}

}  // namespace sdxl
