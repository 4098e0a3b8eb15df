#include "device/device.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <torch/cuda.h>

#include "core/error.h"

namespace sdxl {

torch::Device parse_device(const std::string& name) {
  if (name == "cpu") return torch::Device(torch::kCPU);
  if (name.rfind("cuda", 0) == 0) {
    int index = 0;
    if (name.size() > 4) {
      if (name[4] != ':' || name.size() == 5 || name.size() > 9 ||
          name.find_first_not_of("0123456789", 5) != std::string::npos)
        throw UsageError("--device '" + name + "': expected cpu, cuda or cuda:N");
      index = std::stoi(name.substr(5));
    }
    if (!torch::cuda::is_available())
      throw Error(ExitCode::kFatal, "--device " + name + ": CUDA is not available on this machine (no GPU or driver); use --device cpu");
    const auto count = static_cast<int>(torch::cuda::device_count());
    if (index >= count)
      throw UsageError("--device " + name + ": only " + std::to_string(count) + " CUDA device(s) present");
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  throw UsageError("--device '" + name + "': expected cpu, cuda or cuda:N");
}

torch::Dtype parse_dtype(const std::string& name) {
  if (name == "fp32") return torch::kFloat32;
  if (name == "fp16") return torch::kFloat16;
  if (name == "bf16") return torch::kBFloat16;
  throw UsageError("--dtype '" + name + "': expected fp32, fp16 or bf16");
}

std::string dtype_name(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kFloat32: return "fp32";
    case torch::kFloat16: return "fp16";
    case torch::kBFloat16: return "bf16";
    default: return std::string(c10::toString(dtype));
  }
}

void device_synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

void stream_synchronize(const torch::Device& device) {
  if (device.is_cuda()) c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
}

std::uint64_t device_peak_bytes(const torch::Device& device) {
  if (device.is_cuda()) {
    using c10::CachingAllocator::StatType;
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<std::uint64_t>(stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].peak);
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<std::uint64_t>(ru.ru_maxrss) * 1024u;
}

std::uint64_t device_memory_in_use(const torch::Device& device) {
  if (device.is_cuda()) {
    using c10::CachingAllocator::StatType;
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<std::uint64_t>(stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].current);
  }
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<std::uint64_t>(resident) * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

AllocatorChoice choose_cuda_allocator(const std::string& mode, const char* env_alloc_conf,
                                      const char* env_cuda_alloc_conf) {
  if (mode != "expandable" && mode != "default")
    throw UsageError("--cuda-allocator '" + mode + "': expected expandable or default");
  for (const auto& [name, value] : {std::pair{"PYTORCH_ALLOC_CONF", env_alloc_conf}, {"PYTORCH_CUDA_ALLOC_CONF", env_cuda_alloc_conf}})
    if (value && *value) return {"", std::string(value) + " (" + name + ")"};
  if (mode == "expandable") return {"expandable_segments:True", "expandable_segments:True"};
  return {"", "default"};
}

namespace {
std::once_flag g_alloc_once;
std::mutex g_alloc_mu;
std::string g_alloc_settings;
}  // namespace

void configure_cuda_allocator(const std::string& mode) {
  const AllocatorChoice c =
      choose_cuda_allocator(mode, std::getenv("PYTORCH_ALLOC_CONF"), std::getenv("PYTORCH_CUDA_ALLOC_CONF"));
  std::call_once(g_alloc_once, [&] {
    // Before the first allocation: expandable segments apply to segments made after it.
    if (!c.apply.empty()) c10::CachingAllocator::setAllocatorSettings(c.apply);
    std::lock_guard lk(g_alloc_mu);
    g_alloc_settings = c.report;
  });
}

std::string cuda_allocator_settings() {
  std::lock_guard lk(g_alloc_mu);
  return g_alloc_settings;
}

namespace {
std::mutex g_limit_mu;
std::map<int, std::uint64_t> g_limits;  // device index -> cap set by device_set_memory_limit

std::uint64_t card_total_bytes(int index) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index));
  return prop ? static_cast<std::uint64_t>(prop->totalGlobalMem) : 0;
}

