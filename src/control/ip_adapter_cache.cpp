#include "control/ip_adapter_cache.h"

#include <spdlog/spdlog.h>

#include "core/input_file.h"
#include "core/sha256.h"

namespace sdxl {

std::uint64_t IpImageKv::bytes() const {
  std::uint64_t n = 0;
  for (const torch::Tensor& t : kv) n += t.numel() * t.element_size();
  return n;
}

std::shared_ptr<IpAdapter> IpAdapterCache::get(const std::string& dir) {
  bool loaded = false;
  std::shared_ptr<IpAdapter> ip = adapters_.get(
      dir,
      [&] { return task_folder_errors([&] { return std::make_shared<IpAdapter>(load_ip_adapter_config(dir), model_); }); },
      [&](const std::string& key) {
        spdlog::info("IP-Adapter '{}' evicted from the IP-Adapter cache ({} at most)", key, adapters_.capacity());
      },
      &loaded);
  if (loaded)
    spdlog::info("IP-Adapter '{}' loaded ({}, {}): {:.1f} MiB; IP-Adapter cache {} of {}", dir, ip->config().name,
                 ip->config().variant, ip->weight_bytes() / 1048576.0, adapters_.size(), adapters_.capacity());
  return ip;
}

std::shared_ptr<IpImageKv> IpAdapterCache::image(const std::shared_ptr<IpAdapter>& adapter, const std::string& path) {
  // Read once: the bytes give the key, the same bytes are decoded on a miss.
  const std::string bytes = read_input_file(path, "reference image", 256ull << 20);
  const auto* data = reinterpret_cast<const std::uint8_t*>(bytes.data());
  const std::string sha = sha256_hex({data, bytes.size()});
  const std::string key = adapter->config().dir.string() + "\n" + sha;
  return images_.get(
      key,
      [&] {
        auto kv = std::make_shared<IpImageKv>();
        kv->kv = adapter->image_kv(decode_png_rgb(bytes, path, "reference image"));
        kv->sha256 = sha;
        return kv;
      },
      [](const std::string&) {});
}

LruCacheStats IpAdapterCache::image_stats() const {
  LruCacheStats s = images_.stats();
  images_.for_each([&](const IpImageKv& k) { s.resident_bytes += k.bytes(); });
  return s;
}

}  // namespace sdxl
