// AotiPackage: a module compiled by AOTInductor (a .pt2 that
// scripts/export_sdxl.py --aoti writes beside the module's TorchScript file),
// without its weights, loaded with torch::inductor::AOTIModelPackageLoader.
// Its constants are the parameter and buffer tensors of that TorchScript
// module, by name, handed over as user-managed constants (no copy): the
// weights live once, and in-place changes to them (LoRA patches) reach the
// package. The compiled code assumes the export's dtypes and contiguous inputs
// and does not check them: callers pass exactly those. run() is serialised by
// a mutex and runs on the calling thread's current CUDA stream; the loader
// runs single-threaded, which CUDA graph capture needs.
#pragma once

#include <torch/types.h>

#include <filesystem>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace torch::inductor {
class AOTIModelPackageLoader;
}
namespace torch::jit {
struct Module;
}

namespace sdxl {

class AotiPackage {
 public:
  // config: what model.json records of it (its input ranges). weights: the
  // TorchScript module whose tensors are the constants, named `weights_file`
  // in messages. Throws ModelError when the package cannot be loaded
  // (torch_version: the export's, for the hint) or needs a constant the
  // module lacks or holds non-contiguous.
  AotiPackage(const std::filesystem::path& path, const AotiConfig& config, const c10::Device& device,
              const torch::jit::Module& weights, const std::string& weights_file, const std::string& torch_version);
  ~AotiPackage();
  AotiPackage(const AotiPackage&) = delete;
  AotiPackage& operator=(const AotiPackage&) = delete;

  // The package's one output. `name` ("unet (aoti)") labels errors: a failure
  // throws TaskError (OutOfMemoryError for an out-of-memory), like run_module().
  at::Tensor run(std::vector<at::Tensor> inputs, const char* name);
  int constants() const { return constants_; }
  const AotiConfig& config() const { return config_; }
  // Parameters and buffers of the module that the package does not take: it
  // compiled them into its code as literals, so in-place changes miss it.
  const std::set<std::string>& compiled_in() const { return compiled_in_; }

 private:
  AotiConfig config_;
  c10::Device device_;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
  std::mutex mu_;
  int constants_ = 0;
  std::set<std::string> compiled_in_;
};

}  // namespace sdxl
