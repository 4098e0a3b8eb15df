#include "control/controlnet_cache.h"

#include <spdlog/spdlog.h>

namespace sdxl {

ControlNetCache::ControlNetCache(const SdxlModel& model, std::size_t capacity)
    : model_(model), capacity_(capacity == 0 ? 1 : capacity) {}

std::shared_ptr<ControlNet> ControlNetCache::get(const std::string& dir) {
  const std::lock_guard lock(mu_);
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->first != dir) continue;
    ++stats_.hits;
    lru_.splice(lru_.begin(), lru_, it);
    return lru_.front().second;
  }
  auto cn = std::make_shared<ControlNet>(load_controlnet_config(dir), model_);
  ++stats_.loads;
  lru_.emplace_front(dir, cn);
  while (lru_.size() > capacity_) {
    spdlog::info("ControlNet '{}' evicted from the ControlNet cache ({} at most)", lru_.back().first, capacity_);
    lru_.pop_back();
    ++stats_.evictions;
  }
  stats_.resident_bytes = 0;
  for (const auto& [name, c] : lru_) stats_.resident_bytes += c->weight_bytes();
  spdlog::info("ControlNet '{}' loaded ({}): {:.1f} MiB; ControlNet cache {} of {}, {:.1f} MiB", dir,
               cn->config().name, cn->weight_bytes() / 1048576.0, lru_.size(), capacity_,
               stats_.resident_bytes / 1048576.0);
  return cn;
}

ControlNetCacheStats ControlNetCache::stats() const {
  const std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace sdxl
