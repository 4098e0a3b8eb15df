// Minimal .npy (NumPy format 1.0) writer for float32 arrays, used to hand
// tensors (final latents) to the Python parity scripts. torch-free.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

namespace sdxl {

void write_npy_f32(const std::filesystem::path& path, const std::vector<std::int64_t>& shape,
                   const std::vector<float>& data);

}  // namespace sdxl
