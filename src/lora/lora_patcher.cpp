#include "lora/lora_patcher.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "model/sdxl_model.h"
#include "core/error.h"

namespace sdxl {

LoraPatcher::LoraPatcher(SdxlModel& model, bool originals_on_host) {
  originals_on_host_ = originals_on_host && model.device.is_cuda();
  compiled_in_ = &model.unet_params_compiled_in;
  torch::jit::Module* modules[3] = {&model.text_encoder, &model.text_encoder_2, &model.unet};
  for (int i = 0; i < 3; ++i)
    for (const auto& p : modules[i]->named_parameters(/*recurse=*/true)) params_[i].emplace(p.name, p.value);
  const std::string suffix = ".weight_scale";
  for (const auto& b : model.unet.named_buffers(/*recurse=*/true))
    if (b.name.size() > suffix.size() && b.name.compare(b.name.size() - suffix.size(), suffix.size(), suffix) == 0)
      fp8_scales_.emplace(b.name.substr(0, b.name.size() - suffix.size()) + ".weight", b.value);
}

ModelParamShapes LoraPatcher::shapes() const {
  ModelParamShapes s;
  for (int i = 0; i < 3; ++i)
    for (const auto& [name, t] : params_[i]) s.params[i].emplace(name, std::vector<std::int64_t>(t.sizes().begin(), t.sizes().end()));
  return s;
}

std::uint64_t LoraPatcher::original_bytes() const {
  std::uint64_t n = 0;
  for (const auto& [k, t] : originals_) n += t.nbytes();
  return n;
}

bool LoraPatcher::compiled_in(const LoraFactor& f) const {
  return f.target == LoraTarget::kUnet && compiled_in_ && compiled_in_->count(f.param);
}

void LoraPatcher::keep_original(const WeightId& id, const torch::Tensor& w) {
  torch::Tensor keep;
  if (originals_on_host_) {
    keep = torch::empty(w.sizes(), w.options().device(torch::kCPU).pinned_memory(true));
    keep.copy_(w, /*non_blocking=*/true);
  } else {
    keep = w.clone();
  }
  originals_.emplace(id, std::move(keep));
}

void LoraPatcher::keep_originals(const Applied& set) {
  torch::NoGradGuard no_grad;
  for (const auto& [lora, weight] : set)
    for (const auto& f : lora->factors) {
      const WeightId id{static_cast<int>(f.target), f.param};
      if (originals_.count(id) || compiled_in(f))
        continue;  // kept already (the weight may be patched now), or apply() refuses it
      keep_original(id, params_[id.first].at(id.second));  // not kept: the weight is its original
    }
}

void LoraPatcher::apply(const Applied& set) {
  torch::NoGradGuard no_grad;
  // Deltas per weight, in the order the set lists them.
  std::map<WeightId, std::vector<std::pair<const LoraFactor*, double>>> touched;
  for (const auto& [lora, weight] : set)
    for (const auto& f : lora->factors) {
      if (compiled_in(f))
        throw UsageError("LoRA '" + lora->name + "' patches the UNet's '" + f.param +
                         "', which unet.pt2 compiled into its code (--unet-backend aoti cannot change it); "
                         "use --unet-backend torchscript for this LoRA");
      touched[{static_cast<int>(f.target), f.param}].emplace_back(&f, weight);
    }

  // Weights no longer touched: copy the original back (bit-identical) and drop it.
  for (auto it = originals_.begin(); it != originals_.end();) {
    if (touched.count(it->first)) {
      ++it;
      continue;
    }
    // From pinned host memory the copy is queued on the stream (the host
    // allocator keeps the block until it has run); from the device it is too.
    params_[it->first.first].at(it->first.second).copy_(it->second, /*non_blocking=*/true);
    it = originals_.erase(it);
  }
  // One fp32 scratch holds each weight's sum in turn (kernels on the stream
  // run in order, so the next weight's use waits for this one's): no device
  // allocation per weight, which near a --vram-limit cap would make the
  // allocator release and map segments again.
  std::int64_t most = 0;
  for (const auto& [id, deltas] : touched) most = std::max(most, params_[id.first].at(id.second).numel());
  torch::Tensor scratch;
  if (most > 0) {
    const torch::Tensor& any = params_[touched.begin()->first.first].at(touched.begin()->first.second);
    scratch = torch::empty({most}, any.options().dtype(torch::kFloat32));
  }
  torch::Tensor saturated;  // FP8 values beyond +-448 * scale, counted on the device
  std::int64_t fp8_values = 0;
  for (const auto& [id, deltas] : touched) {
    torch::Tensor& w = params_[id.first].at(id.second);
    torch::Tensor acc = scratch.narrow(0, 0, w.numel()).view(w.sizes());
    auto orig = originals_.find(id);
    if (orig == originals_.end()) {  // first touch: w is the original
      keep_original(id, w);          // queued before the w.copy_ below, on the same stream
      acc.copy_(w);
    } else if (orig->second.device() == w.device()) {
      acc.copy_(orig->second);
    } else {
      // Rule: copy host -> device in the weight's own dtype (queued from pinned
      // memory), then widen on the device. A copy that also changes the dtype
      // converts on the CPU from pageable memory, one synchronous copy per
      // weight (measured: docs/gpu-benchmarks.md, results).
      w.copy_(orig->second, /*non_blocking=*/true);
      acc.copy_(w);
    }
    const auto fp8 = id.first == static_cast<int>(LoraTarget::kUnet) ? fp8_scales_.find(id.second) : fp8_scales_.end();
    if (fp8 != fp8_scales_.end()) acc.mul_(fp8->second);  // e4m3 -> the weight it stands for
    // acc is contiguous: its [out, in*kh*kw] view takes each product in place.
    torch::Tensor acc2d = acc.view({acc.size(0), -1});
    for (const auto& [f, weight] : deltas) {
      // up [out, r(,1,1)] @ down [r, in(,kh,kw)] -> the weight's shape (LoCon convs too).
      const torch::Tensor up = f->up.to(torch::kFloat32).flatten(1);
      const torch::Tensor down = f->down.to(torch::kFloat32).flatten(1);
      acc2d.addmm_(up, down, /*beta=*/1.0, /*alpha=*/weight * f->scale);
    }
    if (fp8 != fp8_scales_.end()) {
      acc.div_(fp8->second);
      const torch::Tensor over = acc.abs().gt(448.0).sum();
      saturated = saturated.defined() ? saturated.add_(over) : over;
      fp8_values += acc.numel();
      acc.clamp_(-448.0, 448.0);  // e4m3's finite range; copy_ rounds to nearest
    }
    w.copy_(acc);
  }
  if (fp8_values > 0) warn_saturated(set, saturated.item<std::int64_t>(), fp8_values);
}

// The FP8 weights keep their export scale, so a LoRA that pushes a weight beyond
// 448 * scale is clipped there: said once per set, with the share of values clipped.
void LoraPatcher::warn_saturated(const Applied& set, std::int64_t saturated, std::int64_t values) {
  if (saturated == 0) return;
  std::string names;
  for (const auto& [lora, weight] : set) names += (names.empty() ? "" : ", ") + lora->name;
  spdlog::warn("LoRA set [{}]: {} of the {} values it changes in FP8 weights ({:.3f} %) exceed the weights' export "
               "scale and are clipped at +-448 * scale (--precision fp8; docs/models-and-export.md#fp8-unet)",
               names, saturated, values, 100.0 * static_cast<double>(saturated) / static_cast<double>(values));
}

}  // namespace sdxl
