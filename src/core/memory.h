// MemorySnapshot: device memory as the CUDA caching allocator sees it, in
// bytes; on the CPU, allocated = resident set, peak_allocated = peak resident
// set and the rest 0. A plain value: the scheduler reads it for admission and
// the report without knowing the device.
#pragma once

#include <cstdint>

namespace sdxl {

struct MemorySnapshot {
  std::uint64_t allocated = 0, reserved = 0;            // now
  std::uint64_t peak_allocated = 0, peak_reserved = 0;  // since the last reset_peak()
  std::uint64_t limit = 0;                              // budget (--vram-limit or the card), 0 on CPU
  std::uint64_t total = 0;                              // the card's memory, 0 on CPU
};

}  // namespace sdxl
