// SdxlModel: the resident SDXL bundle on one device — two text encoders with
// their tokenizers, the UNet and the VAE decoder as TorchScript modules, loaded
// once and kept for the whole run. Loading throws ModelError naming the file.
// Calls into the modules are not thread-safe; one pipeline owns a bundle.
#pragma once

#include <torch/script.h>

#include <memory>
#include <optional>
#include <set>
#include <string>

#include "sdxl/clip_tokenizer.h"
#include "sdxl/model_config.h"

namespace sdxl {

struct SdxlModel {
  ModelConfig config;
  torch::Device device{torch::kCPU};
  torch::Dtype dtype = torch::kFloat32;      // text encoders + UNet
  torch::Dtype vae_dtype = torch::kFloat32;  // VAE (fp32 when the export upcasts it)
  torch::jit::Module text_encoder;
  torch::jit::Module text_encoder_2;
  torch::jit::Module unet;
  torch::jit::Module vae_decoder;
  std::optional<torch::jit::Module> vae_encoder;  // loaded on first use (img2img, pixel-space hires fix)
  std::unique_ptr<ClipTokenizer> tokenizer;
  std::unique_ptr<ClipTokenizer> tokenizer_2;
  // With --unet-backend aoti: UNet parameters that unet.pt2 compiled into its code
  // as literals (AOTInductor inlines some tiny tensors, e.g. conv_out.bias) instead
  // of reading them from unet.ts's tensors; a LoRA must not patch them.
  std::set<std::string> unet_params_compiled_in;

  // dtype_override: "" keeps model.json's dtype, else the modules are cast.
  static std::unique_ptr<SdxlModel> load(const ModelConfig& config, const torch::Device& device,
                                         const std::string& dtype_override);
};

// The VAE encoder, loaded on first call (in the VAE's dtype). Throws
// ModelError when the model directory has no vae_encoder.ts.
torch::jit::Module& vae_encoder_module(SdxlModel& model);

// Runs module.forward(inputs); a failure becomes a TaskError that names the
// module and keeps the original message (an out-of-memory shows in it).
c10::IValue run_module(torch::jit::Module& module, const char* name, std::vector<c10::IValue> inputs);

}  // namespace sdxl
