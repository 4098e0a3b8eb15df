// VAE decode as diffusers' SDXL pipeline does it: latents cast to the decode
// dtype, divided by the scaling factor, decoded, then (x / 2 + 0.5).clamp(0, 1),
// * 255, rounded half to even, to uint8 HWC RGB. Throws TaskError on NaN output.
//
// Decode dtype (--vae-dtype): auto = on a GPU the model's compute dtype (fp16
// for the GPU exports, whose VAE is stored in fp32), on the CPU the stored one;
// or fp32 / fp16 / bf16. The traced
// decoder is retyped (sdxl_model.h, retyped_module). A decode in a dtype other
// than fp32 whose output has NaN or Inf (SDXL's VAE overflows fp16 on some
// latents) is logged and redone by an fp32 decoder loaded on first need, so the
// image is never lost; each image is decided alone, so it does not depend on
// the others in the run.
//
// Backend (--vae-backend): the traced vae_decoder.ts, or the model's
// vae_decoder.pt2 (AOTInductor, export_sdxl.py --aoti; its measured speed:
// docs/models-and-export.md#aotinductor-vae-decoder), which is compiled for one
// image size in the decode dtype: whole images of that size decode on it,
// other sizes, tiles and the fp32 re-decode on vae_decoder.ts. VAE folders of
// the same architecture run the same package on their own weights.
//
// Tiled decode keeps the decoder's peak memory flat whatever the image size:
// overlapping latent tiles are decoded one by one and blended with linear
// ramps across each overlap (weights normalised per pixel), so there is no
// hard seam. GroupNorm statistics are per tile, so a tiled image differs a
// little from a whole one (figures in tests/unit/test_vae_tiling.cpp). Used
// on request or, by default, when the whole decode runs out of memory.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/sdxl_model.h"

namespace sdxl {

enum class VaeTiling { kAuto, kAlways, kNever };  // auto: whole, tiled after an out-of-memory
VaeTiling parse_vae_tiling(const std::string& text);  // "auto" | "always" | "never"; UsageError otherwise

// --vae-dtype: "auto" | "fp32" | "fp16" | "bf16" (UsageError otherwise). Makes
// model.vae_decoder run in that dtype (retyping the exported one if needed).
void set_vae_decode_dtype(SdxlModel& model, const std::string& option);

// --vae-backend, after set_vae_decode_dtype: "torchscript" uses vae_decoder.ts
// only; "aoti" attaches the model's vae_decoder.pt2 (ModelError when the model
// has none, or it was compiled for another device, GPU or decode dtype:
// vae_aoti_mismatch); "auto" attaches it when it fits, else says why in the
// log. UsageError for another value.
void attach_vae_decoder_aoti(SdxlModel& model, const std::string& backend);

// A VAE folder's bundle `vae` (pipeline/vae_cache.h), after its
// set_vae_decode_dtype: it decodes on `model`'s vae_decoder.pt2 too, with its
// own weights, when the model has the package attached and the folder's
// decoder has the same tensors (names, shapes, dtypes: SDXL's VAEs do) and
// equals the model's in those the package holds compiled in rather than as
// constants; else on its own vae_decoder.ts, with a log line saying why.
void share_vae_decoder_aoti(SdxlModel& vae, const SdxlModel& model);

struct TileGrid {
  int tile = 64;     // latent pixels per tile side (64 = 512 image pixels)
  int overlap = 16;  // latent pixels shared by neighbouring tiles
};

// Tile starts along one side of `size` latent pixels (the last tile ends at size).
std::vector<int64_t> tile_starts(int64_t size, int tile, int overlap);

// Decoder output [1, 3, H, W] in [-1, 1] (float32) for latents [1, 4, h, w]
// (unscaled), in the decode dtype, without the NaN fallback.
torch::Tensor vae_decode_image(SdxlModel& model, const torch::Tensor& latents);
torch::Tensor vae_decode_image_tiled(SdxlModel& model, const torch::Tensor& latents, const TileGrid& grid = {});

// latents [1, 4, h, w] -> RGB8 bytes of size 8h * 8w * 3 (row-major), with the
// fp32 re-decode of NaN/Inf output; `label` names the image in the warning.
std::vector<std::uint8_t> vae_decode_rgb8(SdxlModel& model, const torch::Tensor& latents,
                                          VaeTiling tiling = VaeTiling::kAuto, const TileGrid& grid = {},
                                          const std::string& label = "");
// [1, 3, H, W] decoder output -> RGB8 (the pipeline's postprocess); TaskError on NaN.
std::vector<std::uint8_t> image_to_rgb8(const torch::Tensor& image, const std::string& what);

}  // namespace sdxl
