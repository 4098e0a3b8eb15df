// Minimal .npy (NumPy format) writer and reader for float32 arrays, used to
// hand tensors to and from the Python reference scripts. torch-free.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

namespace sdxl {

void write_npy_f32(const std::filesystem::path& path, const std::vector<std::int64_t>& shape,
                   const std::vector<float>& data);

// Reads a little-endian float32, C-order .npy (version 1 or 2) as numpy.save
// writes it. Throws IoError naming the file when it is anything else.
std::vector<float> read_npy_f32(const std::filesystem::path& path, std::vector<std::int64_t>* shape);

}  // namespace sdxl
