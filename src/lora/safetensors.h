// safetensors reader: the file is memory-mapped (or, for tests and the fuzzer,
// held as bytes) and its header validated the way the format's reference
// implementation (huggingface/safetensors, safetensors/src/tensor.rs) does:
// header length inside the file and below 100 MB, well-formed UTF-8 JSON, no
// duplicate names, known dtypes, shape x dtype size equal to the byte span,
// spans contiguous from 0, non-overlapping and ending exactly at the end of the
// file, overflow-checked arithmetic. Every error is a UsageError naming the
// file and, where there is one, the tensor. Pickle formats are refused.
// torch-free; an open file is immutable and safe to read from several threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sdxl {

inline constexpr std::uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;  // as the reference: 100 MB

struct SafetensorsTensor {
  std::string name;
  std::string dtype;                  // as in the file: F32, F16, BF16, ...
  std::size_t element_bytes = 0;      // bytes of one element of dtype
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;   // byte span relative to the data section
  std::span<const std::uint8_t> bytes;  // the span inside the mapped file

  std::uint64_t numel() const;
};

// Parses and validates a whole safetensors image (header + data). `label` names
// the file in error messages. The returned tensors' byte spans point into `file`,
// sorted by offset. Throws UsageError.
struct SafetensorsHeader {
  std::vector<SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__"
  std::uint64_t data_offset = 0;                // 8 + header length
};
SafetensorsHeader parse_safetensors(std::span<const std::uint8_t> file, const std::string& label);

class SafetensorsFile {
 public:
  // Memory-maps and validates. Refuses .ckpt/.pt/.pth/.bin (pickle) with a hint.
  static SafetensorsFile open(const std::filesystem::path& path);
  // Validates bytes held in memory (tests, fuzzer).
  static SafetensorsFile from_bytes(std::vector<std::uint8_t> bytes, const std::string& label);

  const std::string& label() const { return label_; }
  const std::vector<SafetensorsTensor>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  // nullptr when absent.
  const SafetensorsTensor* find(std::string_view name) const;
  // The data section (everything after the header): what A1111 hashes for "Lora hashes".
  std::span<const std::uint8_t> data_section() const;
  std::uint64_t file_bytes() const { return storage_ ? storage_->size() : 0; }
  // The whole file as opened (header and data): what an embedding's hash is of.
  std::span<const std::uint8_t> bytes() const { return storage_ ? storage_->bytes() : std::span<const std::uint8_t>(); }

 private:
  struct Storage {
    virtual ~Storage() = default;
    virtual std::span<const std::uint8_t> bytes() const = 0;
    std::size_t size() const { return bytes().size(); }
  };
  struct MappedStorage;
  struct VectorStorage;
  std::shared_ptr<const Storage> storage_;
  std::string label_;
  SafetensorsHeader header_;
  std::map<std::string_view, std::size_t> index_;
  void build_index();
};

// Reads one scalar element (F64/F32/F16/BF16/integer dtypes) as double; for
// LoRA "alpha" tensors. Throws UsageError for other dtypes or empty tensors.
double safetensors_scalar(const SafetensorsTensor& t, const std::string& label);

// A1111's "addnet" hash: SHA-256 of the data section, first 12 hex digits.
std::string lora_short_hash(const SafetensorsFile& f);

}  // namespace sdxl
