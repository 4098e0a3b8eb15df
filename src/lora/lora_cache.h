// LoraCache: LoRA factors read from safetensors files and kept on the device,
// least-recently-used evicted first by bytes within a budget; pinned entries
// are never evicted (the budget may then be exceeded, with a warning). Entries
// are keyed by canonical path + size + mtime, so an edited file reloads.
// Loading throws UsageError naming the file and tensor (bad format, NaN/Inf,
// non-float dtype, factors that fit no weight; unmatched keys with `strict`).
// Not thread-safe: one generator owns one cache and uses it from its text stage.
#pragma once

#include <torch/types.h>

#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lora/lora_keys.h"
#include "batch/lora_ref.h"
#include "lora/lora_stats.h"

namespace sdxl {

struct SafetensorsTensor;

// A float tensor of a safetensors file (F32/F16/BF16; F64 becomes F32) on
// `device`. Throws UsageError naming `label` and the tensor for another dtype
// or for NaN/Inf values.
torch::Tensor safetensors_to_tensor(const SafetensorsTensor& t, const std::string& label, const torch::Device& device);

struct LoraFactor {
  LoraTarget target;
  std::string param;
  torch::Tensor up, down;  // on the device, in the file's float dtype
  double scale = 1.0;      // alpha / rank (1 without alpha)
};

struct LoadedLora {
  std::string key, name, short_hash, format;
  std::filesystem::path path;
  std::vector<LoraFactor> factors;
  std::uint64_t bytes = 0;
};

class LoraCache {
 public:
  LoraCache(ModelParamShapes shapes, torch::Device device, std::uint64_t budget_bytes, bool strict);

  // The factors of ref.path: from the cache (hit) or loaded (miss). Evicts the
  // least recently used unpinned entries not in `keep` until the new one fits.
  std::shared_ptr<const LoadedLora> get(const LoraRef& ref, const std::vector<std::string>& keep = {});

  const LoraStats& stats() const { return stats_; }
  LoraStats& stats() { return stats_; }

 private:
  struct Entry {
    std::shared_ptr<const LoadedLora> lora;
    bool pinned = false;
  };
  std::shared_ptr<LoadedLora> load(const LoraRef& ref, const std::string& key);
  void evict_for(std::uint64_t bytes, const std::vector<std::string>& keep);

  ModelParamShapes shapes_;
  torch::Device device_;
  bool strict_;
  std::list<std::string> lru_;  // front = most recent
  std::map<std::string, Entry> entries_;
  LoraStats stats_;
};

// Cache key of a file: canonical path, size and modification time.
std::string lora_cache_key(const std::filesystem::path& path);

}  // namespace sdxl
