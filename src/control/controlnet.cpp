#include "control/controlnet.h"

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "device/device.h"

namespace sdxl {

ControlNet::ControlNet(const ControlNetConfig& config, const SdxlModel& model)
    : config_(config), device_(model.device) {
  check_controlnet_fits(config, model.config);
  module_ = load_traced_module(config.dir / config.file, model.device, parse_dtype(config.dtype), model.dtype, "");
  for (const at::Tensor& p : module_.parameters()) weight_bytes_ += p.numel() * p.element_size();
}

std::vector<torch::Tensor> ControlNet::call(const std::vector<c10::IValue>& inputs) {
  const c10::IValue out = run_module(module_, "controlnet", inputs);
  if (!out.isTuple())
    throw ModelError("'" + (config_.dir / config_.file).string() + "' returned no tuple of residuals: re-export it");
  std::vector<torch::Tensor> r;
  for (const c10::IValue& v : out.toTupleRef().elements()) r.push_back(v.toTensor());
  if (r.size() != config_.outputs.channels.size())
    throw ModelError("'" + (config_.dir / config_.file).string() + "' returned " + std::to_string(r.size()) +
                     " residuals, model.json records " + std::to_string(config_.outputs.channels.size()));
  return r;
}

std::vector<torch::Tensor> ControlNet::residuals(const torch::Tensor& x, const torch::Tensor& t,
                                                 const torch::Tensor& context, const torch::Tensor& pooled,
                                                 const torch::Tensor& time_ids, const torch::Tensor& cond,
                                                 double strength) {
  const std::vector<c10::IValue> inputs{x, t, context, pooled, time_ids, cond};
  std::vector<std::int64_t> key(x.sizes().begin(), x.sizes().end());
  key.push_back(context.size(1));
  if (warmed_.insert(key).second) (void)call(inputs);  // discarded, see the header
  std::vector<torch::Tensor> r = call(inputs);
  // diffusers: [sample * conditioning_scale for sample in down_block_res_samples], and the mid one
  for (torch::Tensor& v : r) v = v * strength;
  return r;
}

std::vector<torch::Tensor> ControlNet::union_residuals(const torch::Tensor& x, const torch::Tensor& t,
                                                       const torch::Tensor& context, const torch::Tensor& pooled,
                                                       const torch::Tensor& time_ids, const torch::Tensor& cond,
                                                       const std::vector<std::int64_t>& types,
                                                       const std::vector<double>& scales) {
  if (!config_.is_union() || types.empty() || types.size() != scales.size() ||
      cond.size(0) != static_cast<std::int64_t>(types.size()))
    throw std::logic_error("ControlNet::union_residuals: a Union ControlNet with one scale and image per type");
  const auto on = torch::TensorOptions().device(device_);
  const torch::Tensor idx = torch::tensor(types, on.dtype(torch::kInt64));
  // diffusers: control_type = zeros(num_control_type).scatter_(0, control_mode, 1), one row per UNet row
  const torch::Tensor one_hot =
      torch::zeros({x.size(0), config_.union_type_count}, on.dtype(x.scalar_type())).index_fill_(1, idx, 1.0);
  const bool one = types.size() == 1;  // diffusers scales one image's outputs, several images' inputs
  const torch::Tensor in_scales =
      one ? torch::ones({1}, on.dtype(torch::kFloat32)) : torch::tensor(scales, torch::kFloat64).to(on.dtype(torch::kFloat32));
  const std::vector<c10::IValue> inputs{x, t, context, pooled, time_ids, cond, one_hot, idx, in_scales};
  std::vector<std::int64_t> key(x.sizes().begin(), x.sizes().end());
  key.push_back(context.size(1));
  key.push_back(-static_cast<std::int64_t>(types.size()));  // the image count (negative: never a plain call's key)
  if (warmed_.insert(key).second) (void)call(inputs);        // discarded, see the header
  std::vector<torch::Tensor> r = call(inputs);
  if (one)
    for (torch::Tensor& v : r) v = v * scales[0];
  return r;
}

void add_residuals(std::vector<torch::Tensor>& total, std::vector<torch::Tensor>&& add) {
  if (total.empty()) {
    total = std::move(add);
    return;
  }
  // diffusers' MultiControlNetModel: samples_prev + samples_curr, in the ControlNets' order
  for (size_t i = 0; i < total.size(); ++i) total[i] = total[i] + add[i];
}

}  // namespace sdxl
