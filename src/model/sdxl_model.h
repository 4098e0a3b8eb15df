// SdxlModel: the resident SDXL bundle on one device — two text encoders with
// their tokenizers, the UNet and the VAE decoder as TorchScript modules, loaded
// once and kept for the whole run. Loading throws ModelError naming the file.
// Calls into the modules are not thread-safe; one pipeline owns a bundle.
#pragma once

#include <torch/script.h>

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "text/clip_tokenizer.h"
#include "core/error.h"
#include "model/model_config.h"

namespace sdxl {

class AotiPackage;

// Device literals (`device=cuda:0`) in the graphs of a traced module become
// `device` when both are CUDA devices; returns how many changed. The loader
// calls it so that a model traced on GPU 0 runs on any GPU (--devices).
int retarget_device_literals(torch::jit::Module& module, const torch::Device& device);

// Loads a traced module (on the CPU, then moved to `device`); exported in
// `exported`, it runs in `dtype` (retyped_module when they differ). Throws
// ModelError naming the file (and the torch version the export recorded).
torch::jit::Module load_traced_module(const std::filesystem::path& path, const torch::Device& device,
                                      torch::Dtype exported, torch::Dtype dtype, const std::string& torch_version);

struct SdxlModel {
  ModelConfig config;
  torch::Device device{torch::kCPU};
  torch::Dtype dtype = torch::kFloat32;      // text encoders + UNet
  torch::Dtype vae_dtype = torch::kFloat32;  // the exported VAE's (fp32 when the export upcasts it); the encoder's
  torch::jit::Module text_encoder;
  torch::jit::Module text_encoder_2;
  torch::jit::Module unet;
  torch::jit::Module vae_decoder;                      // runs in vae_decode_dtype (set_vae_decode_dtype)
  torch::Dtype vae_decode_dtype = torch::kFloat32;     // --vae-dtype; vae_dtype until it is set
  std::optional<torch::jit::Module> vae_decoder_fp32;  // fp32 re-decode of NaN/Inf output, loaded on first need
  int vae_fp32_redecodes = 0;                          // how many decodes were redone in fp32
  // vae_decoder.pt2 with --vae-backend aoti / auto (attach_vae_decoder_aoti in
  // image/vae_decode.h): vae_decoder compiled for one latent size, on
  // vae_decoder's tensors; null when not used. vae_aoti_decodes counts its decodes.
  std::shared_ptr<AotiPackage> vae_decoder_aoti;
  std::atomic<int> vae_aoti_decodes{0};
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
  // A VAE folder's bundle (load_vae_config) beside `model`: only the VAE fields are
  // set (decoder loaded now, encoder and fp32 fallback on first need); dtype is the
  // model's, so encoded latents come out as the model's. ModelError when it does
  // not fit the model (check_vae_fits) or a file does not load.
  static std::unique_ptr<SdxlModel> load_vae(const ModelConfig& vae_config, const SdxlModel& model);
};

// The VAE encoder, loaded on first call (in the VAE's dtype). Throws
// ModelError when the model directory has no vae_encoder.ts.
torch::jit::Module& vae_encoder_module(SdxlModel& model);

// The fp32 VAE decoder (the fallback after a NaN/Inf decode), loaded on first
// call; retyped when the export's VAE is not fp32.
torch::jit::Module& vae_decoder_fp32_module(SdxlModel& model);

// A module's parameters and buffers by their names (the state-dict keys).
std::map<std::string, at::Tensor> named_tensors(const torch::jit::Module& module);

// A deep copy of a traced module that runs in `to` instead of `from`: floating
// parameters and buffers are cast, and the dtype constants the trace baked into
// its graphs (every `dtype` argument equal to `from`, e.g. the wrapper's
// `z.to(float32)`) are rewritten to `to`. A plain Module::to(dtype) leaves those
// constants, so the cast module fails ("expected scalar type Float but found
// BFloat16"). Returns the copy; `rewritten`, when given, counts the constants.
torch::jit::Module retyped_module(const torch::jit::Module& module, torch::Dtype from, torch::Dtype to,
                                  int* rewritten = nullptr);

// Runs module.forward(inputs); a failure becomes a TaskError that names the
// module and keeps the original message (an out-of-memory shows in it).
c10::IValue run_module(torch::jit::Module& module, const char* name, std::vector<c10::IValue> inputs);

}  // namespace sdxl
