#include "model/aoti_package.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/script.h>

#include <unordered_map>

#include "core/error.h"
#include "device/device_errors.h"
#include "model/sdxl_model.h"

namespace sdxl {

AotiPackage::AotiPackage(const std::filesystem::path& path, const AotiConfig& config, const c10::Device& device,
                         const torch::jit::Module& weights, const std::string& weights_file,
                         const std::string& torch_version)
    : config_(config), device_(device) {
  try {
    // Single-threaded: the container then runs without its own events and
    // locks, which CUDA graph capture refuses ("operation not permitted when
    // stream is capturing"); bench/probes/gpu_aoti_probe.py graph_mt / graph_st
    // shows the difference.
    loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
        path.string(), "model", /*run_single_threaded=*/true, /*num_runners=*/1,
        device.is_cuda() ? device.index() : static_cast<c10::DeviceIndex>(-1));
  } catch (const c10::Error& e) {
    throw ModelError("cannot load AOTInductor package '" + path.string() + "': " + e.what_without_backtrace() +
                     " (was it compiled by scripts/export_sdxl.py --aoti with torch " + torch_version +
                     " on a machine like this one?)");
  } catch (const std::exception& e) {
    throw ModelError("cannot load AOTInductor package '" + path.string() + "': " + e.what());
  }

  // The package's constants are the module's parameters by their state-dict
  // names, which are also the TorchScript module's names (export_sdxl.py checks both).
  const std::map<std::string, at::Tensor> by_name = named_tensors(weights);
  std::unordered_map<std::string, at::Tensor> constants;
  for (const auto& fqn : loader_->get_constant_fqns()) {
    auto it = by_name.find(fqn);
    if (it == by_name.end())
      throw ModelError("'" + path.string() + "' needs the constant '" + fqn + "', which " + weights_file +
                       " does not have: the two are from different exports; export the model again with --aoti");
    if (!it->second.is_contiguous())
      throw ModelError("'" + path.string() + "': parameter '" + fqn + "' of " + weights_file + " is not contiguous");
    constants.emplace(fqn, it->second);
  }
  constants_ = static_cast<int>(constants.size());
  for (const auto& [name, t] : by_name)
    if (!constants.count(name)) compiled_in_.insert(name);
  try {
    // user_managed: the runner keeps these tensors (no copy), so in-place
    // changes of the TorchScript parameters reach it. check_full_update: every
    // constant must be given.
    loader_->load_constants(constants, /*use_inactive=*/false, /*check_full_update=*/true, /*user_managed=*/true);
  } catch (const c10::Error& e) {
    throw ModelError("'" + path.string() + "': cannot hand it the weights of " + weights_file + ": " +
                     e.what_without_backtrace());
  }
}

AotiPackage::~AotiPackage() = default;

at::Tensor AotiPackage::run(std::vector<at::Tensor> inputs, const char* name) {
  std::lock_guard<std::mutex> lock(mu_);
  return translate_device_errors(name, [&] {
    std::vector<at::Tensor> out;
    if (device_.is_cuda()) {
      c10::cuda::CUDAGuard guard(device_);
      void* stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
      out = loader_->run(inputs, stream);
    } else {
      out = loader_->run(inputs);
    }
    if (out.size() != 1)
      throw TaskError(std::string(name) + " failed: expected 1 output, got " + std::to_string(out.size()));
    return out[0];
  });
}

}  // namespace sdxl
