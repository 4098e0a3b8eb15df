#include "image/upscaler_cache.h"

#include <spdlog/spdlog.h>

#include "core/error.h"

namespace sdxl {

std::shared_ptr<Upscaler> UpscalerCache::get(const std::string& dir) {
  bool loaded = false;
  std::shared_ptr<Upscaler> up = cache_.get(
      dir, [&] { return task_folder_errors([&] { return std::make_shared<Upscaler>(dir, device_); }); },
      [&](const std::string& key) {
        spdlog::info("upscaler '{}' evicted from the upscaler cache ({} at most)", key, cache_.capacity());
      },
      &loaded);
  if (loaded)
    spdlog::info("upscaler '{}' loaded ({}, {}x): {:.1f} MiB; upscaler cache {} of {}, {:.1f} MiB", dir,
                 up->config().architecture, up->config().scale, up->weight_bytes() / 1048576.0, cache_.size(),
                 cache_.capacity(), stats().resident_bytes / 1048576.0);
  return up;
}

}  // namespace sdxl
