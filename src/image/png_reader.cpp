#include "image/png_reader.h"

// stb_image is header-only; its implementation lives in this file alone, PNG only.
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#define STBI_NO_STDIO
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wconversion"
#pragma GCC diagnostic ignored "-Wsign-conversion"
#pragma GCC diagnostic ignored "-Wold-style-cast"
#pragma GCC diagnostic ignored "-Wdouble-promotion"
#pragma GCC diagnostic ignored "-Wcast-qual"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wuseless-cast"
#endif
#include <stb/stb_image.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#include <iterator>
#include <memory>

#include "core/error.h"
#include "core/input_file.h"

namespace sdxl {
namespace {

// An image is a regular file of at most 256 MiB (a FIFO or /dev/zero is refused, not read).
std::string read_bytes(const std::filesystem::path& path, std::string& why) {
  InputFile f(path, 256ull << 20);
  std::string data = f.ok() ? f.read_all() : std::string();
  why = f.error();
  return data;
}

const stbi_uc* bytes_of(const std::string& s) { return reinterpret_cast<const stbi_uc*>(s.data()); }

// Why the PNG in `data` cannot be decoded, or "": its header read, its size
// held to kMaxInputImagePixels, then every pixel decoded (into `img` when given).
std::string decode_problem(const std::string& data, RgbImage* img, int& width, int& height) {
  int comp = 0;
  if (!stbi_info_from_memory(bytes_of(data), static_cast<int>(data.size()), &width, &height, &comp))
    return std::string("is not a readable PNG (") + stbi_failure_reason() + ")";
  const std::uint64_t pixels = static_cast<std::uint64_t>(width) * static_cast<std::uint64_t>(height);
  if (pixels > kMaxInputImagePixels)
    return "is " + std::to_string(width) + "x" + std::to_string(height) + ": more than the " +
           std::to_string(kMaxInputImagePixels) + " pixels (16384x16384) an input image may have";
  std::unique_ptr<stbi_uc, void (*)(void*)> px(
      stbi_load_from_memory(bytes_of(data), static_cast<int>(data.size()), &width, &height, &comp, 3),
      stbi_image_free);
  if (!px) return std::string("is not a readable PNG (") + stbi_failure_reason() + ")";
  if (img) {
    img->width = width;
    img->height = height;
    img->rgb.assign(px.get(), px.get() + static_cast<size_t>(width) * static_cast<size_t>(height) * 3);
  }
  return "";
}

}  // namespace

std::string png_size(const std::filesystem::path& path, int& width, int& height) {
  std::string why;
  const std::string data = read_bytes(path, why);
  if (!why.empty()) return why;
  int comp = 0;
  if (!stbi_info_from_memory(bytes_of(data), static_cast<int>(data.size()), &width, &height, &comp))
    return std::string("is not a readable PNG (") + stbi_failure_reason() + ")";
  return "";
}

RgbImage read_png_rgb(const std::filesystem::path& path, const std::string& what) {
  std::string why;
  const std::string data = read_bytes(path, why);
  if (!why.empty()) throw UsageError(what + " '" + path.string() + "' " + why);
  return decode_png_rgb(data, path, what);
}

RgbImage decode_png_rgb(const std::string& data, const std::filesystem::path& path, const std::string& what) {
  RgbImage img;
  int w = 0, h = 0;
  if (const std::string why = decode_problem(data, &img, w, h); !why.empty())
    throw UsageError(what + " '" + path.string() + "' " + why);
  return img;
}

std::string png_decode_problem(const std::filesystem::path& path, int& width, int& height) {
  width = height = 0;
  std::string why;
  const std::string data = read_bytes(path, why);
  if (!why.empty()) return why;
  return decode_problem(data, nullptr, width, height);
}

}  // namespace sdxl
