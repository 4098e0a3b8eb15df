// Crash-safe file output: data goes to a temporary file in the target's own
// folder, is fsynced, renamed over the target, and the folder is fsynced, so a
// reader (or a rerun after kill -9) sees either the old file or the whole new
// one, never half. Throws IoError naming the path and the system error.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>

namespace sdxl {

void write_file_atomic(const std::filesystem::path& path, std::span<const std::uint8_t> data);
void write_file_atomic(const std::filesystem::path& path, std::string_view text);

}  // namespace sdxl
