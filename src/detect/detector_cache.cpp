#include "detect/detector_cache.h"

#include <spdlog/spdlog.h>

namespace sdxl {

std::shared_ptr<Detector> DetectorCache::get(const std::string& dir) {
  bool loaded = false;
  std::shared_ptr<Detector> det = cache_.get(
      dir, [&] { return std::make_shared<Detector>(dir, device_); },
      [&](const std::string& key) {
        spdlog::info("detector '{}' evicted from the detector cache ({} at most)", key, cache_.capacity());
      },
      &loaded);
  if (loaded)
    spdlog::info("detector '{}' loaded ({}): {:.1f} MiB; detector cache {} of {}, {:.1f} MiB", dir,
                 det->config().display_name(), det->weight_bytes() / 1048576.0, cache_.size(), cache_.capacity(),
                 stats().resident_bytes / 1048576.0);
  return det;
}

}  // namespace sdxl
