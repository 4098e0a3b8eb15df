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

// The most pixels an input PNG may have (the largest image a task may ask for,
// 16384 x 16384): a larger one is refused from its header, before decoding, so
// a small file cannot make a run (or validate) allocate gigabytes.
inline constexpr std::uint64_t kMaxInputImagePixels = 16384ull * 16384ull;

// Throws UsageError "WHAT 'PATH' why" when the file is missing or not a readable PNG.
RgbImage read_png_rgb(const std::filesystem::path& path, const std::string& what = "init image");
// The same for a PNG file's bytes already read (`path` names it in the error).
RgbImage decode_png_rgb(const std::string& data, const std::filesystem::path& path, const std::string& what);

// Size of a PNG without decoding it; "" when fine, else why it cannot be used.
std::string png_size(const std::filesystem::path& path, int& width, int& height);

// The file read and decoded whole, as read_png_rgb does at run time (so a
// truncated or corrupt PNG is found), the pixels dropped: "" and its size when
// it decodes, else why it cannot be used. What `validate` asks of an image.
std::string png_decode_problem(const std::filesystem::path& path, int& width, int& height);

}  // namespace sdxl
