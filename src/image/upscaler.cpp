#include "image/upscaler.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "core/error.h"
#include "device/device.h"
#include "device/device_errors.h"
#include "image/resize.h"
#include "model/sdxl_model.h"

namespace sdxl {

Upscaler::Upscaler(const std::filesystem::path& dir, const torch::Device& device)
    : config_(load_upscaler_config(dir)), device_(device), dtype_(torch::kFloat32) {
  const auto path = dir / config_.file;
  try {
    module_ = torch::jit::load(path.string(), device);
  } catch (const c10::Error& e) {
    throw ModelError("upscaler '" + path.string() + "' does not load: " + e.what_without_backtrace());
  }
  module_.eval();
  // The module was traced in fp32 (its graph's dtype constants) and saved in the folder's dtype.
  if (device.is_cuda() && config_.dtype == "fp16") dtype_ = torch::kFloat16;
  if (dtype_ != torch::kFloat32) {
    module_ = retyped_module(module_, torch::kFloat32, dtype_);
  } else {  // floating tensors only: Module::to(dtype) would cast integer buffers (attention indices) too
    for (at::Tensor p : module_.parameters())
      if (p.is_floating_point()) p.set_data(p.to(torch::kFloat32));
    for (at::Tensor b : module_.buffers())
      if (b.is_floating_point()) b.set_data(b.to(torch::kFloat32));
  }
}

std::uint64_t Upscaler::weight_bytes() const {
  std::uint64_t n = 0;
  for (const at::Tensor& p : module_.parameters()) n += p.nbytes();
  for (const at::Tensor& b : module_.buffers()) n += b.nbytes();
  return n;
}

torch::Tensor Upscaler::call(const torch::Tensor& tiles) {
  const int64_t h = tiles.size(2), w = tiles.size(3), t = config_.tile_size;
  torch::Tensor x = tiles.to(device_, dtype_);
  if (config_.fixed_tile && (h != t || w != t)) {
    namespace F = torch::nn::functional;
    const bool reflect = t - w < w && t - h < h;
    F::PadFuncOptions opts({0, t - w, 0, t - h});
    if (reflect)
      opts.mode(torch::kReflect);
    else
      opts.mode(torch::kReplicate);
    x = F::pad(x, opts);
  }
  torch::Tensor y = translate_device_errors("upscaler", [&] { return module_.forward({x}).toTensor(); });
  if (config_.fixed_tile) y = y.narrow(2, 0, h * config_.scale).narrow(3, 0, w * config_.scale);
  return y.to(torch::kFloat32);
}

torch::Tensor feather_mask(int64_t h, int64_t w, int64_t channels, int feather) {
  torch::Tensor mask = torch::ones({1, channels, h, w});
  for (int d = 2; d < 4; ++d) {
    if (feather >= mask.size(d)) continue;
    for (int t = 0; t < feather; ++t) {
      const double a = static_cast<double>(t + 1) / feather;
      mask.narrow(d, t, 1).mul_(a);
      mask.narrow(d, mask.size(d) - 1 - t, 1).mul_(a);
    }
  }
  return mask;
}

namespace {

// tiled_scale's tile origins along one side of `size` px.
std::vector<int64_t> tile_positions(int64_t size, int tile, int overlap) {
  if (size <= tile) return {0};
  std::vector<int64_t> out;
  for (int64_t it = 0; it < size - overlap; it += tile - overlap) out.push_back(it);
  return out;
}

struct TileAt {
  int64_t y, x, h, w;  // the input tile's origin and size
};

// tiled_scale's tiles of an H x W image, in its order (rows of tiles, top to bottom).
std::vector<TileAt> tile_grid(int64_t H, int64_t W, int tile, int overlap) {
  std::vector<TileAt> tiles;
  for (const int64_t y0 : tile_positions(H, tile, overlap)) {
    for (const int64_t x0 : tile_positions(W, tile, overlap)) {
      const int64_t py = std::max<int64_t>(0, std::min<int64_t>(H - overlap, y0));
      const int64_t px = std::max<int64_t>(0, std::min<int64_t>(W - overlap, x0));
      tiles.push_back({py, px, std::min<int64_t>(tile, H - py), std::min<int64_t>(tile, W - px)});
    }
  }
  return tiles;
}

}  // namespace

int tile_overlap(int tile, int overlap) { return tile < overlap * 4 ? tile / 4 : overlap; }

// The weighted sum runs on the model's device in fp32, in the order tiled_scale adds (a tile's
// result does not depend on which tiles share its model call: each is its own row of the batch).
torch::Tensor Upscaler::tiled(const torch::Tensor& s, int tile, int overlap_asked, int batch) {
  const int64_t H = s.size(2), W = s.size(3), k = config_.scale;
  if (H <= tile && W <= tile) return call(s);
  const int overlap = tile_overlap(tile, overlap_asked);  // the step tile - overlap stays above 0
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
  torch::Tensor out = torch::zeros({1, 3, H * k, W * k}, f32), div = torch::zeros({1, 1, H * k, W * k}, f32);
  const int feather = static_cast<int>(std::nearbyint(overlap * static_cast<double>(k)));
  std::map<std::pair<int64_t, int64_t>, torch::Tensor> masks;  // one per tile shape (inner, right, bottom, corner)
  const std::vector<TileAt> tiles = tile_grid(H, W, tile, overlap);
  for (size_t i = 0; i < tiles.size();) {
    // The next tiles of the same shape, up to `batch` of them, in one model call.
    size_t j = i + 1;
    while (j < tiles.size() && j - i < static_cast<size_t>(batch) && tiles[j].h == tiles[i].h && tiles[j].w == tiles[i].w) ++j;
    std::vector<torch::Tensor> ins;
    for (size_t t = i; t < j; ++t) ins.push_back(s.narrow(2, tiles[t].y, tiles[t].h).narrow(3, tiles[t].x, tiles[t].w));
    const torch::Tensor ys = call(torch::cat(ins));
    auto [it, fresh] = masks.try_emplace({ys.size(2), ys.size(3)});
    if (fresh) it->second = feather_mask(ys.size(2), ys.size(3), 1, feather).to(device_);
    const torch::Tensor& mask = it->second;
    for (size_t t = i; t < j; ++t) {
      const torch::Tensor ps = ys.narrow(0, static_cast<int64_t>(t - i), 1);
      out.narrow(2, tiles[t].y * k, ps.size(2)).narrow(3, tiles[t].x * k, ps.size(3)).add_(ps * mask);
      div.narrow(2, tiles[t].y * k, ps.size(2)).narrow(3, tiles[t].x * k, ps.size(3)).add_(mask);
    }
    i = j;
  }
  return out / div;
}

torch::Tensor Upscaler::upscale_on_device(const torch::Tensor& images, const UpscaleTiling& tiling) {
  torch::InferenceMode guard;
  int tile = config_.fixed_tile ? config_.tile_size : tiling.tile;
  int batch = std::max(1, tiling.batch);
  for (;;) {
    try {
      std::vector<torch::Tensor> outs;
      for (int64_t b = 0; b < images.size(0); ++b) {
        const torch::Tensor one = images.narrow(0, b, 1).to(device_, torch::kFloat32);
        outs.push_back(tiled(one, tile, tiling.overlap, batch));
      }
      torch::Tensor out = torch::cat(outs);
      // clamp keeps a NaN, and the 8-bit conversion makes it black: a broken model fails the image instead.
      if (!torch::isfinite(out).all().item<bool>())
        throw TaskError("upscaler '" + config_.display_name() + "' gave values that are not finite (NaN or " +
                        "infinity): its weights or its dtype (" + config_.dtype + ") cannot upscale this image");
      return out.clamp(0.0, 1.0);
    } catch (const OutOfMemoryError&) {
      if (batch > 1) {  // fewer tiles a call first, then smaller tiles
        batch /= 2;
        continue;
      }
      if (config_.fixed_tile || tile / 2 < tiling.min_tile) throw;
      tile /= 2;
    }
  }
}

torch::Tensor Upscaler::upscale(const torch::Tensor& images, const UpscaleTiling& tiling) {
  return upscale_on_device(images, tiling).to(torch::kCPU);
}

std::vector<std::uint8_t> upscale_rgb8(Upscaler* upscaler, const std::uint8_t* rgb, int width, int height, int out_w,
                                       int out_h, const UpscaleTiling& tiling) {
  std::vector<std::uint8_t> cur(rgb, rgb + static_cast<std::size_t>(width) * height * 3);
  int w = width, h = height;
  for (int pass = 0; upscaler && pass < 3 && (w < out_w || h < out_h); ++pass) {
    torch::InferenceMode guard;
    const torch::Tensor img =
        torch::from_blob(cur.data(), {1, h, w, 3}, torch::kUInt8).permute({0, 3, 1, 2}).to(torch::kFloat32).div(255.0);
    const torch::Tensor up = upscaler->upscale_on_device(img, tiling);  // to 8 bits there: a quarter of the copy
    const torch::Tensor u8 =
        (up[0] * 255.0).clamp(0, 255).to(torch::kUInt8).permute({1, 2, 0}).contiguous().to(torch::kCPU);
    w = static_cast<int>(u8.size(1));
    h = static_cast<int>(u8.size(0));
    cur.assign(u8.data_ptr<std::uint8_t>(), u8.data_ptr<std::uint8_t>() + u8.numel());
    if (upscaler->config().scale == 1) break;  // a restoration model does not grow the image
  }
  if (w == out_w && h == out_h) return cur;
  return resize_lanczos_rgb8(cur.data(), w, h, out_w, out_h);
}

FrameFit parse_frame_fit(const std::string& text, const std::string& what) {
  if (text == "stretch") return FrameFit::kStretch;
  if (text == "crop") return FrameFit::kCrop;
  if (text == "pad") return FrameFit::kPad;
  throw UsageError(what + " '" + text + "': must be crop, pad or stretch");
}

std::pair<int, int> frame_resize_size(int width, int height, const FrameSpec& spec) {
  if (spec.scale > 0)
    return {std::max(1, static_cast<int>(std::lround(width * spec.scale))),
            std::max(1, static_cast<int>(std::lround(height * spec.scale)))};
  if (spec.fit == FrameFit::kStretch) return {spec.width, spec.height};
  const double sx = static_cast<double>(spec.width) / width, sy = static_cast<double>(spec.height) / height;
  const double k = spec.fit == FrameFit::kCrop ? std::max(sx, sy) : std::min(sx, sy);
  auto side = [&](int n, int frame) {
    const int v = std::max(1, static_cast<int>(std::lround(n * k)));
    return spec.fit == FrameFit::kCrop ? std::max(v, frame) : std::min(v, frame);
  };
  return {side(width, spec.width), side(height, spec.height)};
}

std::vector<std::uint8_t> upscale_frame(Upscaler* upscaler, const std::uint8_t* rgb, int width, int height,
                                        const FrameSpec& spec, int& out_w, int& out_h, const UpscaleTiling& tiling) {
  const auto [rw, rh] = frame_resize_size(width, height, spec);
  std::vector<std::uint8_t> img = upscale_rgb8(upscaler, rgb, width, height, rw, rh, tiling);
  if (spec.scale > 0 || spec.fit == FrameFit::kStretch) {
    out_w = rw;
    out_h = rh;
    return img;
  }
  out_w = spec.width;
  out_h = spec.height;
  std::vector<std::uint8_t> frame(static_cast<std::size_t>(out_w) * out_h * 3, 0);
  // crop: the frame's window into the image; pad: the image's place in the frame (centred, floor).
  const bool crop = spec.fit == FrameFit::kCrop;
  const int cw = std::min(rw, out_w), ch = std::min(rh, out_h);
  const int sx = crop ? (rw - cw) / 2 : 0, sy = crop ? (rh - ch) / 2 : 0;
  const int dx = crop ? 0 : (out_w - cw) / 2, dy = crop ? 0 : (out_h - ch) / 2;
  for (int y = 0; y < ch; ++y)
    std::copy_n(img.data() + ((static_cast<std::size_t>(sy) + y) * rw + sx) * 3, static_cast<std::size_t>(cw) * 3,
                frame.data() + ((static_cast<std::size_t>(dy) + y) * out_w + dx) * 3);
  return frame;
}

}  // namespace sdxl

