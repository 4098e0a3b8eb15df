// LruCache: values by key, keeping the `capacity` most recently used; counts
// loads, hits and evictions. Thread-safe: get() holds the cache's lock while
// it loads, so a key is loaded once even when two stages ask at the same time.
// A value evicted while a caller still holds it lives until that caller lets
// it go (shared_ptr). A value with weight_bytes() (a model's weights on its device) is counted in
// stats().resident_bytes. Header-only, torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace sdxl {

struct LruCacheStats {
  int loads = 0, hits = 0, evictions = 0;
  std::uint64_t resident_bytes = 0;  // the cached values' weight_bytes() (0 when T has none)
};

template <class T>
class LruCache {
 public:
  explicit LruCache(std::size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  // The value of `key`. On a miss `load()` makes it (when it throws, the cache
  // is left as it was), and `evicted(key)` is called for each key dropped to
  // make room; `*loaded` (when given) says whether this call loaded.
  template <class Load, class Evicted>
  std::shared_ptr<T> get(const std::string& key, Load&& load, Evicted&& evicted, bool* loaded = nullptr) {
    const std::lock_guard lock(mu_);
    if (loaded) *loaded = false;
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
      if (it->first != key) continue;
      ++stats_.hits;
      lru_.splice(lru_.begin(), lru_, it);
      return lru_.front().second;
    }
    std::shared_ptr<T> value = load();
    ++stats_.loads;
    if (loaded) *loaded = true;
    lru_.emplace_front(key, value);
    while (lru_.size() > capacity_) {
      evicted(lru_.back().first);
      lru_.pop_back();
      ++stats_.evictions;
    }
    return value;
  }

  // f(value) for each cached value (the lock held).
  template <class F>
  void for_each(F&& f) const {
    const std::lock_guard lock(mu_);
    for (const auto& [key, value] : lru_) f(*value);
  }

  LruCacheStats stats() const {
    const std::lock_guard lock(mu_);
    LruCacheStats s = stats_;
    if constexpr (requires(const T& v) { static_cast<std::uint64_t>(v.weight_bytes()); })
      for (const auto& [key, value] : lru_) s.resident_bytes += value->weight_bytes();
    return s;
  }
  std::size_t size() const {
    const std::lock_guard lock(mu_);
    return lru_.size();
  }
  std::size_t capacity() const { return capacity_; }

 private:
  std::size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<T>>> lru_;  // most recent first
  LruCacheStats stats_;
};

}  // namespace sdxl
