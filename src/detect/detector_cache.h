// DetectorCache: the detector folders tasks' detailers name ("detailer": [{"detector": DIR}];
// --detailer), loaded on the run's device on first use and kept in a least-recently-used cache of
// `capacity` folders (--detector-cache; faces and hands). Their weights are counted (stats, the
// report's detector_cache_resident_mib); evicting one frees it once no caller holds it. Thread-safe
// (one cache per device; a Detector itself is used by one thread at a time: the decode stage's).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "core/lru_cache.h"
#include "detect/detector.h"

namespace sdxl {

class DetectorCache {
 public:
  DetectorCache(const torch::Device& device, std::size_t capacity) : device_(device), cache_(capacity) {}

  // The detector of folder `dir`; ModelError when it is not a detector folder or does not load (the
  // cache is then left as it was).
  std::shared_ptr<Detector> get(const std::string& dir);
  // resident_bytes: the weights of the cached detectors.
  LruCacheStats stats() const { return cache_.stats(); }
  std::size_t size() const { return cache_.size(); }

 private:
  torch::Device device_;
  LruCache<Detector> cache_;
};

}  // namespace sdxl
