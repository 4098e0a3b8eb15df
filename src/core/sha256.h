// SHA-256 (FIPS 180-4) of bytes or a file, as lowercase hex; used to check that
// a finished image on disk is the one the manifest recorded, and for LoRA
// files' A1111 short hashes. torch-free. Uses the CPU's SHA extensions when it
// has them.
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
// Whether the CPU's SHA extensions are used (else the portable code).
bool sha256_hardware();

namespace detail {
// Tests: set to compare the hardware path with the portable one (not thread-safe).
extern bool sha256_force_portable;
}  // namespace detail

}  // namespace sdxl
