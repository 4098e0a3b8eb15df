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

// Appends `line` (ending in '\n') to a log-like file (manifest.jsonl,
// seeds.jsonl) in one write() and fsyncs. The file must be a regular file that
// is not a symbolic link (O_NOFOLLOW: a link planted in a shared output folder
// is refused, not followed). When the file does not end in '\n' — a crash or a
// full disk tore the last line — the new line starts on a line of its own, so
// it is never swallowed by the torn one. A short write (full disk) throws
// IoError saying how much was written; errno's text only when there is one.
void append_line_durable(const std::filesystem::path& path, std::string line);

}  // namespace sdxl
