#include "model/aoti_unet.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <unordered_map>

#include "model/sdxl_model.h"
#include "device/device.h"
#include "core/error.h"

namespace sdxl {

AotiUnet::AotiUnet(SdxlModel& model) : model_(model) {
  const ModelConfig& cfg = model.config;
  const UnetAotiConfig& a = cfg.unet_aoti;
  if (const std::string unfit = unet_aoti_mismatch(cfg, model.device.is_cuda() ? "cuda" : "cpu",
                                                   dtype_name(model.dtype), cuda_capability(model.device));
      !unfit.empty())
    throw ModelError("--unet-backend aoti: model '" + cfg.name + "' (" + cfg.dir.string() + "): " + unfit);
  const auto path = cfg.path_of(a.file);
  try {
    // Single-threaded: the container then runs without its own events and
    // locks, which CUDA graph capture refuses ("operation not permitted when
    // stream is capturing"); bench/probes/gpu_aoti_probe.py graph_mt / graph_st
    // shows the difference. Only the sample thread calls it.
    loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
        path.string(), "model", /*run_single_threaded=*/true, /*num_runners=*/1,
        model.device.is_cuda() ? model.device.index() : static_cast<c10::DeviceIndex>(-1));
  } catch (const c10::Error& e) {
    throw ModelError("cannot load AOTInductor package '" + path.string() + "': " + e.what_without_backtrace() +
                     " (was it compiled by scripts/export_sdxl.py --aoti with torch " + cfg.torch_version +
                     " on a machine like this one?)");
  } catch (const std::exception& e) {
    throw ModelError("cannot load AOTInductor package '" + path.string() + "': " + e.what());
  }

  // The package's constants are the UNet's parameters by their state-dict names,
  // which are also the TorchScript module's parameter names (export_sdxl.py checks both).
  std::unordered_map<std::string, at::Tensor> by_name;
  for (const auto& p : model.unet.named_parameters(/*recurse=*/true)) by_name.emplace(p.name, p.value);
  for (const auto& b : model.unet.named_buffers(/*recurse=*/true)) by_name.emplace(b.name, b.value);
  std::unordered_map<std::string, at::Tensor> constants;
  for (const auto& fqn : loader_->get_constant_fqns()) {
    auto it = by_name.find(fqn);
    if (it == by_name.end())
      throw ModelError("'" + path.string() + "' needs the constant '" + fqn + "', which " + cfg.unet_file +
                       " does not have: unet.pt2 and unet.ts are from different exports; re-export with --aoti");
    if (!it->second.is_contiguous())
      throw ModelError("'" + path.string() + "': parameter '" + fqn + "' of " + cfg.unet_file + " is not contiguous");
    constants.emplace(fqn, it->second);
  }
  constants_ = static_cast<int>(constants.size());
  for (const auto& [name, t] : by_name)
    if (!constants.count(name)) model.unet_params_compiled_in.insert(name);
  if (!model.unet_params_compiled_in.empty()) {
    std::string names;
    for (const auto& n : model.unet_params_compiled_in) names += (names.empty() ? "" : ", ") + n;
    spdlog::debug("unet.pt2 holds these UNet parameters as literals in its code (LoRAs cannot change them): {}", names);
  }
  try {
    // user_managed: the runner keeps these tensors (no copy), so in-place LoRA
    // patches of the TorchScript parameters reach it. check_full_update: every
    // constant must be given.
    loader_->load_constants(constants, /*use_inactive=*/false, /*check_full_update=*/true, /*user_managed=*/true);
  } catch (const c10::Error& e) {
    throw ModelError("'" + path.string() + "': cannot hand it the weights of " + cfg.unet_file + ": " +
                     e.what_without_backtrace());
  }
  spdlog::info("UNet backend aoti: {} ({}), {} constants shared with {}; compiled for {}", path.string(), a.device,
               constants_, cfg.unet_file, ranges());
}

AotiUnet::~AotiUnet() = default;

std::string AotiUnet::ranges() const {
  const UnetAotiConfig& a = model_.config.unet_aoti;
  auto r = [](int lo, int hi) { return lo == hi ? std::to_string(lo) : std::to_string(lo) + ".." + std::to_string(hi); };
  return "rows " + r(a.rows_min, a.rows_max) + ", tokens " + r(a.tokens_min, a.tokens_max) + ", latent " +
         r(a.latent_height_min, a.latent_height_max) + " x " + r(a.latent_width_min, a.latent_width_max);
}

bool AotiUnet::covers(const torch::Tensor& x, const torch::Tensor& context) const {
  const UnetAotiConfig& a = model_.config.unet_aoti;
  auto in = [](std::int64_t v, int lo, int hi) { return v >= lo && v <= hi; };
  return x.dim() == 4 && context.dim() == 3 && in(x.size(0), a.rows_min, a.rows_max) &&
         in(x.size(2), a.latent_height_min, a.latent_height_max) &&
         in(x.size(3), a.latent_width_min, a.latent_width_max) && in(context.size(1), a.tokens_min, a.tokens_max);
}

torch::Tensor AotiUnet::run(const torch::Tensor& x, const torch::Tensor& t, const torch::Tensor& context,
                            const torch::Tensor& pooled, const torch::Tensor& time_ids) {
  // The compiled code assumes the export's dtypes and contiguous strides (it does not check them).
  const auto dt = model_.dtype;
  std::vector<at::Tensor> inputs{x.to(dt).contiguous(), t.to(torch::kFloat32).contiguous(), context.to(dt).contiguous(),
                                 pooled.to(dt).contiguous(), time_ids.to(dt).contiguous()};
  return translate_device_errors("unet (aoti)", [&] {
    std::vector<at::Tensor> out;
    if (model_.device.is_cuda()) {
      c10::cuda::CUDAGuard guard(model_.device);
      void* stream = c10::cuda::getCurrentCUDAStream(model_.device.index()).stream();
      out = loader_->run(inputs, stream);
    } else {
      out = loader_->run(inputs);
    }
    if (out.size() != 1) throw TaskError("unet (aoti) failed: expected 1 output, got " + std::to_string(out.size()));
    return out[0];
  });
}

}  // namespace sdxl
