#include "control/controlnet_cache.h"

#include <spdlog/spdlog.h>

namespace sdxl {

std::shared_ptr<ControlNet> ControlNetCache::get(const std::string& dir) {
  bool loaded = false;
  std::shared_ptr<ControlNet> cn = cache_.get(
      dir,
      [&] { return task_folder_errors([&] { return std::make_shared<ControlNet>(load_controlnet_config(dir), model_); }); },
      [&](const std::string& key) {
        spdlog::info("ControlNet '{}' evicted from the ControlNet cache ({} at most)", key, cache_.capacity());
      },
      &loaded);
  if (loaded)
    spdlog::info("ControlNet '{}' loaded ({}): {:.1f} MiB; ControlNet cache {} of {}, {:.1f} MiB", dir,
                 cn->config().name, cn->weight_bytes() / 1048576.0, cache_.size(), cache_.capacity(),
                 stats().resident_bytes / 1048576.0);
  return cn;
}

}  // namespace sdxl
