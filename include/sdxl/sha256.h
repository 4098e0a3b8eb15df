// SHA-256 (FIPS 180-4) of bytes or a file, as lowercase hex; used to check that
// a finished image on disk is the one the manifest recorded. torch-free.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>

namespace sdxl {

std::string sha256_hex(std::span<const std::uint8_t> data);
// nullopt when the file cannot be read.
std::optional<std::string> sha256_file_hex(const std::filesystem::path& path);

}  // namespace sdxl
