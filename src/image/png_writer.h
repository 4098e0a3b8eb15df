// PNG encoding (stb_image_write; zlib deflates the data in parallel parts) with text metadata chunks, and a reader of
// those chunks. Text that fits Latin-1 goes in a tEXt chunk (what A1111 and
// PIL write), anything else in an uncompressed UTF-8 iTXt chunk. torch-free,
// thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace sdxl {

using PngText = std::vector<std::pair<std::string, std::string>>;  // keyword, UTF-8 text

// RGB8 (channels = 3) or RGBA8 (4), row-major, tightly packed.
std::vector<std::uint8_t> encode_png(int width, int height, int channels, const std::uint8_t* pixels,
                                     const PngText& text);

// encode_png + write_file_atomic. Throws IoError naming the path.
void write_png(const std::filesystem::path& path, int width, int height, int channels,
               const std::uint8_t* pixels, const PngText& text);

// Text chunks (tEXt and uncompressed iTXt) of a PNG file, UTF-8. Throws IoError
// if the file is not a PNG or a chunk is truncated or fails its CRC.
PngText read_png_text(const std::filesystem::path& path);

}  // namespace sdxl
