// Values users type on the command line and in batch files: durations, byte
// sizes, shard specs. Pure; each throws UsageError naming the value.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace sdxl {

// "90", "90s", "30m", "6h", "1h30m" -> seconds: finite, 0 or more (what 0
// means is the caller's: for every duration flag of `run`, no limit). NaN,
// infinities and negative values throw UsageError.
double parse_duration_s(const std::string& text);

// "24GiB", "12G", "800MiB", "1.5GB", "65536" (bytes) -> bytes; G/GB and
// GiB are both 2^30 (as nvidia-smi counts).
std::uint64_t parse_size_bytes(const std::string& text);

// --shard K/N: "K/N" with 0 <= K < N.
std::pair<int, int> parse_shard(const std::string& text);

}  // namespace sdxl
