#include "model/aoti_unet.h"

#include <spdlog/spdlog.h>

#include "model/sdxl_model.h"
#include "device/device.h"
#include "core/error.h"

namespace sdxl {

AotiUnet::AotiUnet(SdxlModel& model) : model_(model) {
  const ModelConfig& cfg = model.config;
  const AotiConfig& a = cfg.unet_aoti;
  if (const std::string unfit = unet_aoti_mismatch(cfg, model.device.is_cuda() ? "cuda" : "cpu",
                                                   dtype_name(model.dtype), cuda_capability(model.device));
      !unfit.empty())
    throw ModelError("--unet-backend aoti: model '" + cfg.name + "' (" + cfg.dir.string() + "): " + unfit);
  const auto path = cfg.path_of(a.file);
  package_ = std::make_unique<AotiPackage>(path, a, model.device, model.unet, cfg.unet_file, cfg.torch_version);
  model.unet_params_compiled_in = package_->compiled_in();
  if (!model.unet_params_compiled_in.empty()) {
    std::string names;
    for (const auto& n : model.unet_params_compiled_in) names += (names.empty() ? "" : ", ") + n;
    spdlog::debug("{} holds these UNet parameters as literals in its code (LoRAs cannot change them): {}", a.file, names);
  }
  spdlog::info("UNet backend aoti: {} ({}), {} constants shared with {}; compiled for {}", path.string(), a.device,
               package_->constants(), cfg.unet_file, ranges());
}

AotiUnet::~AotiUnet() = default;

std::string AotiUnet::ranges() const {
  const AotiConfig& a = package_->config();
  auto r = [](int lo, int hi) { return lo == hi ? std::to_string(lo) : std::to_string(lo) + ".." + std::to_string(hi); };
  return "rows " + r(a.rows_min, a.rows_max) + ", tokens " + r(a.tokens_min, a.tokens_max) + ", latent " +
         r(a.latent_height_min, a.latent_height_max) + " x " + r(a.latent_width_min, a.latent_width_max);
}

bool AotiUnet::covers(const torch::Tensor& x, const torch::Tensor& context) const {
  const AotiConfig& a = package_->config();
  return x.dim() == 4 && context.dim() == 3 && a.covers_latents(x.size(0), x.size(2), x.size(3)) &&
         context.size(1) >= a.tokens_min && context.size(1) <= a.tokens_max;
}

torch::Tensor AotiUnet::run(const torch::Tensor& x, const torch::Tensor& t, const torch::Tensor& context,
                            const torch::Tensor& pooled, const torch::Tensor& time_ids) {
  // The compiled code assumes the export's dtypes and contiguous strides (it does not check them).
  const auto dt = model_.dtype;
  std::vector<at::Tensor> inputs{x.to(dt).contiguous(), t.to(torch::kFloat32).contiguous(), context.to(dt).contiguous(),
                                 pooled.to(dt).contiguous(), time_ids.to(dt).contiguous()};
  return package_->run(std::move(inputs), "unet (aoti)");
}

}  // namespace sdxl
