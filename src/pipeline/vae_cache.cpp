#include "pipeline/vae_cache.h"

#include <spdlog/spdlog.h>

#include "image/vae_decode.h"

namespace sdxl {

VaeCache::VaeCache(SdxlModel& model, std::string decode_dtype, std::size_t capacity)
    : model_(model), decode_dtype_(std::move(decode_dtype)), cache_(capacity) {}

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
  bool loaded = false;
  std::shared_ptr<SdxlModel> vae = cache_.get(
      folder,
      [&] {
        return task_folder_errors([&] {
          std::shared_ptr<SdxlModel> v = SdxlModel::load_vae(load_vae_config(folder), model_);
          set_vae_decode_dtype(*v, decode_dtype_);
          share_vae_decoder_aoti(*v, model_);
          return v;
        });
      },
      [&](const std::string& key) {
        spdlog::info("VAE '{}' evicted from the VAE cache ({} VAEs at most)", key, cache_.capacity());
      },
      &loaded);
  if (loaded) {
    // Counted at load (an encoder or fp32 decoder loaded later by a stage is not read from here).
    std::uint64_t bytes = 0;
    cache_.for_each([&](const SdxlModel& v) { bytes += vae_weight_bytes(v); });
    resident_bytes_ = bytes;
    spdlog::info("VAE '{}' loaded ({}, decode in {}): {:.1f} MiB; VAE cache {} of {}, {:.1f} MiB", folder,
                 vae->config.name, c10::toString(vae->vae_decode_dtype), vae_weight_bytes(*vae) / 1048576.0,
                 cache_.size(), cache_.capacity(), bytes / 1048576.0);
  }
  return vae;
}

int VaeCache::aoti_decodes() const {
  int n = 0;
  cache_.for_each([&](const SdxlModel& v) { n += v.vae_aoti_decodes.load(); });
  return n;
}

LruCacheStats VaeCache::stats() const {
  LruCacheStats s = cache_.stats();
  s.resident_bytes = resident_bytes_.load();
  return s;
}

}  // namespace sdxl
