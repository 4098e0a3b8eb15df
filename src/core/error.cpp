#include "core/error.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace sdxl {

bool is_out_of_memory_message(const std::string& message) {
  std::string m = message;
  std::transform(m.begin(), m.end(), m.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  // c10's CUDA OutOfMemoryError ("CUDA out of memory. Tried to allocate ..."),
  // the CPU allocator ("DefaultCPUAllocator: can't allocate memory"), and the
  // status codes cuBLAS, cuDNN and the runtime return when an allocation fails.
  static const std::array<const char*, 7> kMarks = {
      "out of memory", "outofmemoryerror", "can't allocate memory", "cublas_status_alloc_failed",
      "cudnn_status_alloc_failed", "cudaerrormemoryallocation", "cudnn_status_not_enough_workspace"};
  return std::any_of(kMarks.begin(), kMarks.end(), [&](const char* k) { return m.find(k) != std::string::npos; });
}

bool is_device_lost_message(const std::string& message) {
  std::string m = message;
  std::transform(m.begin(), m.end(), m.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  // cudaError_t strings of the sticky errors (the context is unusable after
  // them) and of a device that went away.
  static const std::array<const char*, 10> kMarks = {
      "an illegal memory access was encountered", "unspecified launch failure", "device-side assert triggered",
      "uncorrectable ecc error", "cudaerrordevicesunavailable", "no cuda-capable device is detected",
      "cuda driver version is insufficient", "gpu has fallen off the bus", "cudaerrorlaunchfailure",
      "device lost"};
  return std::any_of(kMarks.begin(), kMarks.end(), [&](const char* k) { return m.find(k) != std::string::npos; });
}

}  // namespace sdxl
