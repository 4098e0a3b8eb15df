// VaeCache: the VAEs tasks name ("vae" in a batch file, --vae on the CLI), next
// to the model's own. A VAE folder (export_sdxl.py --vae-only) is loaded on the
// device on first use and kept in a least-recently-used cache of `capacity`
// folders; its memory (the decoder's and encoder's weights) is counted and
// logged, and evicting it frees it. "" names the model's own VAE, which is
// always resident. Thread-safe: the sampling stage (img2img, pixel-space hires
// fix) and the decode stage ask concurrently; a VAE evicted while a stage still
// holds it lives until that stage lets it go.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "core/lru_cache.h"
#include "model/sdxl_model.h"

namespace sdxl {


class VaeCache {
 public:
  // decode_dtype: --vae-dtype, applied to every VAE loaded (set_vae_decode_dtype).
  VaeCache(SdxlModel& model, std::string decode_dtype, std::size_t capacity);

  // The bundle whose VAE fields decode / encode for a task whose "vae" is `folder`
  // ("" = the model's own). UsageError (a task's failure, not the run's) when the folder
  // is not a VAE that fits or does not load.
  std::shared_ptr<SdxlModel> get(const std::string& folder);
  // resident_bytes: the weights of the cached VAE folders (not the model's own).
  LruCacheStats stats() const;
  // Images the cached VAE folders decoded on the model's vae_decoder.pt2
  // (share_vae_decoder_aoti); an evicted folder's count goes with it.
  int aoti_decodes() const;

 private:
  SdxlModel& model_;
  std::string decode_dtype_;
  LruCache<SdxlModel> cache_;
  std::atomic<std::uint64_t> resident_bytes_{0};
};

// The weights' bytes of a VAE bundle's modules on the device.
std::uint64_t vae_weight_bytes(const SdxlModel& vae);

}  // namespace sdxl
