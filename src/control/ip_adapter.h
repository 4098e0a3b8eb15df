// IpAdapter: one IP-Adapter folder (export_sdxl.py --ip-adapter) on the
// model's device: its CLIP image encoder and its adapter (image projection +
// each cross-attention layer's to_k_ip / to_v_ip). A reference image becomes
// the keys and values the UNet's forward_ip adds attention over (diffusers'
// IPAdapterAttnProcessor2_0); they do not depend on the step, so they are made
// once per reference (IpAdapterCache) and never per UNet call. Calls are not
// thread-safe (the text stage's); the cache hands one out at a time.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <vector>

#include "image/png_reader.h"
#include "model/model_config.h"
#include "model/sdxl_model.h"

namespace sdxl {

class IpAdapter {
 public:
  // ModelError when the folder does not fit `model` (check_ip_adapter_fits) or does not load.
  IpAdapter(const IpAdapterConfig& config, const SdxlModel& model);

  // (k_0, v_0, k_1, v_1, ...) of one reference image, [1, tokens, width_l]
  // each in the model's dtype (the modules are loaded in it), unscaled. The
  // image is prepared as diffusers' CLIPImageProcessor does (control/clip_image.h).
  std::vector<torch::Tensor> image_kv(const RgbImage& image);
  // The same for the negative half of CFG, as diffusers makes it: the
  // projection of zero image embeddings (plain), or of the encoder's output
  // for an all-zero pixel tensor (plus). Computed at load.
  const std::vector<torch::Tensor>& negative_kv() const { return negative_; }

  const IpAdapterConfig& config() const { return config_; }
  std::uint64_t weight_bytes() const { return weight_bytes_; }

 private:
  torch::Tensor encode(const torch::Tensor& pixels);
  std::vector<torch::Tensor> project(const torch::Tensor& embeds);
  IpAdapterConfig config_;
  torch::Device device_;
  torch::jit::Module encoder_, adapter_;
  std::vector<torch::Tensor> negative_;
  std::uint64_t weight_bytes_ = 0;
};

// Several reference images of one adapter: each layer's keys and values
// concatenated along the tokens in the images' order (diffusers'
// MultiIPAdapterImageProjection flattens a list of images into one token row).
std::vector<torch::Tensor> concat_image_kv(const std::vector<const std::vector<torch::Tensor>*>& images);

}  // namespace sdxl
