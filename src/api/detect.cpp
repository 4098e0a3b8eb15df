// detect_images (sdxl_batch.h): each PNG's detections by a detector folder (detect/image_detector.h).
#include <sdxl_batch/sdxl_batch.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>

#include "api/boundary.h"
#include "core/error.h"
#include "detect/image_detector.h"
#include "image/png_reader.h"

namespace sdxl::api {
namespace {

void check_detect_options(const sdxl_batch::DetectOptions& o) {
  if (!(o.confidence > 0 && o.confidence <= 1) || !std::isfinite(o.confidence))
    throw UsageError("--confidence " + std::to_string(o.confidence) + ": must be above 0 and at most 1");
  if (o.detector.empty()) throw UsageError("detect: --detector DIR is required");
  if (o.images.empty()) throw UsageError("detect: no image given");
  for (const std::string& image : o.images) {  // every image decoded whole before the detector loads
    int w = 0, h = 0;
    if (const std::string why = png_decode_problem(image, w, h); !why.empty())
      throw UsageError("detect: image '" + image + "': " + why);
  }
}

void detect_images_impl(const sdxl_batch::DetectOptions& o,
                        const std::function<void(const sdxl_batch::ImageDetections&)>& sink) {
  check_detect_options(o);
  ImageDetector detector(o.detector, o.device);
  const std::vector<std::string>& names = detector.class_names();
  DetectSettings settings;
  settings.confidence = o.confidence;
  for (const std::string& image : o.images) {
    const RgbImage img = read_png_rgb(image, "detect: image");
    sdxl_batch::ImageDetections out;
    out.image = image;
    out.width = img.width;
    out.height = img.height;
    for (const Detection& d : detector.detect(img.rgb.data(), img.width, img.height, settings)) {
      const std::string name = d.class_id >= 0 && d.class_id < static_cast<int>(names.size())
                                   ? names[static_cast<std::size_t>(d.class_id)]
                                   : std::to_string(d.class_id);
      out.boxes.push_back({d.x1, d.y1, d.x2, d.y2, d.score, d.class_id, name, d.mask_area});
    }
    spdlog::info("detect: {}: {} detection(s)", image, out.boxes.size());
    sink(out);
  }
}

}  // namespace
}  // namespace sdxl::api

namespace sdxl_batch {

void detect_images(const DetectOptions& options, const std::function<void(const ImageDetections&)>& sink) {
  sdxl::api::guarded([&] { sdxl::api::detect_images_impl(options, sink); });
}

}  // namespace sdxl_batch
