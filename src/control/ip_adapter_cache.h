// IpAdapterCache: the IP-Adapters tasks name ("ip_adapter", --ip-adapter),
// loaded on the model's device on first use and kept in a least-recently-used
// cache of `adapters` folders, and the keys and values of each reference image
// per adapter, kept for `images` (adapter, image) pairs: a character sheet
// that 200 panels share is encoded once. An image is known by its file's
// sha256, so a changed file is encoded again. Weights and cached tensors are
// counted (stats, the report's engine counters). Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "control/ip_adapter.h"
#include "core/lru_cache.h"

namespace sdxl {

// A reference image through one adapter: its layers' keys and values, and its file's sha256.
struct IpImageKv {
  std::vector<torch::Tensor> kv;
  std::string sha256;
  std::uint64_t bytes() const;
};

class IpAdapterCache {
 public:
  IpAdapterCache(const SdxlModel& model, std::size_t adapters, std::size_t images)
      : model_(model), adapters_(adapters), images_(images) {}

  // The IP-Adapter of folder `dir`; UsageError (a task's failure, not the run's)
  // when it is not one, does not fit the model or does not load.
  std::shared_ptr<IpAdapter> get(const std::string& dir);
  // Reference image `path` through `adapter` (encoded on a miss; UsageError
  // naming the file when it cannot be read).
  std::shared_ptr<IpImageKv> image(const std::shared_ptr<IpAdapter>& adapter, const std::string& path);

  // resident_bytes: the cached adapters' weights / the cached images' tensors.
  // The images' loads are the image encoder's runs for references.
  LruCacheStats adapter_stats() const { return adapters_.stats(); }
  LruCacheStats image_stats() const;

 private:
  const SdxlModel& model_;
  LruCache<IpAdapter> adapters_;
  LruCache<IpImageKv> images_;
};

}  // namespace sdxl
