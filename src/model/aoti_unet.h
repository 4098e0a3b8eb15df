// AotiUnet: the UNet as an AOTInductor package (unet.pt2 or unet_fp8.pt2,
// written by scripts/export_sdxl.py --aoti; model/aoti_package.h). Its weights
// are the TorchScript UNet's own parameter tensors, so the LoRA patcher, which
// writes those in place, changes what the AOTI UNet computes exactly as it
// changes the TorchScript one. Its inputs must have the compiled dtypes and be
// contiguous (run() casts them) and fall inside the compiled ranges (covers());
// outside them the caller uses the TorchScript module.
#pragma once

#include <torch/types.h>

#include <memory>
#include <string>

#include "model/aoti_package.h"

namespace sdxl {

struct SdxlModel;

class AotiUnet {
 public:
  // Throws ModelError when the model has no unet.pt2, when it was compiled for
  // another device or dtype than the model runs in, or when it cannot be loaded
  // or its constants do not match the TorchScript UNet's parameters.
  explicit AotiUnet(SdxlModel& model);
  ~AotiUnet();
  AotiUnet(const AotiUnet&) = delete;
  AotiUnet& operator=(const AotiUnet&) = delete;

  // Whether latents x [rows, 4, h, w] with context [rows, tokens, dim] are in
  // the ranges the package was compiled for.
  bool covers(const torch::Tensor& x, const torch::Tensor& context) const;
  // Noise prediction (the model dtype). A failure throws TaskError
  // (OutOfMemoryError for an out-of-memory), like run_module().
  torch::Tensor run(const torch::Tensor& x, const torch::Tensor& t, const torch::Tensor& context,
                    const torch::Tensor& pooled, const torch::Tensor& time_ids);
  // "rows 1..16, tokens 77..308, latent 32..192 x 32..192" (for messages).
  std::string ranges() const;
  int constants() const { return package_->constants(); }

 private:
  SdxlModel& model_;
  std::unique_ptr<AotiPackage> package_;
};

}  // namespace sdxl
