// SHA-256: FIPS 180-4 / NIST example vectors, and the CPU's SHA-extension path
// against the portable code on every length around the block boundaries and
// on input fed in odd pieces (the file path reads in chunks).
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <unistd.h>
#include <string>
#include <vector>

#include "core/sha256.h"

namespace {

std::string hex_of(const std::string& s) {
  return sdxl::sha256_hex({reinterpret_cast<const std::uint8_t*>(s.data()), s.size()});
}

struct ForcePortable {
  explicit ForcePortable(bool on) { sdxl::detail::sha256_force_portable = on; }
  ~ForcePortable() { sdxl::detail::sha256_force_portable = false; }
};

}  // namespace

TEST(Sha256, KnownVectorsOnBothPaths) {
  for (bool portable : {false, true}) {
    SCOPED_TRACE(portable ? "portable" : (sdxl::sha256_hardware() ? "SHA extensions" : "portable (no SHA extensions)"));
    ForcePortable force(portable);
    EXPECT_EQ(hex_of(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(hex_of("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(hex_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    EXPECT_EQ(hex_of("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrst"
                     "nopqrstu"),
              "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    EXPECT_EQ(hex_of(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  }
}

TEST(Sha256, HardwarePathMatchesPortableOnEveryLength) {
  if (!sdxl::sha256_hardware()) GTEST_SKIP() << "this CPU has no SHA extensions; the portable path is the only one";
  std::mt19937 rng(7);
  std::vector<std::uint8_t> data(4096 + 64);
  for (auto& b : data) b = static_cast<std::uint8_t>(rng());
  for (size_t n = 0; n < data.size(); n += (n < 300 ? 1 : 61)) {
    const std::span<const std::uint8_t> in(data.data(), n);
    const std::string hw = sdxl::sha256_hex(in);
    ForcePortable force(true);
    ASSERT_EQ(hw, sdxl::sha256_hex(in)) << "length " << n;
  }
}

TEST(Sha256, FileInChunksMatchesBytes) {
  const auto path = std::filesystem::temp_directory_path() / ("sdxl_sha256_" + std::to_string(::getpid()) + ".bin");
  std::mt19937 rng(11);
  std::string bytes(3 * 65536 + 123, '\0');  // more than one read buffer, not a whole number of blocks
  for (auto& c : bytes) c = static_cast<char>(rng());
  { std::ofstream(path, std::ios::binary) << bytes; }
  const auto from_file = sdxl::sha256_file_hex(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(from_file.has_value());
  EXPECT_EQ(*from_file, hex_of(bytes));
  ForcePortable force(true);
  EXPECT_EQ(*from_file, hex_of(bytes));
  EXPECT_FALSE(sdxl::sha256_file_hex(path).has_value());  // gone: nullopt, not a hash of nothing
}
