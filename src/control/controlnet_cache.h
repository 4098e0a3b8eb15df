// ControlNetCache: the ControlNets tasks name ("controlnets", --controlnet),
// loaded on the model's device on first use and kept in a least-recently-used
// cache of `capacity` folders (a night's batch uses a few ControlNets over
// hundreds of images). Their weights are counted (stats, the report's engine
// counters); evicting one frees it once no stage holds it. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "control/controlnet.h"
#include "core/lru_cache.h"

namespace sdxl {

class ControlNetCache {
 public:
  ControlNetCache(const SdxlModel& model, std::size_t capacity) : model_(model), cache_(capacity) {}

  // The ControlNet of folder `dir`; UsageError (a task's failure, not the run's) when
  // it is not one, does not fit the model or does not load.
  std::shared_ptr<ControlNet> get(const std::string& dir);
  // resident_bytes: the weights of the cached ControlNets.
  LruCacheStats stats() const { return cache_.stats(); }

 private:
  const SdxlModel& model_;
  LruCache<ControlNet> cache_;
};

}  // namespace sdxl
