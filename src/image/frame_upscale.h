// The final upscale of an image to its frame, behind a torch-free header (the API and the torch-free
// layers use it): FrameSpec says the frame, FrameUpscaler holds the upscaler folder ("Lanczos": none)
// and makes frames (image/upscaler.h: the model's tiling and passes). Thread-compatible: one
// FrameUpscaler per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace sdxl {

// The frame a final upscale makes: by a factor (scale > 0: round(width x scale) x round(height x scale))
// or to a size with a fit: stretch (to the size, the aspect ratio changed), crop (scaled to cover the
// frame, the centre cut out), pad (scaled to fit inside, centred on black).
enum class FrameFit { kStretch, kCrop, kPad };
struct FrameSpec {
  double scale = 0;  // > 0: by this factor; else to width x height
  int width = 0, height = 0;
  FrameFit fit = FrameFit::kStretch;
};
// "stretch" | "crop" | "pad"; UsageError naming `what` otherwise.
FrameFit parse_frame_fit(const std::string& text, const std::string& what);
// The size the image is resized to before the crop or pad (the frame's size for stretch and scale).
std::pair<int, int> frame_resize_size(int width, int height, const FrameSpec& spec);

class FrameUpscaler {
 public:
  // upscaler: an upscaler folder, or "Lanczos"; device: "auto" (CUDA when present), "cpu", "cuda[:N]".
  // On CUDA up to 4 tiles of an image go through one model call (fewer after an out-of-memory).
  // ModelError for a folder that is not an upscaler or does not load; UsageError for a bad device.
  FrameUpscaler(const std::string& upscaler, const std::string& device, int tile = 512);
  ~FrameUpscaler();
  FrameUpscaler(const FrameUpscaler&) = delete;
  FrameUpscaler& operator=(const FrameUpscaler&) = delete;
  // What images name it (A1111's "Postprocess upscaler"): the source file's stem, or "Lanczos".
  const std::string& name() const;
  // upscaler.ts's sha256 as model.json records it ("" for Lanczos): a new export makes frames again.
  const std::string& weights_sha256() const;
  // 8-bit RGB (width x height) as `spec` says; out_w, out_h receive the frame's size.
  std::vector<std::uint8_t> make(const std::uint8_t* rgb, int width, int height, const FrameSpec& spec, int& out_w,
                                 int& out_h);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sdxl
