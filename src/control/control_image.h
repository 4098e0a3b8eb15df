// Control images: the PNG a task gives each ControlNet, as diffusers' control
// image processor prepares it (VaeImageProcessor with do_normalize=False): RGB,
// resized to the pass's size with PIL's LANCZOS when it differs (stretched,
// no crop), scaled to [0, 1].
#pragma once

#include <torch/types.h>

#include <string>

#include "image/png_reader.h"

namespace sdxl {

// [1, 3, height, width] in `dtype` on `device`.
torch::Tensor control_image_tensor(const RgbImage& image, int width, int height, torch::Dtype dtype,
                                   const torch::Device& device);

// "" when the image's aspect ratio is the task's (within 1%), else a warning
// that it is stretched to width x height, naming the file.
std::string control_aspect_note(const std::string& path, const RgbImage& image, int width, int height);

}  // namespace sdxl
