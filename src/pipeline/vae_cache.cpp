#include "pipeline/vae_cache.h"

#include <spdlog/spdlog.h>

#include "image/vae_decode.h"

namespace sdxl {

VaeCache::VaeCache(SdxlModel& model, std::string decode_dtype, std::size_t capacity)
    : model_(model), decode_dtype_(std::move(decode_dtype)), capacity_(capacity == 0 ? 1 : capacity) {}

std::uint64_t vae_weight_bytes(const SdxlModel& vae) {
  std::uint64_t n = 0;
  auto add = [&n](const torch::jit::Module& m) {
    for (const at::Tensor& p : m.parameters()) n += p.numel() * p.element_size();
  };
  add(vae.vae_decoder);
  if (vae.vae_encoder) add(*vae.vae_encoder);
  if (vae.vae_decoder_fp32) add(*vae.vae_decoder_fp32);
  return n;
}

std::shared_ptr<SdxlModel> VaeCache::get(const std::string& folder) {
  if (folder.empty()) return std::shared_ptr<SdxlModel>(std::shared_ptr<void>(), &model_);  // not owned
  const std::lock_guard lock(mu_);
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->first != folder) continue;
    ++stats_.hits;
    lru_.splice(lru_.begin(), lru_, it);
    return lru_.front().second;
  }
  std::shared_ptr<SdxlModel> vae = SdxlModel::load_vae(load_vae_config(folder), model_);
  set_vae_decode_dtype(*vae, decode_dtype_);
  ++stats_.loads;
  lru_.emplace_front(folder, vae);
  while (lru_.size() > capacity_) {
    spdlog::info("VAE '{}' evicted from the VAE cache ({} VAEs at most)", lru_.back().first, capacity_);
    lru_.pop_back();
    ++stats_.evictions;
  }
  stats_.resident_bytes = 0;
  for (const auto& [name, v] : lru_) stats_.resident_bytes += vae_weight_bytes(*v);
  spdlog::info("VAE '{}' loaded ({}, decode in {}): {:.1f} MiB; VAE cache {} of {}, {:.1f} MiB", folder,
               vae->config.name, c10::toString(vae->vae_decode_dtype), vae_weight_bytes(*vae) / 1048576.0,
               lru_.size(), capacity_, stats_.resident_bytes / 1048576.0);
  return vae;
}

VaeCacheStats VaeCache::stats() const {
  const std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace sdxl
