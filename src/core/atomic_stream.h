// write_file_atomic (core/atomic_file.h) for data made in pieces, such as a page too large to be worth
// holding in memory whole: the same temporary file, fsync, rename and folder fsync. torch-free.
#pragma once

#include <filesystem>
#include <functional>
#include <string_view>

namespace sdxl {

// `produce` gets a function that appends a piece to the temporary file; the file is renamed into place
// when produce returns, and removed if produce throws. Throws IoError naming the path.
void write_file_atomic_streamed(const std::filesystem::path& path,
                                const std::function<void(const std::function<void(std::string_view)>&)>& produce);

}  // namespace sdxl
