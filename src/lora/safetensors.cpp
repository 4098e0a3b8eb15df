#include "lora/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/input_file.h"
#include "core/sha256.h"

namespace sdxl {
namespace {

using nlohmann::json;

// Byte-sized dtypes of the format (safetensors/src/tensor.rs, enum Dtype).
// Sub-byte types (F4, F6_*) are left out: no LoRA uses them.
std::size_t dtype_bytes(const std::string& d) {
  static const std::map<std::string, std::size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1}, {"I16", 2},
      {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},     {"F64", 8},
      {"I64", 8},  {"U64", 8}, {"C64", 8}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

[[noreturn]] void fail(const std::string& label, const std::string& what) {
  throw UsageError("safetensors file '" + label + "': " + what);
}
[[noreturn]] void fail_tensor(const std::string& label, const std::string& tensor, const std::string& what) {
  fail(label, "tensor '" + tensor + "': " + what);
}

std::uint64_t read_u64_le(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits = 0;
  if (exp == 0) {
    if (mant == 0) bits = sign;
    else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400u)) { mant <<= 1; --exp; }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) bits = sign | 0x7f800000u | (mant << 13);
  else bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

std::uint64_t SafetensorsTensor::numel() const {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

SafetensorsHeader parse_safetensors(std::span<const std::uint8_t> file, const std::string& label) {
  if (file.size() < 8) fail(label, "only " + std::to_string(file.size()) + " bytes; a safetensors file starts with an 8-byte header length (truncated?)");
  const std::uint64_t n = read_u64_le(file.data());
  if (n > kSafetensorsMaxHeaderBytes)
    fail(label, "header length " + std::to_string(n) + " exceeds the format's 100 MB limit (corrupt or not a safetensors file)");
  if (n > file.size() - 8)
    fail(label, "header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(file.size()) + " bytes; truncated?)");
  const auto* hbegin = reinterpret_cast<const char*>(file.data() + 8);
  const std::string_view header_text(hbegin, n);
  if (header_text.empty() || header_text.front() != '{') fail(label, "header does not start with '{' (not a safetensors file?)");

  // Duplicate names are refused (the reference's deserializer does too); a
  // parser callback sees each key of the top-level object.
  std::set<std::string> seen;
  std::string duplicate;
  json j;
  try {
    j = json::parse(header_text, [&](int depth, json::parse_event_t ev, json& parsed) {
      if (ev == json::parse_event_t::key && depth == 1) {
        const auto& k = parsed.get_ref<const std::string&>();
        if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
      }
      return true;
    });
  } catch (const json::exception& e) {
    fail(label, std::string("header is not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) fail_tensor(label, duplicate, "appears twice in the header");
  if (!j.is_object()) fail(label, "header is not a JSON object");

  SafetensorsHeader h;
  h.data_offset = 8 + n;
  const std::uint64_t data_bytes = file.size() - h.data_offset;
  for (const auto& [name, info] : j.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) fail(label, "__metadata__ must be an object of strings");
      for (const auto& [k, v] : info.items()) {
        if (!v.is_string()) fail(label, "__metadata__ value '" + k + "' is not a string");
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (!info.is_object()) fail_tensor(label, name, "entry is not an object with dtype, shape, data_offsets");
    SafetensorsTensor t;
    t.name = name;
    if (!info.contains("dtype") || !info["dtype"].is_string()) fail_tensor(label, name, "dtype is missing or not a string");
    t.dtype = info["dtype"].get<std::string>();
    t.element_bytes = dtype_bytes(t.dtype);
    if (t.element_bytes == 0) fail_tensor(label, name, "unknown dtype '" + t.dtype + "'");
    if (!info.contains("shape") || !info["shape"].is_array()) fail_tensor(label, name, "shape is missing or not an array");
    for (const auto& d : info["shape"]) {
      if (!d.is_number_unsigned()) fail_tensor(label, name, "shape has a value that is not a non-negative integer");
      const std::uint64_t v = d.get<std::uint64_t>();
      if (v > static_cast<std::uint64_t>(INT64_MAX)) fail_tensor(label, name, "shape value too large");
      t.shape.push_back(static_cast<std::int64_t>(v));
    }
    const auto it = info.find("data_offsets");
    if (it == info.end() || !it->is_array() || it->size() != 2 || !(*it)[0].is_number_unsigned() ||
        !(*it)[1].is_number_unsigned())
      fail_tensor(label, name, "data_offsets must be [begin, end] with non-negative integers");
    t.begin = (*it)[0].get<std::uint64_t>();
    t.end = (*it)[1].get<std::uint64_t>();
    h.tensors.push_back(std::move(t));
  }

  // Validation as tensor.rs Metadata::validate: sorted by offset, each span
  // starting where the previous ended, size = numel * dtype size (checked),
  // the last ending exactly at the end of the file.
  std::sort(h.tensors.begin(), h.tensors.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t pos = 0;
  for (auto& t : h.tensors) {
    if (t.end < t.begin) fail_tensor(label, t.name, "data_offsets end before they begin");
    if (t.begin != pos)
      fail_tensor(label, t.name, t.begin < pos ? "byte span overlaps the previous tensor's" : "byte span leaves a gap after the previous tensor");
    std::uint64_t elems = 1, bytes = 0;
    for (auto d : t.shape)
      if (__builtin_mul_overflow(elems, static_cast<std::uint64_t>(d), &elems)) fail_tensor(label, t.name, "shape overflows");
    if (__builtin_mul_overflow(elems, static_cast<std::uint64_t>(t.element_bytes), &bytes))
      fail_tensor(label, t.name, "shape x dtype size overflows");
    if (bytes != t.end - t.begin)
      fail_tensor(label, t.name, "shape x " + t.dtype + " is " + std::to_string(bytes) + " bytes but its span is " +
                                     std::to_string(t.end - t.begin) + " bytes (lying shape or dtype)");
    if (t.end > data_bytes) fail_tensor(label, t.name, "byte span runs past the end of the file (truncated?)");
    t.bytes = file.subspan(h.data_offset + t.begin, t.end - t.begin);
    pos = t.end;
  }
  if (pos != data_bytes)
    fail(label, "the data section is " + std::to_string(data_bytes) + " bytes but the tensors cover " +
                    std::to_string(pos) + " (trailing bytes or a truncated header)");
  return h;
}

struct SafetensorsFile::VectorStorage : Storage {
  std::vector<std::uint8_t> data;
  std::span<const std::uint8_t> bytes() const override { return data; }
};

// RAII read-only mapping of a whole file.
struct SafetensorsFile::MappedStorage : Storage {
  void* addr = nullptr;
  std::size_t len = 0;
  ~MappedStorage() override {
    if (addr && len) munmap(addr, len);
  }
  std::span<const std::uint8_t> bytes() const override {
    return {static_cast<const std::uint8_t*>(addr), len};
  }
};

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  const std::string label = path.string();
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  if (ext == ".ckpt" || ext == ".pt" || ext == ".pth" || ext == ".bin" || ext == ".pkl")
    throw UsageError("LoRA file '" + label + "' is a pickle file (" + ext +
                     "); sdxl-batch does not load pickles because unpickling can run arbitrary code. Convert it to "
                     ".safetensors (e.g. `python -c \"import torch, safetensors.torch as st; "
                     "st.save_file(torch.load('in" + ext + "', weights_only=True), 'out.safetensors')\"`)");
  const InputFile in(path, std::numeric_limits<std::uint64_t>::max());  // a FIFO or a device is refused unopened
  if (!in.ok()) throw UsageError("LoRA file '" + label + "' " + in.error());
  auto m = std::make_shared<MappedStorage>();
  m->len = static_cast<std::size_t>(in.size());
  if (m->len > 0) {
    m->addr = mmap(nullptr, m->len, PROT_READ, MAP_PRIVATE, in.fd(), 0);
    if (m->addr == MAP_FAILED) {
      m->addr = nullptr;
      throw UsageError("cannot map LoRA file '" + label + "': " + std::strerror(errno));
    }
  }
  SafetensorsFile f;
  f.label_ = label;
  f.header_ = parse_safetensors(m->bytes(), label);
  f.storage_ = std::move(m);
  f.build_index();
  return f;
}

SafetensorsFile SafetensorsFile::from_bytes(std::vector<std::uint8_t> bytes, const std::string& label) {
  auto v = std::make_shared<VectorStorage>();
  v->data = std::move(bytes);
  SafetensorsFile f;
  f.label_ = label;
  f.header_ = parse_safetensors(v->bytes(), label);
  f.storage_ = std::move(v);
  f.build_index();
  return f;
}

void SafetensorsFile::build_index() {
  index_.clear();
  for (std::size_t i = 0; i < header_.tensors.size(); ++i) index_.emplace(header_.tensors[i].name, i);
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

std::span<const std::uint8_t> SafetensorsFile::data_section() const {
  return storage_->bytes().subspan(header_.data_offset);
}

double safetensors_scalar(const SafetensorsTensor& t, const std::string& label) {
  if (t.numel() < 1) fail_tensor(label, t.name, "is empty; expected a scalar");
  const std::uint8_t* p = t.bytes.data();
  if (t.dtype == "F32") { float f; std::memcpy(&f, p, 4); return f; }
  if (t.dtype == "F64") { double d; std::memcpy(&d, p, 8); return d; }
  if (t.dtype == "F16") { std::uint16_t h; std::memcpy(&h, p, 2); return half_to_float(h); }
  if (t.dtype == "BF16") {
    std::uint32_t bits = static_cast<std::uint32_t>(p[0] | (p[1] << 8)) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  if (t.dtype == "I64") { std::int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
  if (t.dtype == "I32") { std::int32_t v; std::memcpy(&v, p, 4); return v; }
  fail_tensor(label, t.name, "dtype " + t.dtype + " is not a number type for a scalar");
}

std::string lora_short_hash(const SafetensorsFile& f) { return sha256_hex(f.data_section()).substr(0, 12); }

}  // namespace sdxl
