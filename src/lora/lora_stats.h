// The counters of the LoRA cache (lora/lora_cache.h) for logs and the run
// report. torch-free, so the scheduler can carry them.
#pragma once

#include <cstdint>

namespace sdxl {

struct LoraStats {
  std::uint64_t hits = 0, misses = 0, evictions = 0;
  std::uint64_t bytes_held = 0, budget_bytes = 0;
  std::uint64_t switches = 0;         // times the applied set changed
  double load_s = 0, merge_s = 0;     // totals: reading files onto the device, patching weights
  double hash_s = 0;                  // part of load_s: A1111 short hashes (once per file)
};

}  // namespace sdxl
