// A detector folder behind a torch-free header (the API uses it): loads the folder on a device named
// as the CLI names it and detects in 8-bit RGB images (detect/detector.h). One ImageDetector per thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "detect/detection.h"

namespace sdxl {

class ImageDetector {
 public:
  // device: "auto" (CUDA when present), "cpu", "cuda[:N]". ModelError for a folder that is not a
  // detector folder or does not load; UsageError for a bad device.
  ImageDetector(const std::filesystem::path& dir, const std::string& device);
  ~ImageDetector();
  ImageDetector(const ImageDetector&) = delete;
  ImageDetector& operator=(const ImageDetector&) = delete;
  const std::vector<std::string>& class_names() const;
  const std::string& task() const;  // "detect" | "segment"
  std::vector<Detection> detect(const std::uint8_t* rgb, int width, int height, const DetectSettings& settings,
                                bool keep_masks = false);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sdxl
