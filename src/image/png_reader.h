// PNG decoding for img2img input images (stb_image). Any PNG colour type and
// bit depth is read as 8-bit RGB (alpha dropped, 16-bit scaled down, grey
// expanded). torch-free, thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace sdxl {

struct RgbImage {
  int width = 0, height = 0;
  std::vector<std::uint8_t> rgb;  // height * width * 3, row-major
};

// Throws UsageError "WHAT 'PATH' why" when the file is missing or not a readable PNG.
RgbImage read_png_rgb(const std::filesystem::path& path, const std::string& what = "init image");
// The same for a PNG file's bytes already read (`path` names it in the error).
RgbImage decode_png_rgb(const std::string& data, const std::filesystem::path& path, const std::string& what);

// Size of a PNG without decoding it; "" when fine, else why it cannot be used.
std::string png_size(const std::filesystem::path& path, int& width, int& height);

}  // namespace sdxl