const cudaDeviceProp* cuda_properties(const torch::Device& device) {
  return at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device.has_index() ? device.index() : 0));
}
}  // namespace

std::string cuda_capability(const torch::Device& device) {
  if (!device.is_cuda()) return "";
  const cudaDeviceProp* prop = cuda_properties(device);
  return prop ? std::to_string(prop->major) + "." + std::to_string(prop->minor) : "";
}

std::string fp8_unsupported_reason(const torch::Device& device) {
  if (!device.is_cuda()) return "";
  const cudaDeviceProp* prop = cuda_properties(device);
  const std::string name = "cuda:" + std::to_string(device.has_index() ? device.index() : 0);
  if (!prop) return "cannot read the properties of " + name;
  if (prop->major * 10 + prop->minor >= 89) return "";
  return name + " (" + prop->name + ") has compute capability " + cuda_capability(device) +
         ", without FP8 tensor cores (8.9 or newer: Ada, Hopper, Blackwell)";
}

MemorySnapshot device_memory_snapshot(const torch::Device& device) {
  MemorySnapshot s;
  if (!device.is_cuda()) {
    s.allocated = device_memory_in_use(device);
    s.peak_allocated = device_peak_bytes(device);
    return s;
  }
  using c10::CachingAllocator::StatType;
  const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  const auto agg = static_cast<size_t>(StatType::AGGREGATE);
  s.allocated = static_cast<std::uint64_t>(st.allocated_bytes[agg].current);
  s.reserved = static_cast<std::uint64_t>(st.reserved_bytes[agg].current);
  s.peak_allocated = static_cast<std::uint64_t>(st.allocated_bytes[agg].peak);
  s.peak_reserved = static_cast<std::uint64_t>(st.reserved_bytes[agg].peak);
  s.total = card_total_bytes(device.index());
  std::lock_guard lk(g_limit_mu);
  auto it = g_limits.find(device.index());
  s.limit = it != g_limits.end() ? it->second : s.total;
  return s;
}

void device_release_cached(const torch::Device& device) {
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
}

void device_set_memory_limit(const torch::Device& device, std::uint64_t bytes) {
  if (!device.is_cuda()) return;
  const std::uint64_t total = card_total_bytes(device.index());
  if (total == 0) return;
  if (bytes > total)
    throw UsageError("--vram-limit " + std::to_string(bytes >> 20) + " MiB is more than the card's " +
                     std::to_string(total >> 20) + " MiB");
  // The allocator checks each request against the fraction, but with
  // expandable segments it maps whole segments (20 MiB in the large pool,
  // 2 MiB in the small one), so the reserved peak could pass the limit by up
  // to one of them.
  // The fraction leaves that much below the limit, so the limit holds.
  constexpr std::uint64_t kSegmentSlack = 32ull << 20;
  const std::uint64_t enforced = bytes > 2 * kSegmentSlack ? bytes - kSegmentSlack : bytes;
  const double fraction = bytes == 0 ? 1.0 : static_cast<double>(enforced) / static_cast<double>(total);
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device.index());
  std::lock_guard lk(g_limit_mu);
  g_limits[device.index()] = bytes == 0 ? total : bytes;
}

void device_reset_peak(const torch::Device& device) {
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
}

std::uint64_t device_free_bytes(const torch::Device& device) {
  if (device.is_cuda()) {
    const auto [free, total] = c10::cuda::CUDACachingAllocator::get()->getMemoryInfo(device.index());
    (void)total;
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    const std::int64_t unused = stats.reserved_bytes[agg].current - stats.allocated_bytes[agg].current;
    std::uint64_t avail = static_cast<std::uint64_t>(free) + static_cast<std::uint64_t>(std::max<std::int64_t>(0, unused));
    // Under --vram-limit, what the budget leaves is the bound.
    std::lock_guard lk(g_limit_mu);
    if (auto it = g_limits.find(device.index()); it != g_limits.end()) {
      const auto allocated = static_cast<std::uint64_t>(stats.allocated_bytes[agg].current);
      avail = std::min(avail, it->second > allocated ? it->second - allocated : 0);
    }
    return avail;
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
}

}  // namespace sdxl