namespace sdxl {

// The upscale command has the GPU to itself: up to this many tiles of an image a model call.
constexpr int kFrameTileBatch = 4;

struct FrameUpscaler::Impl {
  std::unique_ptr<Upscaler> model;
  std::string name = "Lanczos", sha;
  UpscaleTiling tiling;
};

FrameUpscaler::FrameUpscaler(const std::string& upscaler, const std::string& device, int tile)
    : impl_(std::make_unique<Impl>()) {
  impl_->tiling.tile = tile;
  if (upscaler == "Lanczos") return;
  const std::string dev = device == "auto" ? (torch::cuda::is_available() ? "cuda" : "cpu") : device;
  impl_->model = std::make_unique<Upscaler>(upscaler, parse_device(dev));
  if (parse_device(dev).is_cuda()) impl_->tiling.batch = kFrameTileBatch;
  const UpscalerConfig& c = impl_->model->config();
  impl_->name = c.display_name();
  if (auto it = c.file_sha256.find(c.file); it != c.file_sha256.end()) impl_->sha = it->second;
}

FrameUpscaler::~FrameUpscaler() = default;
const std::string& FrameUpscaler::name() const { return impl_->name; }
const std::string& FrameUpscaler::weights_sha256() const { return impl_->sha; }

std::vector<std::uint8_t> FrameUpscaler::make(const std::uint8_t* rgb, int width, int height, const FrameSpec& spec,
                                              int& out_w, int& out_h) {
  return upscale_frame(impl_->model.get(), rgb, width, height, spec, out_w, out_h, impl_->tiling);
}

}  // namespace sdxl
