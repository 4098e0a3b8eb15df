// Reference images of an IP-Adapter, as diffusers prepares them: its
// CLIPImageProcessor (transformers 5, the torchvision backend) resizes the
// shortest side to `size` (the other to int(size * long / short)) with
// antialiased bicubic on the 8-bit image, centre-crops size x size (offset
// int((side - size) / 2)), then normalises (x - 255 mean) / (255 std) in float32.
#pragma once

#include <torch/types.h>

#include <vector>

#include "image/png_reader.h"

namespace sdxl {

// [1, 3, size, size] float32 on the CPU. `mean` and `std` hold 3 values each.
torch::Tensor clip_image_tensor(const RgbImage& image, int size, const std::vector<double>& mean,
                                const std::vector<double>& std);

}  // namespace sdxl
