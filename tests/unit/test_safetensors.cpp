// safetensors reader on crafted good and hostile files: every failure is a
// UsageError that names the file and, where there is one, the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "lora/safetensors.h"

namespace sdxl {
namespace {

std::vector<std::uint8_t> make_file(const std::string& header, std::size_t data_bytes, std::uint64_t claimed_len = 0,
                                    std::uint8_t fill = 0) {
  const std::uint64_t n = claimed_len ? claimed_len : header.size();
  std::vector<std::uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::uint8_t>(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data_bytes, fill);
  return out;
}

// Expects a UsageError whose message contains every needle.
void expect_error(const std::vector<std::uint8_t>& bytes, std::initializer_list<std::string> needles) {
  try {
    (void)SafetensorsFile::from_bytes(bytes, "bad.safetensors");
    FAIL() << "accepted a bad file";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("bad.safetensors"), std::string::npos) << what;
    for (const auto& n : needles) EXPECT_NE(what.find(n), std::string::npos) << "missing '" << n << "' in: " << what;
  }
}

TEST(Safetensors, ReadsAWellFormedFile) {
  const std::string h =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F16","shape":[2],"data_offsets":[16,20]},)"
      R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"s":{"dtype":"BF16","shape":[],"data_offsets":[20,22]}})";
  auto bytes = make_file(h, 22);
  const float vals[4] = {1.f, -2.f, 3.5f, 0.f};
  std::memcpy(bytes.data() + 8 + h.size(), vals, 16);
  bytes[8 + h.size() + 20] = 0x00;  // bf16 2.0 = 0x4000
  bytes[8 + h.size() + 21] = 0x40;
  const auto f = SafetensorsFile::from_bytes(bytes, "good.safetensors");
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensors()[0].name, "a");  // sorted by offset
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const auto* a = f.find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<std::int64_t>{2, 2}));
  EXPECT_EQ(a->bytes.size(), 16u);
  EXPECT_DOUBLE_EQ(safetensors_scalar(*f.find("s"), f.label()), 2.0);
  EXPECT_EQ(f.find("missing"), nullptr);
  EXPECT_EQ(lora_short_hash(f).size(), 12u);
}

TEST(Safetensors, EmptyTensorListIsValid) {
  EXPECT_NO_THROW((void)SafetensorsFile::from_bytes(make_file("{}", 0), "empty.safetensors"));
}

TEST(Safetensors, RefusesTruncatedFiles) {
  expect_error({1, 2, 3}, {"truncated"});
  const std::string h = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  expect_error(make_file(h, 8), {"'a'", "truncated"});                 // data cut short
  auto header_cut = make_file(h, 16);
  header_cut.resize(8 + h.size() / 2);                                 // header cut short
  expect_error(header_cut, {"past the end of the file"});
}

TEST(Safetensors, RefusesHugeHeaderLength) {
  expect_error(make_file("{}", 0, 200'000'000), {"100 MB"});
  expect_error(make_file("{}", 0, ~0ull), {"100 MB"});  // 2^64-1: no overflow in the bounds check
}

TEST(Safetensors, RefusesOverlappingAndGappedSpans) {
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
               {"'b'", "overlaps"});
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12),
               {"'b'", "gap"});
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8), {"trailing"});
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", 4), {"'a'", "end before"});
}

TEST(Safetensors, RefusesLyingShapes) {
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), {"'a'", "lying shape"});
  // numel overflows 64 bits: must be detected, not wrapped to the span's size.
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,16]}})", 16),
               {"'a'", "overflow"});
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), {"'a'", "shape"});
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4), {"'a'", "shape"});
}

TEST(Safetensors, RefusesUnknownDtypesAndBadEntries) {
  expect_error(make_file(R"({"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16), {"'a'", "unknown dtype 'F128'"});
  expect_error(make_file(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4), {"'a'", "dtype"});
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4), {"'a'", "data_offsets"});
  expect_error(make_file(R"({"a":[1,2]})", 0), {"'a'"});
  expect_error(make_file(R"({"__metadata__":{"k":1}})", 0), {"__metadata__"});
}

TEST(Safetensors, RefusesMalformedJsonAndDuplicates) {
  expect_error(make_file(R"({"a":{"dtype":"F32",)", 0), {"not valid JSON"});
  expect_error(make_file("[1,2,3]", 0), {"does not start with '{'"});
  expect_error(make_file("{\"\xff\xfe\":{}}", 0), {"not valid JSON"});  // invalid UTF-8
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
               {"'a'", "twice"});
}

TEST(Safetensors, ScalarNeedsANumberType) {
  const auto f = SafetensorsFile::from_bytes(make_file(R"({"b":{"dtype":"BOOL","shape":[],"data_offsets":[0,1]}})", 1), "x.safetensors");
  EXPECT_THROW((void)safetensors_scalar(*f.find("b"), f.label()), UsageError);
}

TEST(Safetensors, OpenMapsFilesAndRefusesPickles) {
  const auto dir = std::filesystem::temp_directory_path() / ("sdxl-st-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto bytes = make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  {
    std::ofstream(dir / "ok.safetensors", std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    std::ofstream(dir / "model.ckpt", std::ios::binary) << "PK";
  }
  const auto f = SafetensorsFile::open(dir / "ok.safetensors");
  EXPECT_EQ(f.tensors().size(), 1u);
  EXPECT_EQ(f.file_bytes(), bytes.size());
  try {
    (void)SafetensorsFile::open(dir / "model.ckpt");
    FAIL();
  } catch (const UsageError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("pickle"), std::string::npos);
    EXPECT_NE(w.find(".safetensors"), std::string::npos);
  }
  EXPECT_THROW((void)SafetensorsFile::open(dir / "missing.safetensors"), UsageError);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sdxl
