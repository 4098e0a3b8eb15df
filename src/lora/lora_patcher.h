// LoraPatcher: makes a model's weights equal base + sum_i weight_i * alpha_i/rank_i
// * up_i @ down_i for a set of LoRAs, in place, on the weights' device. The sum is
// formed in fp32 from the kept original and cast back once. The first touch of
// a weight copies its original aside; a weight that the next set does not touch
// gets its original copied back, so after any sequence of sets the base weights
// are bit-identical. An FP8 weight (unet_fp8.ts: e4m3 with a per-tensor
// `<layer>.weight_scale`, per output channel for --fp8-conv's convolutions) is dequantised into the fp32 sum with its export scale
// and quantised again with that scale, or with amax / 448 where the sum reaches
// beyond kFp8KeepScaleUpTo x the scale, so no more than rounding is lost to the
// clamp at 448; restoring brings back both (docs/models-and-export.md#fp8-unet).
// Owns those copies (device memory, the size of the touched weights, or pinned
// host memory when asked). Not thread-safe; call outside inference.
#pragma once

#include <torch/script.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lora/lora_cache.h"
#include "lora/lora_keys.h"

namespace sdxl {

struct SdxlModel;

// Where a device's LoRA originals are kept: in pinned host memory on a CUDA
// budget (the card, or --vram-limit) under 32 GiB. The originals of the
// weights a LoRA patches take as much memory again as those weights (an SDXL
// LoRA of every attention and feed-forward layer patches most of the UNet's
// 6.5 GiB), which a 12 or 16 GB card does not have beside the working memory;
// a simulated card (--vram-limit 24GiB on a bigger one) then keeps them where
// a real one of that size does.
constexpr std::uint64_t kLoraOriginalsOnDeviceFrom = 32ull << 30;
inline bool lora_originals_on_host(bool cuda, std::uint64_t budget_bytes) {
  return cuda && budget_bytes < kLoraOriginalsOnDeviceFrom;
}

// Up to this many export scales a merged FP8 value keeps the export scale (and a
// value beyond 448 is clamped: within half of e4m3's top step of 32).
constexpr double kFp8KeepScaleUpTo = 464.0;

class LoraPatcher {
 public:
  // originals_on_host: keep the originals in pinned host memory instead of
  // on the device (see lora_originals_on_host; ignored off CUDA); merging and
  // restoring then copy them up over PCIe.
  explicit LoraPatcher(SdxlModel& model, bool originals_on_host = false);

  // Parameter name -> shape of the three patchable modules (for key mapping).
  ModelParamShapes shapes() const;

  using Applied = std::vector<std::pair<std::shared_ptr<const LoadedLora>, double>>;  // LoRA, weight
  void apply(const Applied& set);
  void restore_all() { apply({}); }
  // Keeps the originals of the weights `set` patches that are not kept yet,
  // with the copies queued on the current stream, so that apply(set) finds
  // them: a set's first use pins host memory and copies ahead of its merge
  // (e.g. while the device still samples the batch before). The weights do
  // not change; apply() drops what the set it applies does not patch.
  void keep_originals(const Applied& set);

  std::size_t patched_weights() const { return originals_.size(); }
  std::uint64_t original_bytes() const;

 private:
  using WeightId = std::pair<int, std::string>;  // LoraTarget, parameter name
  void keep_original(const WeightId& id, const torch::Tensor& w);
  // Whether `f` patches a UNet weight that unet.pt2 compiled into its code.
  bool compiled_in(const LoraFactor& f) const;
  struct Fp8Scale {
    torch::Tensor live;      // the UNet's <layer>.weight_scale buffer (unet.pt2 shares it)
    torch::Tensor original;  // its export value
  };
  const Fp8Scale* fp8_scale(const WeightId& id) const;  // nullptr: not an FP8 weight
  static torch::Tensor requantise_fp8(torch::Tensor& acc, const Fp8Scale& s);
  static void say_grown(const Applied& set, const torch::Tensor& growths);

  std::array<std::map<std::string, torch::Tensor>, 3> params_;
  std::map<std::string, Fp8Scale> fp8_scales_;  // UNet weight name -> its scale (FP8 weights only)
  std::map<WeightId, torch::Tensor> originals_;
  bool originals_on_host_ = false;
  const std::set<std::string>* compiled_in_ = nullptr;  // SdxlModel::unet_params_compiled_in
};

}  // namespace sdxl
