// Test driver of the detector's letterbox (detect/letterbox.h) for tests/parity/parity_detect.py: every
// image letterboxed to W x H in one process, written as float32 [H, W, 3] (the 8-bit values), to be
// compared with Ultralytics' LetterBox(auto=False) (cv2.resize INTER_LINEAR, padding 114) exactly.
//   sdxl_letterbox_runner W H IMAGE.png OUT.npy [IMAGE.png OUT.npy ...]
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

#include "core/npy.h"
#include "detect/letterbox.h"
#include "image/png_reader.h"

int main(int argc, char** argv) {
  if (argc < 5 || (argc - 3) % 2 != 0) {
    std::fprintf(stderr, "usage: %s W H IMAGE.png OUT.npy [IMAGE.png OUT.npy ...]\n", argv[0]);
    return 2;
  }
  try {
    const int w = std::atoi(argv[1]), h = std::atoi(argv[2]);
    for (int i = 3; i + 1 < argc; i += 2) {
      const sdxl::RgbImage img = sdxl::read_png_rgb(argv[i], "image");
      const sdxl::LetterboxGeometry g = sdxl::letterbox_geometry(img.width, img.height, w, h);
      const std::vector<std::uint8_t> boxed = sdxl::letterbox_rgb8(img.rgb.data(), g);
      sdxl::write_npy_f32(argv[i + 1], {h, w, 3}, std::vector<float>(boxed.begin(), boxed.end()));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
