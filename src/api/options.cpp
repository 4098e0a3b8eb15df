#include "api/options.h"

namespace sdxl::api {

RuntimeOptions runtime_options(const sdxl_batch::ModelOptions& m,
                               const std::vector<std::filesystem::path>& batch_embedding_dirs) {
  RuntimeOptions r;
  r.device = m.device;
  r.dtype = m.dtype;
  r.precision = m.precision;
  r.threads = m.threads;
  r.jit_optimize = m.jit_optimize;
  r.cudnn_benchmark = m.cudnn_benchmark;
  r.deterministic_cudnn = m.deterministic_cudnn;
  r.cuda_allocator = m.cuda_allocator;
  r.cuda_graphs = m.cuda_graphs;
  r.unet_backend = m.unet_backend;
  r.vae_backend = m.vae_backend;
  r.vae_tiling = m.vae_tiling;
  r.vae_dtype = m.vae_dtype;
  r.vae_cache = m.vae_cache;
  r.controlnet_cache = m.controlnet_cache;
  r.ip_adapter_cache = m.ip_adapter_cache;
  r.ip_image_cache = m.ip_image_cache;
  r.upscaler_cache = m.upscaler_cache;
  r.detector_cache = m.detector_cache;
  r.lora_dirs.assign(m.lora_dirs.begin(), m.lora_dirs.end());
  r.lora_cache_bytes = m.lora_cache_bytes;
  r.lora_strict = m.lora_strict;
  r.embedding_dirs.assign(m.embedding_dirs.begin(), m.embedding_dirs.end());
  r.embedding_dirs.insert(r.embedding_dirs.end(), batch_embedding_dirs.begin(), batch_embedding_dirs.end());
  return r;
}

}  // namespace sdxl::api
