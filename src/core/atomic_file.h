// Crash-safe file output: data goes to a temporary file in the target's own
// folder, is fsynced, renamed over the target, and the folder is fsynced, so a
// reader (or a rerun after kill -9) sees either the old file or the whole new
// one, never half. Throws IoError naming the path and the system error.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace sdxl {

void write_file_atomic(const std::filesystem::path& path, std::span<const std::uint8_t> data);
void write_file_atomic(const std::filesystem::path& path, std::string_view text);

// Who writes a temporary file. `host` names the host and its PID namespace
// ("<hostname>@<pid namespace inode>", characters other than letters, digits,
// '-', '_' and '@' replaced by '_'), so a pid means something only where `host` is
// equal: another machine, pod or container never has the same `host`. `tag`
// says what wrote it (a shard: "shard-1-of-4"; "" = none).
struct TempFileOwner {
  std::string host;
  long pid = 0;
  std::string tag;
};

// This process: its host, pid and the tag set by set_temp_file_tag.
TempFileOwner this_temp_file_owner();
// The tag written into this process's temporary names from now on (letters,
// digits, '-', '_' and '@' kept, others replaced by '_').
void set_temp_file_tag(const std::string& tag);

// The temporary name write_file_atomic writes `target_name` under:
// ".<target_name>~<host>~<pid>~<tag>~<n>.tmp" (dot-prefixed and .tmp-suffixed,
// so a listing of finished files never shows it). The target part is cut
// short when needed so that the name fits in 255 bytes.
std::string temp_file_name(const std::string& target_name, const TempFileOwner& owner, unsigned n);
// The owner of a name temp_file_name made; nullopt for any other name
// (".<name>.<pid>.<n>.tmp" included: it names no host).
std::optional<TempFileOwner> parse_temp_file_name(const std::string& name);

// Appends `line` (ending in '\n') to a log-like file (manifest.jsonl,
// seeds.jsonl) in one write() and fsyncs. The file must be a regular file that
// is not a symbolic link (O_NOFOLLOW: a link planted in a shared output folder
// is refused, not followed). When the file does not end in '\n' — a crash or a
// full disk tore the last line — the new line starts on a line of its own, so
// it is never swallowed by the torn one. A short write (full disk) throws
// IoError saying how much was written; errno's text only when there is one.
void append_line_durable(const std::filesystem::path& path, std::string line);

}  // namespace sdxl
