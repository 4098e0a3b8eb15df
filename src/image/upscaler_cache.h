// UpscalerCache: the upscaler folders tasks name for their frames ("upscale": {"model": DIR};
// --upscale-model) and for their hires fix ("hires": {"upscaler": DIR}; --hires-upscaler), loaded on
// the run's device on first use and kept in a least-recently-used cache of `capacity` folders
// (--upscaler-cache; a night's stories use one or two upscalers over hundreds of frames). Their
// weights are counted (stats, the report's engine counters); evicting one frees it once no stage
// holds it. Thread-safe; an Upscaler may run in the sampling stage (hires fix) and the decode stage
// (frames) at once: its module's forward keeps no state between calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <torch/types.h>

#include "core/lru_cache.h"
#include "image/upscaler.h"

namespace sdxl {

class UpscalerCache {
 public:
  UpscalerCache(const torch::Device& device, std::size_t capacity) : device_(device), cache_(capacity) {}

  // The upscaler of folder `dir`; UsageError (a task's failure, not the run's) when it is not an
  // upscaler folder or does not load.
  std::shared_ptr<Upscaler> get(const std::string& dir);
  // resident_bytes: the weights of the cached upscalers.
  LruCacheStats stats() const { return cache_.stats(); }

 private:
  torch::Device device_;
  LruCache<Upscaler> cache_;
};

}  // namespace sdxl
