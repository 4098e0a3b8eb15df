#include "control/ip_adapter.h"

#include "control/clip_image.h"
#include "core/error.h"
#include "device/device.h"

namespace sdxl {

IpAdapter::IpAdapter(const IpAdapterConfig& config, const SdxlModel& model)
    : config_(config), device_(model.device) {
  check_ip_adapter_fits(config, model.config);
  const torch::Dtype exported = parse_dtype(config.dtype);
  encoder_ = load_traced_module(config.dir / config.encoder_file, model.device, exported, model.dtype, "");
  adapter_ = load_traced_module(config.dir / config.adapter_file, model.device, exported, model.dtype, "");
  for (const torch::jit::Module* m : {&encoder_, &adapter_})
    for (const at::Tensor& p : m->parameters()) weight_bytes_ += p.numel() * p.element_size();
  c10::InferenceMode inference;
  const std::int64_t s = config.image_size;
  const torch::Tensor zero_pixels = torch::zeros({1, 3, s, s}, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
  // The first call of each module is discarded (as the UNet's first call of a
  // shape, unet_runner.h), so no reference depends on being the first encoded.
  const torch::Tensor zero_out = encode(zero_pixels);
  (void)encode(zero_pixels);
  (void)project(zero_out);
  negative_ = project(config.negative_zero_image ? zero_out : torch::zeros_like(zero_out));
}

torch::Tensor IpAdapter::encode(const torch::Tensor& pixels) {
  const c10::IValue out = run_module(encoder_, "IP-Adapter image encoder", {pixels});
  if (!out.isTensor())
    throw ModelError("'" + (config_.dir / config_.encoder_file).string() + "' returned no tensor: re-export it");
  return out.toTensor();
}

std::vector<torch::Tensor> IpAdapter::project(const torch::Tensor& embeds) {
  const c10::IValue out = run_module(adapter_, "IP-Adapter", {embeds});
  const std::string file = (config_.dir / config_.adapter_file).string();
  if (!out.isTuple()) throw ModelError("'" + file + "' returned no tuple of keys and values: re-export it");
  std::vector<torch::Tensor> kv;
  for (const c10::IValue& v : out.toTupleRef().elements()) kv.push_back(v.toTensor());
  if (kv.size() != 2 * config_.layers.size())
    throw ModelError("'" + file + "' returned " + std::to_string(kv.size()) + " tensors, model.json records " +
                     std::to_string(config_.layers.size()) + " layers (a key and a value each)");
  if (kv.front().dim() != 3 || kv.front().size(1) != config_.tokens)
    throw ModelError("'" + file + "' returned keys of shape " + c10::str(kv.front().sizes()) + ", model.json records " +
                     std::to_string(config_.tokens) + " tokens per image: re-export it");
  return kv;
}

std::vector<torch::Tensor> IpAdapter::image_kv(const RgbImage& image) {
  c10::InferenceMode inference;
  const torch::Tensor pixels = clip_image_tensor(image, config_.image_size, config_.mean, config_.std).to(device_);
  return project(encode(pixels));
}

std::vector<torch::Tensor> concat_image_kv(const std::vector<const std::vector<torch::Tensor>*>& images) {
  if (images.size() == 1) return *images.front();
  std::vector<torch::Tensor> out(images.front()->size());
  for (size_t l = 0; l < out.size(); ++l) {
    std::vector<torch::Tensor> parts;
    for (const auto* kv : images) parts.push_back((*kv)[l]);
    out[l] = torch::cat(parts, 1);
  }
  return out;
}

}  // namespace sdxl
