#include "image/vae_decode.h"

#include <spdlog/spdlog.h>
#include <torch/script.h>

#include <algorithm>
#include <map>

#include "core/error.h"
#include "device/device.h"
#include "model/aoti_package.h"

namespace sdxl {

VaeTiling parse_vae_tiling(const std::string& text) {
  if (text == "auto") return VaeTiling::kAuto;
  if (text == "always") return VaeTiling::kAlways;
  if (text == "never") return VaeTiling::kNever;
  throw UsageError("--vae-tiling '" + text + "': expected auto, always or never");
}

std::vector<int64_t> tile_starts(int64_t size, int tile, int overlap) {
  if (tile <= overlap || overlap < 0) throw UsageError("VAE tiles must be larger than their overlap");
  std::vector<int64_t> starts;
  if (size <= tile) return {0};
  const int64_t stride = tile - overlap;
  for (int64_t p = 0;; p += stride) {
    const int64_t s = std::min<int64_t>(p, size - tile);
    starts.push_back(s);
    if (s + tile >= size) break;
  }
  return starts;
}

void set_vae_decode_dtype(SdxlModel& model, const std::string& option) {
  torch::Dtype want;
  // auto: on a GPU, the compute dtype (fp16 / bf16: a shorter decode and a
  // lower peak; an image whose decode overflows is decoded again in fp32,
  // below), else as exported (fp32 on the CPU, where low precision is slow).
  if (option == "auto")
    want = model.device.is_cuda() && model.dtype != torch::kFloat32 ? model.dtype : model.vae_decode_dtype;
  else if (option == "fp32" || option == "fp16" || option == "bf16") want = parse_dtype(option);
  else throw UsageError("--vae-dtype '" + option + "': expected auto, fp32, fp16 or bf16");
  if (want == model.vae_decode_dtype) return;
  model.vae_decoder_aoti.reset();  // it holds the tensors of the decoder replaced here
  int rewritten = 0;
  model.vae_decoder = retyped_module(model.vae_decoder, model.vae_decode_dtype, want, &rewritten);
  spdlog::info("VAE decoder: {} -> {} ({} dtype constant(s) of the trace rewritten); NaN/Inf output is decoded again in fp32",
               dtype_name(model.vae_decode_dtype), dtype_name(want), rewritten);
  model.vae_decode_dtype = want;
}

void attach_vae_decoder_aoti(SdxlModel& model, const std::string& backend) {
  if (backend != "auto" && backend != "torchscript" && backend != "aoti")
    throw UsageError("--vae-backend '" + backend + "' is not one of: auto, torchscript, aoti");
  model.vae_decoder_aoti.reset();
  if (backend == "torchscript") return;
  const ModelConfig& cfg = model.config;
  const std::string unfit = vae_aoti_mismatch(cfg, model.device.is_cuda() ? "cuda" : "cpu",
                                              dtype_name(model.vae_decode_dtype), cuda_capability(model.device));
  if (!unfit.empty()) {
    if (backend == "aoti")
      throw ModelError("--vae-backend aoti: model '" + cfg.name + "' (" + cfg.dir.string() + "): " + unfit);
    spdlog::info("VAE decoder backend torchscript ({}): {}", cfg.vae_decoder_file, unfit);
    return;
  }
  const AotiConfig& a = cfg.vae_decoder_aoti;
  model.vae_decoder_aoti = std::make_shared<AotiPackage>(cfg.path_of(a.file), a, model.device, model.vae_decoder,
                                                         cfg.vae_decoder_file, cfg.torch_version);
  const int f = cfg.vae_downsample;
  spdlog::info("VAE decoder backend aoti: {} ({} constants shared with {}), compiled for {}x{} images in {}; other "
               "sizes and tiles decode on {}",
               a.file, model.vae_decoder_aoti->constants(), cfg.vae_decoder_file, a.latent_width_min * f,
               a.latent_height_min * f, a.dtype, cfg.vae_decoder_file);
}

namespace {

// "" when modules `a` and `b` hold tensors of the same names, shapes and
// dtypes (the same architecture), else the first difference.
std::string tensor_difference(const torch::jit::Module& a, const torch::jit::Module& b) {
  const std::map<std::string, at::Tensor> ta = named_tensors(a), tb = named_tensors(b);
  for (const auto& [name, t] : ta) {
    auto it = tb.find(name);
    if (it == tb.end()) return "it has no '" + name + "'";
    if (it->second.sizes() != t.sizes() || it->second.scalar_type() != t.scalar_type())
      return "its '" + name + "' is " + c10::str(it->second.sizes()) + " " + c10::toString(it->second.scalar_type()) +
             ", the package's " + c10::str(t.sizes()) + " " + c10::toString(t.scalar_type());
  }
  return ta.size() == tb.size() ? "" : "it has tensors the model's decoder does not";
}

// "" when the folder's decoder equals the model's in every tensor that package
// `p` holds compiled in (not among its constants: Inductor may fold small
// tensors, e.g. the last biases and norms, into the code, which then computes
// with the model's values), else the first that differs.
std::string compiled_in_difference(const AotiPackage& p, const torch::jit::Module& model_decoder,
                                   const torch::jit::Module& folder_decoder) {
  const std::map<std::string, at::Tensor> tm = named_tensors(model_decoder), tf = named_tensors(folder_decoder);
  for (const auto& name : p.compiled_in()) {
    auto m = tm.find(name);
    auto f = tf.find(name);
    if (m == tm.end() || f == tf.end() || !torch::equal(m->second, f->second.to(m->second.device())))
      return "its '" + name + "' differs from the model's, which " + p.config().file + " holds compiled in";
  }
  return "";
}

}  // namespace

void share_vae_decoder_aoti(SdxlModel& vae, const SdxlModel& model) {
  vae.vae_decoder_aoti.reset();
  if (!model.vae_decoder_aoti) return;
  const AotiConfig& a = model.vae_decoder_aoti->config();
  const std::string why = tensor_difference(model.vae_decoder, vae.vae_decoder);
  if (!why.empty()) {
    spdlog::info("VAE '{}' decodes on its {}, not on the model's {}: {}", vae.config.dir.string(),
                 vae.config.vae_decoder_file, a.file, why);
    return;
  }
  try {
    vae.vae_decoder_aoti = std::make_shared<AotiPackage>(model.config.path_of(a.file), a, vae.device, vae.vae_decoder,
                                                         vae.config.vae_decoder_file, model.config.torch_version);
  } catch (const ModelError& e) {  // the folder's images still decode, on its trace
    spdlog::warn("VAE '{}' decodes on its {}: {}", vae.config.dir.string(), vae.config.vae_decoder_file, e.what());
    return;
  }
  const std::string held = compiled_in_difference(*vae.vae_decoder_aoti, model.vae_decoder, vae.vae_decoder);
  if (!held.empty()) {
    vae.vae_decoder_aoti.reset();
    spdlog::info("VAE '{}' decodes on its {}, not on the model's {}: {}", vae.config.dir.string(),
                 vae.config.vae_decoder_file, a.file, held);
    return;
  }
  spdlog::info("VAE '{}' decodes on the model's {} with its own weights", vae.config.dir.string(), a.file);
}

namespace {

// One decoder, the dtype it runs in, and its AOTI package (null: none).
struct Decoder {
  torch::jit::Module* module;
  torch::Dtype dtype;
  AotiPackage* aoti = nullptr;
};

Decoder main_decoder(SdxlModel& model) {
  return {&model.vae_decoder, model.vae_decode_dtype, model.vae_decoder_aoti.get()};
}

torch::Tensor decode_whole(SdxlModel& model, const Decoder& d, const torch::Tensor& latents) {
  const torch::Tensor z = latents.to(d.dtype) / model.config.vae_scaling_factor;
  if (d.aoti != nullptr && z.dim() == 4 && d.aoti->config().covers_latents(z.size(0), z.size(2), z.size(3))) {
    ++model.vae_aoti_decodes;
    return d.aoti->run({z.contiguous()}, "vae_decoder (aoti)").to(torch::kFloat32);
  }
  return run_module(*d.module, "vae_decoder", {z}).toTensor().to(torch::kFloat32);
}

// Weight of each pixel along one side of a tile: 1 inside, a linear ramp
// (0 -> 1) over `ramp` pixels at an edge that has a neighbour.
torch::Tensor ramp_weights(int64_t length, int64_t ramp, bool ramp_start, bool ramp_end, const torch::Device& dev) {
  torch::Tensor idx = torch::arange(length, torch::TensorOptions().dtype(torch::kFloat32).device(dev)) + 0.5;
  torch::Tensor w = torch::ones({length}, idx.options());
  if (ramp > 0 && ramp_start) w = torch::minimum(w, idx / static_cast<double>(ramp));
  if (ramp > 0 && ramp_end) w = torch::minimum(w, (static_cast<double>(length) - idx) / static_cast<double>(ramp));
  return w;
}

torch::Tensor decode_tiled(SdxlModel& model, const Decoder& d, const torch::Tensor& latents, const TileGrid& grid) {
  const int64_t h = latents.size(2), w = latents.size(3);
  const int64_t f = model.config.vae_downsample;
  const auto ys = tile_starts(h, grid.tile, grid.overlap), xs = tile_starts(w, grid.tile, grid.overlap);
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(latents.device());
  torch::Tensor acc = torch::zeros({1, 3, h * f, w * f}, opts);
  torch::Tensor wsum = torch::zeros({1, 1, h * f, w * f}, opts);
  const int64_t ramp = static_cast<int64_t>(grid.overlap) * f;
  for (int64_t y0 : ys) {
    for (int64_t x0 : xs) {
      const int64_t th = std::min<int64_t>(grid.tile, h - y0), tw = std::min<int64_t>(grid.tile, w - x0);
      const torch::Tensor tile = latents.slice(2, y0, y0 + th).slice(3, x0, x0 + tw);
      const torch::Tensor img = decode_whole(model, d, tile);
      const torch::Tensor wy = ramp_weights(th * f, ramp, y0 > 0, y0 + th < h, latents.device());
      const torch::Tensor wx = ramp_weights(tw * f, ramp, x0 > 0, x0 + tw < w, latents.device());
      const torch::Tensor wt = (wy.view({1, 1, -1, 1}) * wx.view({1, 1, 1, -1}));
      acc.slice(2, y0 * f, (y0 + th) * f).slice(3, x0 * f, (x0 + tw) * f).add_(img * wt);
      wsum.slice(2, y0 * f, (y0 + th) * f).slice(3, x0 * f, (x0 + tw) * f).add_(wt);
    }
  }
  return acc / wsum;
}

// Whole, or tiled (on request, or after an out-of-memory unless `never`);
// `what` gains ", tiled" when tiles were used.
torch::Tensor decode_any(SdxlModel& model, const Decoder& d, const torch::Tensor& latents, VaeTiling tiling,
                         const TileGrid& grid, std::string& what) {
  if (tiling == VaeTiling::kAlways) return decode_tiled(model, d, latents, grid);
  try {
    return decode_whole(model, d, latents);
  } catch (const OutOfMemoryError& e) {
    if (tiling == VaeTiling::kNever) throw;
    spdlog::warn("VAE decode ran out of memory; freeing cached blocks and decoding in tiles of {} px: {}",
                 grid.tile * model.config.vae_downsample, e.what());
    device_release_cached(model.device);
    what += ", tiled";
    return decode_tiled(model, d, latents, grid);
  }
}

}  // namespace

torch::Tensor vae_decode_image(SdxlModel& model, const torch::Tensor& latents) {
  return decode_whole(model, main_decoder(model), latents);
}

torch::Tensor vae_decode_image_tiled(SdxlModel& model, const torch::Tensor& latents, const TileGrid& grid) {
  return decode_tiled(model, main_decoder(model), latents, grid);
}

std::vector<std::uint8_t> image_to_rgb8(const torch::Tensor& decoded, const std::string& what) {
  torch::Tensor image = (decoded / 2 + 0.5).clamp(0, 1).to(torch::kCPU).to(torch::kFloat32);
  if (torch::isnan(image).any().item<bool>())
    throw TaskError("VAE decode produced NaN values (" + what + "): the latents or the VAE's weights are not finite");
  // [1, 3, H, W] -> [H, W, 3] uint8 with numpy's rounding (half to even).
  torch::Tensor hwc = (image[0].permute({1, 2, 0}) * 255).round().to(torch::kUInt8).contiguous();
  const auto* p = hwc.data_ptr<std::uint8_t>();
  return std::vector<std::uint8_t>(p, p + hwc.numel());
}

std::vector<std::uint8_t> vae_decode_rgb8(SdxlModel& model, const torch::Tensor& latents, VaeTiling tiling,
                                          const TileGrid& grid, const std::string& label) {
  const Decoder main = main_decoder(model);
  std::string what = "in " + dtype_name(main.dtype);
  torch::Tensor image = decode_any(model, main, latents, tiling, grid, what);
  if (main.dtype != torch::kFloat32 && !torch::isfinite(image).all().item<bool>()) {
    const std::string name = label.empty() ? "an image" : label;
    spdlog::warn("VAE decode in {} gave NaN/Inf values for {}; decoding it again in fp32 (--vae-dtype fp32 or bf16 "
                 "avoids the second decode when this happens often)",
                 dtype_name(main.dtype), name);
    ++model.vae_fp32_redecodes;
    what = "in fp32 after NaN/Inf " + what;
    image = decode_any(model, Decoder{&vae_decoder_fp32_module(model), torch::kFloat32}, latents, tiling, grid, what);
  }
  if (!label.empty()) what = label + ", " + what;
  return image_to_rgb8(image, what);
}

}  // namespace sdxl
