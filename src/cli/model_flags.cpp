#include "cli/model_flags.h"

namespace sdxl::cli {

void add_model_options(CLI::App& cmd, ModelFlags& f, bool model_required) {
  sdxl_batch::ModelOptions& o = f.options;
  auto* m = cmd.add_option("--model", o.model_dir, "Model directory written by scripts/export_sdxl.py");
  if (model_required) m->required();
  cmd.add_flag("--verify-model", o.verify,
               "Check every model file against the sha256 recorded at export before loading (reads all of them)");
  cmd.add_option("--device", o.device, "cpu, cuda or cuda:N")->default_val("cpu");
  cmd.add_option("--dtype", o.dtype, "Compute dtype (default: the model's)")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  cmd.add_option("--precision", o.precision,
                 "UNet precision: default (the model's dtype) or fp8 (the FP8 UNet of export_sdxl.py --fp8: faster, not "
                 "exact; a GPU with FP8 tensor cores)")
      ->capture_default_str()
      ->check(CLI::IsMember({"default", "fp8"}));
  cmd.add_option("--threads", o.threads, "CPU threads for torch (0 = torch's default)")
      ->check(CLI::Range(0, 1024));
  cmd.add_flag("--jit-optimize", o.jit_optimize,
               "Let TorchScript fuse ops after its first calls: seconds of optimisation at each new shape, and fp16 results "
               "then depend on the call count");
  cmd.add_flag("--cudnn-benchmark", o.cudnn_benchmark, "Let cuDNN pick convolution algorithms by timing them");
  cmd.add_flag("--deterministic-cudnn,!--no-deterministic-cudnn", o.deterministic_cudnn,
               "Use only cuDNN algorithms that give the same bits on every GPU and run (default on; no slower on the "
               "GPUs measured)");
  cmd.add_option("--cuda-allocator", o.cuda_allocator,
                 "CUDA caching allocator: expandable (expandable segments: less fragmentation under --vram-limit) or "
                 "default; PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF, when set, win")
      ->capture_default_str()
      ->check(CLI::IsMember({"expandable", "default"}));
  cmd.add_flag("--cuda-graphs,!--no-cuda-graphs", o.cuda_graphs,
               "Replay the UNet step as a captured CUDA graph (CUDA only; default on)");
  cmd.add_option("--unet-backend", o.unet_backend,
                 "UNet implementation: auto (aoti when the model has a unet.pt2 for this device and dtype, else "
                 "torchscript), torchscript (unet.ts) or aoti (unet.pt2 from export_sdxl.py --aoti)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "torchscript", "aoti"}));
  cmd.add_option("--vae-backend", o.vae_backend,
                 "VAE decoder implementation: auto (aoti when the model has a vae_decoder.pt2 for this device and "
                 "decode dtype, else torchscript), torchscript (vae_decoder.ts) or aoti (vae_decoder.pt2 from "
                 "export_sdxl.py --aoti: images of the size it was compiled for; others decode on vae_decoder.ts)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "torchscript", "aoti"}));
  cmd.add_option("--vae-tiling", o.vae_tiling,
                 "VAE decode in overlapping tiles: auto (only after an out-of-memory), always, never")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "always", "never"}));
  cmd.add_option("--vae-dtype", o.vae_dtype,
                 "VAE decode dtype: auto (on a GPU the compute dtype, e.g. fp16; on the CPU as exported), fp32, fp16, bf16; "
                 "an image whose decode has NaN/Inf is decoded again in fp32")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "fp32", "fp16", "bf16"}));
  cmd.add_option("--vae", o.vae_dir,
                 "VAE folder (scripts/export_sdxl.py --vae-only) that encodes and decodes the images instead of the "
                 "model's VAE; a batch task's \"vae\" wins")
      ->check(CLI::ExistingDirectory);
  // The LRU caches of side modules: a count of entries with a default shown in --help.
  const auto cache_option = [&cmd](const char* flag, std::size_t& value, const char* help, std::size_t max) {
    cmd.add_option(flag, value, help)->capture_default_str()->check(CLI::Range(std::size_t{1}, max));
  };
  cache_option("--vae-cache", o.vae_cache,
               "How many VAE folders that tasks name stay loaded beside the model's own (least recently used evicted)", 64u);
  cache_option("--controlnet-cache", o.controlnet_cache,
               "How many ControlNet folders that tasks name stay loaded (least recently used evicted)", 64u);
  cache_option("--ip-adapter-cache", o.ip_adapter_cache,
               "How many IP-Adapter folders that tasks name stay loaded (least recently used evicted)", 64u);
  cache_option("--upscaler-cache", o.upscaler_cache,
               "How many upscaler folders that tasks name for frames (\"upscale\") and the hires fix stay loaded "
               "(least recently used evicted)", 64u);
  cache_option("--detector-cache", o.detector_cache,
               "How many detector folders that tasks' detailers name (\"detailer\") stay loaded (least recently used "
               "evicted)", 64u);
  cache_option("--ip-image-cache", o.ip_image_cache,
               "How many reference images' IP-Adapter tokens stay cached (each is encoded once while cached)", 100000u);
  cmd.add_option("--lora-dir", o.lora_dirs, "Directory where <lora:NAME:W> prompt tags find NAME.safetensors (repeatable)");
  cmd.add_option("--embedding-dir,--embeddings-dir", o.embedding_dirs,
                 "Folder of SDXL textual-inversion embeddings (NAME.safetensors with clip_l and clip_g); prompts use "
                 "NAME (repeatable)")
      ->check(CLI::ExistingDirectory);
  cmd.add_option("--lora-cache", f.lora_cache,
                 "Device memory for cached LoRA factors, e.g. 2G (default: 30% of the memory free after the weights)");
  cmd.add_flag("--strict-lora,--strict", o.lora_strict, "LoRA keys that map to no model weight are an error, not a warning");
}

sdxl_batch::ModelOptions ModelFlags::resolved() const {
  sdxl_batch::ModelOptions o = options;
  if (!lora_cache.empty()) {
    o.lora_cache_bytes = sdxl_batch::parse_size_bytes(lora_cache);
    if (o.lora_cache_bytes == 0) o.lora_cache_bytes = 1;  // "0": cache nothing beyond the set in use
  }
  return o;
}

}  // namespace sdxl::cli
