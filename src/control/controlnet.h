// ControlNet: one ControlNet folder (export_sdxl.py --controlnet) loaded on the
// model's device, and the residuals it adds to the UNet's blocks at one model
// call (diffusers' ControlNetModel: down_block_res_samples and
// mid_block_res_sample, each times the conditioning scale). Calls are not
// thread-safe (the sampling stage's); the cache hands one out at a time.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <memory>
#include <set>
#include <vector>

#include "model/model_config.h"
#include "model/sdxl_model.h"

namespace sdxl {

class ControlNet {
 public:
  // ModelError when the folder does not fit `model` (check_controlnet_fits) or does not load.
  ControlNet(const ControlNetConfig& config, const SdxlModel& model);

  // Residuals for latents x [rows, 4, h, w] at timesteps t [rows] with the
  // bound conditioning and control images `cond` [rows, 3, 8h, 8w] in [0, 1],
  // each multiplied by `strength` (the down residuals, then the mid one). The
  // first call of a shape is discarded, as the UNet's is (unet_runner.h), so
  // an image does not depend on whether it came first.
  std::vector<torch::Tensor> residuals(const torch::Tensor& x, const torch::Tensor& t, const torch::Tensor& context,
                                       const torch::Tensor& pooled, const torch::Tensor& time_ids,
                                       const torch::Tensor& cond, double strength);

  // A Union ControlNet's residuals for one call with K control images `cond`
  // [K, rows, 3, 8h, 8w] of the types `types` (indices into the model's
  // types) at `scales` (each image's strength times its window's keep): as
  // diffusers' ControlNetUnionModel with control_type_idx = types and
  // conditioning_scale = scales; for K = 1 the residuals are scaled, for K > 1
  // each image's scale acts inside. Its transformer attends across the rows:
  // pass one image's rows (its CFG pair), as diffusers makes one image. The
  // first call of a shape is discarded, as residuals' is.
  std::vector<torch::Tensor> union_residuals(const torch::Tensor& x, const torch::Tensor& t,
                                             const torch::Tensor& context, const torch::Tensor& pooled,
                                             const torch::Tensor& time_ids, const torch::Tensor& cond,
                                             const std::vector<std::int64_t>& types, const std::vector<double>& scales);

  const ControlNetConfig& config() const { return config_; }
  std::uint64_t weight_bytes() const { return weight_bytes_; }

 private:
  std::vector<torch::Tensor> call(const std::vector<c10::IValue>& inputs);
  ControlNetConfig config_;
  torch::jit::Module module_;
  torch::Device device_;
  std::uint64_t weight_bytes_ = 0;
  std::set<std::vector<std::int64_t>> warmed_;
};

// Sums the residuals of several ControlNets into `total` (empty: takes `add`).
void add_residuals(std::vector<torch::Tensor>& total, std::vector<torch::Tensor>&& add);

}  // namespace sdxl
