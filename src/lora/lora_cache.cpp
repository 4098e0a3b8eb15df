#include "lora/lora_cache.h"

#include <spdlog/spdlog.h>
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <mutex>

#include "device/device.h"
#include "core/error.h"
#include "lora/safetensors.h"

namespace sdxl {
namespace {

using Clock = std::chrono::steady_clock;

// A1111 short hash of a file by cache key (path, size, mtime), for the whole
// process: kept after an eviction, and shared by the caches of all GPUs, so a
// file of hundreds of MiB is hashed once per run however many lanes load it.
// A lane asking while another hashes the same file waits for that result.
// Returns the hash and the seconds this call spent hashing (0 if it waited or hit).
std::pair<std::string, double> short_hash_once(const std::string& key, const SafetensorsFile& f) {
  static std::mutex mu;
  static std::map<std::string, std::shared_future<std::string>> hashes;
  std::promise<std::string> mine;
  std::shared_future<std::string> theirs;
  {
    std::lock_guard lk(mu);
    auto it = hashes.find(key);
    if (it != hashes.end()) theirs = it->second;
    else hashes.emplace(key, mine.get_future().share());
  }
  if (theirs.valid()) return {theirs.get(), 0.0};
  const auto t0 = Clock::now();
  try {
    std::string h = lora_short_hash(f);
    mine.set_value(h);
    return {h, std::chrono::duration<double>(Clock::now() - t0).count()};
  } catch (...) {
    {
      std::lock_guard lk(mu);
      hashes.erase(key);  // the next asker tries again
    }
    mine.set_exception(std::current_exception());
    throw;
  }
}

torch::Dtype float_dtype(const SafetensorsTensor& t, const std::string& label) {
  if (t.dtype == "F32") return torch::kFloat32;
  if (t.dtype == "F16") return torch::kFloat16;
  if (t.dtype == "BF16") return torch::kBFloat16;
  if (t.dtype == "F64") return torch::kFloat64;
  throw UsageError("'" + label + "': tensor '" + t.name + "' has dtype " + t.dtype +
                   "; expected F32, F16, BF16 or F64");
}

}  // namespace

// Copies the bytes (the mapping may be unaligned for the dtype) into a tensor
// on the device; NaN or Inf is refused, naming the tensor.
torch::Tensor safetensors_to_tensor(const SafetensorsTensor& t, const std::string& label, const torch::Device& device) {
  torch::Tensor cpu = torch::empty(t.shape, torch::TensorOptions().dtype(float_dtype(t, label)));
  if (!t.bytes.empty()) std::memcpy(cpu.data_ptr(), t.bytes.data(), t.bytes.size());
  if (!torch::isfinite(cpu).all().item<bool>())
    throw UsageError("'" + label + "': tensor '" + t.name + "' contains NaN or Inf (a broken training run?)");
  if (cpu.dtype() == torch::kFloat64) cpu = cpu.to(torch::kFloat32);
  return device.is_cpu() ? cpu : cpu.to(device);
}

std::string lora_cache_key(const std::filesystem::path& path) {
  std::error_code ec;
  const auto canon = std::filesystem::weakly_canonical(path, ec);
  const auto size = std::filesystem::file_size(path, ec);
  const auto mtime = std::filesystem::last_write_time(path, ec).time_since_epoch().count();
  return (ec ? path : canon).string() + "|" + std::to_string(ec ? 0 : size) + "|" + std::to_string(ec ? 0 : mtime);
}

LoraCache::LoraCache(ModelParamShapes shapes, torch::Device device, std::uint64_t budget_bytes, bool strict)
    : shapes_(std::move(shapes)), device_(device), strict_(strict) {
  stats_.budget_bytes = budget_bytes;
}

std::shared_ptr<LoadedLora> LoraCache::load(const LoraRef& ref, const std::string& key) {
  const SafetensorsFile f = SafetensorsFile::open(ref.path);
  const std::string label = f.label();
  const LoraKeyMap map = map_lora_keys(f.tensors(), shapes_, label);
  if (!map.unmatched.empty()) {
    std::string list;
    for (size_t i = 0; i < map.unmatched.size() && i < 20; ++i) list += (i ? ", " : "") + map.unmatched[i];
    if (map.unmatched.size() > 20) list += ", ... (" + std::to_string(map.unmatched.size() - 20) + " more)";
    const std::string msg = "LoRA '" + label + "': " + std::to_string(map.unmatched.size()) +
                            " key(s) map to no weight of the model: " + list;
    if (strict_) throw UsageError(msg + " (--strict-lora)");
    spdlog::warn("{}", msg);
  }
  if (map.layers.empty())
    throw UsageError("LoRA '" + label + "': no key maps to a weight of this SDXL model (not a LoRA, or made for another model)");
  auto out = std::make_shared<LoadedLora>();
  out->key = key;
  out->name = ref.name;
  out->path = ref.path;
  out->format = map.format;
  {
    const auto [hash, s] = short_hash_once(key, f);
    out->short_hash = hash;
    stats_.hash_s += s;
    if (s > 0) spdlog::debug("LoRA '{}': hashed {:.1f} MiB in {:.3f} s", label, f.data_section().size() / 1048576.0, s);
  }
  for (const auto& l : map.layers) {
    LoraFactor fac;
    fac.target = l.target;
    fac.param = l.param;
    fac.down = safetensors_to_tensor(*f.find(l.down), label, device_);
    fac.up = safetensors_to_tensor(*f.find(l.up), label, device_);
    const double rank = static_cast<double>(fac.down.size(0));
    if (!l.alpha.empty()) {
      const double alpha = safetensors_scalar(*f.find(l.alpha), label);
      if (!std::isfinite(alpha))
        throw UsageError("LoRA '" + label + "': tensor '" + l.alpha + "' (alpha) is NaN or Inf");
      fac.scale = alpha / rank;
    }
    out->bytes += fac.down.nbytes() + fac.up.nbytes();
    out->factors.push_back(std::move(fac));
  }
  return out;
}

void LoraCache::evict_for(std::uint64_t bytes, const std::vector<std::string>& keep) {
  for (auto it = lru_.end(); it != lru_.begin() && stats_.bytes_held + bytes > stats_.budget_bytes;) {
    --it;
    auto e = entries_.find(*it);
    if (e->second.pinned || std::find(keep.begin(), keep.end(), *it) != keep.end()) continue;
    spdlog::info("LoRA cache: evicting '{}' ({:.1f} MiB)", e->second.lora->name, e->second.lora->bytes / 1048576.0);
    stats_.bytes_held -= e->second.lora->bytes;
    ++stats_.evictions;
    entries_.erase(e);
    it = lru_.erase(it);
  }
}

std::shared_ptr<const LoadedLora> LoraCache::get(const LoraRef& ref, const std::vector<std::string>& keep) {
  const std::string key = lora_cache_key(ref.path);
  if (auto e = entries_.find(key); e != entries_.end()) {
    ++stats_.hits;
    e->second.pinned = e->second.pinned || ref.pin;
    lru_.remove(key);
    lru_.push_front(key);
    return e->second.lora;
  }
  ++stats_.misses;
  const auto t0 = Clock::now();
  auto lora = load(ref, key);
  stream_synchronize(device_);  // this stage's stream only: sampling goes on meanwhile
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  stats_.load_s += s;
  spdlog::info("LoRA '{}' ({}, {} layers, {:.1f} MiB, hash {}) loaded in {:.3f} s", lora->name, lora->format,
               lora->factors.size(), lora->bytes / 1048576.0, lora->short_hash, s);
  evict_for(lora->bytes, keep);
  if (stats_.bytes_held + lora->bytes > stats_.budget_bytes)
    spdlog::warn("LoRA cache holds {:.1f} MiB over its budget of {:.1f} MiB (pinned or in use)",
                 (stats_.bytes_held + lora->bytes - stats_.budget_bytes) / 1048576.0, stats_.budget_bytes / 1048576.0);
  entries_[key] = Entry{lora, ref.pin};
  lru_.push_front(key);
  stats_.bytes_held += lora->bytes;
  return lora;
}

}  // namespace sdxl
