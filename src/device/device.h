// Device selection: "cpu", "cuda", "cuda:N" -> torch::Device, with clear errors
// when CUDA is absent or the index is out of range; dtype names <-> torch dtypes.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "core/memory.h"
#include "device/cuda_allocator.h"

namespace sdxl {

// Throws UsageError for a malformed name, Error(kFatal) when CUDA is not usable.
torch::Device parse_device(const std::string& name);
// "fp32" | "fp16" | "bf16" -> dtype; throws UsageError naming the value.
torch::Dtype parse_dtype(const std::string& name);
// --precision fp8 on `device`: "" when it can run FP8 matmuls (the CPU, emulated;
// a CUDA GPU of compute capability 8.9 or newer: Ada, Hopper, Blackwell), else
// why not, naming the GPU and its compute capability.
std::string fp8_unsupported_reason(const torch::Device& device);
// The compute capability of a CUDA device as "major.minor" ("9.0"); "" for the CPU.
std::string cuda_capability(const torch::Device& device);
std::string dtype_name(torch::Dtype dtype);
// Blocks until queued work on the device is done (no-op on CPU): stage timings.
void device_synchronize(const torch::Device& device);
// Blocks until the work queued on this thread's current stream is done (no-op
// on CPU): a pipeline stage waits for its own stream, not the others'.
void stream_synchronize(const torch::Device& device);
// Peak bytes allocated by the CUDA caching allocator since the last reset, or
// the process's peak resident set size on CPU.
std::uint64_t device_peak_bytes(const torch::Device& device);
void device_reset_peak(const torch::Device& device);
// Bytes allocated now by the CUDA caching allocator, or the process's resident set on CPU.
std::uint64_t device_memory_in_use(const torch::Device& device);
// Allocator figures now and since the last reset (CPU: resident set only).
MemorySnapshot device_memory_snapshot(const torch::Device& device);
// Frees the caching allocator's unused cached blocks (no-op on CPU).
void device_release_cached(const torch::Device& device);
// Caps the caching allocator at `bytes` (setMemoryFraction of the card); 0 lifts
// the cap. No-op on CPU. Throws UsageError when larger than the card.
void device_set_memory_limit(const torch::Device& device, std::uint64_t bytes);
// Bytes that could still be allocated: the driver's free memory plus what the
// CUDA caching allocator holds unused; on CPU the system's available memory.
std::uint64_t device_free_bytes(const torch::Device& device);

}  // namespace sdxl
