// Upscaler models (export_sdxl.py --upscaler folders) run as ComfyUI's ImageUpscaleWithModel runs
// them: comfy.utils.tiled_scale with tile 512 and overlap 32, the whole image in one call when it fits
// a tile, else overlapping tiles every tile - overlap px (the last tile of a row or column ends at the
// border, so it may be shorter), each tile's output weighted by a linear feather of
// round(overlap * scale) px on each side and the weighted sum divided by the summed weights; on an
// out-of-memory the tile is halved and the image redone, down to 128 (then the OutOfMemoryError
// propagates). RGB in [0, 1]; the output is clamped to [0, 1]. A tile smaller than 4 x overlap
// (below 128 px at overlap 32: a small fixed tile, --tile 64) overlaps by tile / 4 instead,
// ComfyUI's rule for tiled VAE decodes (nodes.py VAEDecodeTiled: "if tile_size < overlap * 4:
// overlap = tile_size // 4"), so the step tile - overlap is always above 0. An output that is not
// finite (NaN, infinity) throws TaskError: clamped and taken to 8 bits it would be a black image.
//
// A fixed-tile folder (window-attention architectures, model.json tile.fixed) runs only at its
// traced size T: tiles are T (not halved), a shorter tile is padded to T (by reflection when it is
// more than half of T on that side, else by repeating its edge) and its output cropped.
// upscale() keeps no state between calls (the TorchScript module's forward is reentrant): two stages
// may share one Upscaler.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "image/frame_upscale.h"
#include "model/upscaler_config.h"

namespace sdxl {

// batch: at most this many tiles of one image (of one shape) go through one model call; on an
// out-of-memory the batch is halved before the tile is. The image is the same whatever the batch.
struct UpscaleTiling {
  int tile = 512, overlap = 32, min_tile = 128, batch = 1;
};

class Upscaler {
 public:
  // ModelError when the folder is not an upscaler folder or its module does not load. On the CPU the
  // module runs in fp32 (the folder's fp16 weights are cast).
  Upscaler(const std::filesystem::path& dir, const torch::Device& device);
  const UpscalerConfig& config() const { return config_; }
  // The bytes its parameters and buffers take on its device (what a cache counts).
  std::uint64_t weight_bytes() const;
  // images [B,3,H,W] float in [0,1] (any device) -> [B,3,H*scale,W*scale] float32 on the CPU in [0,1].
  torch::Tensor upscale(const torch::Tensor& images, const UpscaleTiling& tiling = {});
  // The same, left on the model's device.
  torch::Tensor upscale_on_device(const torch::Tensor& images, const UpscaleTiling& tiling = {});

 private:
  // One model call on tiles [N,3,h,w] of one size (fixed tiles padded and cropped): fp32 on the device.
  torch::Tensor call(const torch::Tensor& tiles);
  torch::Tensor tiled(const torch::Tensor& image, int tile, int overlap, int batch);  // one image [1,3,H,W]
  UpscalerConfig config_;
  torch::Device device_;
  torch::ScalarType dtype_;
  torch::jit::Module module_;
};

// The overlap tiles of `tile` px use when `overlap` is asked for (ComfyUI's rule above).
int tile_overlap(int tile, int overlap);

// The feather mask of a tile output [1,C,h,w]: comfy.utils.tiled_scale_multidim's linear ramp of
// `feather` px on each side of each dimension that is longer than the ramp.
torch::Tensor feather_mask(int64_t h, int64_t w, int64_t channels, int feather);

// 8-bit RGB brought to out_w x out_h as A1111's upscale_with_model does: while the image is smaller
// than the target on either side, one model pass (at most 3; none when `upscaler` is null, "Lanczos"),
// each pass's output to 8 bits as ComfyUI's image nodes do (clip(255 x) truncated); then LANCZOS to
// the exact size (PIL's, image/resize.h) when it differs.
std::vector<std::uint8_t> upscale_rgb8(Upscaler* upscaler, const std::uint8_t* rgb, int width, int height, int out_w,
                                       int out_h, const UpscaleTiling& tiling = {});

// rgb (width x height) as the frame `spec` says; out_w, out_h receive its size.
std::vector<std::uint8_t> upscale_frame(Upscaler* upscaler, const std::uint8_t* rgb, int width, int height,
                                        const FrameSpec& spec, int& out_w, int& out_h, const UpscaleTiling& tiling = {});

}  // namespace sdxl
