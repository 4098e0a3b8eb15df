// Test driver of the upscaler runtime (image/upscaler.h) for tests/parity/parity_upscale.py: one
// process runs every upscaler folder on one image, so the parity test loads libtorch once.
//   sdxl_upscaler_runner TILE[:BATCH] OVERLAP INPUT.npy FOLDER OUT.npy [FOLDER OUT.npy ...]
// BATCH: tiles of one shape per model call (UpscaleTiling::batch, default 1).
// INPUT.npy: float32 [1,3,H,W] in [0,1]; each OUT.npy: the clamped, tiled upscale on the CPU.
#include <ATen/Parallel.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "core/npy.h"
#include "image/upscaler.h"

int main(int argc, char** argv) {
  if (argc < 6 || (argc - 4) % 2 != 0) {
    std::fprintf(stderr, "usage: %s TILE[:BATCH] OVERLAP INPUT.npy FOLDER OUT.npy [FOLDER OUT.npy ...]\n", argv[0]);
    return 2;
  }
  try {
    at::set_num_threads(1);
    sdxl::UpscaleTiling tiling;
    tiling.tile = std::atoi(argv[1]);
    if (const char* colon = std::strchr(argv[1], ':')) tiling.batch = std::atoi(colon + 1);
    tiling.overlap = std::atoi(argv[2]);
    tiling.min_tile = tiling.tile;
    std::vector<std::int64_t> shape;
    std::vector<float> data = sdxl::read_npy_f32(argv[3], &shape);
    const torch::Tensor image = torch::from_blob(data.data(), shape, torch::kFloat32).clone();
    for (int i = 4; i + 1 < argc; i += 2) {
      sdxl::Upscaler up(argv[i], torch::Device(torch::kCPU));
      const torch::Tensor out = up.upscale(image, tiling).contiguous();
      const std::vector<float> flat(out.data_ptr<float>(), out.data_ptr<float>() + out.numel());
      sdxl::write_npy_f32(argv[i + 1], out.sizes().vec(), flat);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
