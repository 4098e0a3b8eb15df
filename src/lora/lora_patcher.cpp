#include "lora/lora_patcher.h"

#include <algorithm>
#include <limits>

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
      fp8_scales_.emplace(b.name.substr(0, b.name.size() - suffix.size()) + ".weight",
                          Fp8Scale{b.value, b.value.clone()});
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
    if (const Fp8Scale* s = fp8_scale(it->first)) s->live.copy_(s->original);
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
  std::vector<torch::Tensor> growths;  // per FP8 weight, new scale / export scale (on the device)
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
    const Fp8Scale* fp8 = fp8_scale(id);
    if (fp8) acc.mul_(fp8->original);  // e4m3 -> the weight it stands for
    // acc is contiguous: its [out, in*kh*kw] view takes each product in place.
    torch::Tensor acc2d = acc.view({acc.size(0), -1});
    for (const auto& [f, weight] : deltas) {
      // up [out, r(,1,1)] @ down [r, in(,kh,kw)] -> the weight's shape (LoCon convs too).
      const torch::Tensor up = f->up.to(torch::kFloat32).flatten(1);
      const torch::Tensor down = f->down.to(torch::kFloat32).flatten(1);
      acc2d.addmm_(up, down, /*beta=*/1.0, /*alpha=*/weight * f->scale);
    }
    if (fp8) growths.push_back(requantise_fp8(acc, *fp8));
    w.copy_(acc);
  }
  if (!growths.empty()) say_grown(set, torch::stack(growths).cpu());
}

const LoraPatcher::Fp8Scale* LoraPatcher::fp8_scale(const WeightId& id) const {
  if (id.first != static_cast<int>(LoraTarget::kUnet)) return nullptr;
  const auto it = fp8_scales_.find(id.second);
  return it == fp8_scales_.end() ? nullptr : &it->second;
}

// acc (fp32, the merged weight) -> e4m3 in place. Rule: the export scale s
// stays while amax|acc| <= 464 s (a value up to there loses no more to the
// clamp at 448 than to rounding: e4m3's top step is 32); beyond, the scale
// becomes amax / 448, so nothing is clipped. s is per tensor (a linear layer)
// or per output channel ([Cout, 1, 1, 1]: an --fp8-conv convolution; each
// channel keeps its scale or takes the weight's amax / 448). Returns the
// largest growth (new scale / s) as a 0-dim device tensor: no sync.
torch::Tensor LoraPatcher::requantise_fp8(torch::Tensor& acc, const Fp8Scale& s) {
  // The inf-norm is a reduction: no temporary the size of the weight.
  const torch::Tensor amax = at::linalg_vector_norm(acc, std::numeric_limits<double>::infinity());
  s.live.copy_(torch::where(amax.gt(s.original.mul(kFp8KeepScaleUpTo)), amax.div(448.0), s.original));
  acc.div_(s.live).clamp_(-448.0, 448.0);  // e4m3's finite range; the copy into the weight rounds to nearest
  return s.live.div(s.original).max();
}

// A LoRA that pushes an FP8 weight beyond its export range coarsens that
// weight's steps instead of clipping it: said once per set.
void LoraPatcher::say_grown(const Applied& set, const torch::Tensor& growths) {
  const auto weights = growths.gt(1.0).sum().item<std::int64_t>();
  if (weights == 0) return;
  std::string names;
  for (const auto& [lora, weight] : set) names += (names.empty() ? "" : ", ") + lora->name;
  spdlog::info("LoRA set [{}]: {} FP8 weight(s) it changes reach beyond their export range; their scale grows "
               "(at most {:.2f}x) so that nothing is clipped (--precision fp8; docs/models-and-export.md#fp8-unet)",
               names, weights, growths.max().item<float>());
}

}  // namespace sdxl
