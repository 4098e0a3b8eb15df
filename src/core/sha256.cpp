#include "core/sha256.h"

#include <array>
#include <cstring>
#include <fstream>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define SDXL_SHA256_X86 1
#endif

namespace sdxl {
namespace detail {
bool sha256_force_portable = false;
}
namespace {

constexpr std::array<std::uint32_t, 64> kK = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

inline std::uint32_t rotr(std::uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// FIPS 180-4 compression of `blocks` 64-byte blocks, in plain C++.
void compress_portable(std::array<std::uint32_t, 8>& state, const std::uint8_t* p, size_t blocks) {
  for (; blocks > 0; --blocks, p += 64) {
    std::uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = (std::uint32_t{p[i * 4]} << 24) | (std::uint32_t{p[i * 4 + 1]} << 16) | (std::uint32_t{p[i * 4 + 2]} << 8) |
             p[i * 4 + 3];
    for (int i = 16; i < 64; ++i) {
      const std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::uint32_t a = state[0], b = state[1], c = state[2], d = state[3], e = state[4], f = state[5], g = state[6],
                  h = state[7];
    for (int i = 0; i < 64; ++i) {
      const std::uint32_t t1 =
          h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kK[static_cast<size_t>(i)] + w[i];
      const std::uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    state[0] += a; state[1] += b; state[2] += c; state[3] += d;
    state[4] += e; state[5] += f; state[6] += g; state[7] += h;
  }
}

#ifdef SDXL_SHA256_X86
// The same compression with the x86 SHA extensions (SHA-NI: Intel since Ice
// Lake / Goldmont, AMD since Zen): about 8x the portable code, which matters
// for hashing LoRA files of hundreds of MiB. The state lives as two registers,
// ABEF and CDGH, as sha256rnds2 wants it; each sha256rnds2 does two rounds.
__attribute__((target("sha,sse4.1,ssse3"))) void compress_shani(std::array<std::uint32_t, 8>& state,
                                                                 const std::uint8_t* p, size_t blocks) {
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);  // big-endian words
  __m128i dcba = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&state[0]));
  __m128i hgfe = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&state[4]));
  const __m128i cdab = _mm_shuffle_epi32(dcba, 0xB1);
  const __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);
  __m128i abef = _mm_alignr_epi8(cdab, efgh, 8);
  __m128i cdgh = _mm_blend_epi16(efgh, cdab, 0xF0);
  for (; blocks > 0; --blocks, p += 64) {
    const __m128i abef_in = abef, cdgh_in = cdgh;
    __m128i w[4];  // the message schedule, four words at a time (a ring of the last four groups)
    for (int g = 0; g < 16; ++g) {
      __m128i& cur = w[g & 3];
      if (g < 4) {
        cur = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * g)), bswap);
      } else {
        // W[t] = W[t-16] + s0(W[t-15]) + W[t-7] + s1(W[t-2]), for t = 4g .. 4g+3
        const __m128i& w4 = w[g & 3];        // group g-4 (overwritten below)
        const __m128i& w3 = w[(g + 1) & 3];  // group g-3
        const __m128i& w2 = w[(g + 2) & 3];  // group g-2
        const __m128i& w1 = w[(g + 3) & 3];  // group g-1
        __m128i x = _mm_sha256msg1_epu32(w4, w3);
        x = _mm_add_epi32(x, _mm_alignr_epi8(w1, w2, 4));
        cur = _mm_sha256msg2_epu32(x, w1);
      }
      __m128i msg = _mm_add_epi32(cur, _mm_loadu_si128(reinterpret_cast<const __m128i*>(&kK[static_cast<size_t>(4 * g)])));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, msg);  // rounds 4g, 4g+1: the new ABEF lands in cdgh
      msg = _mm_shuffle_epi32(msg, 0x0E);
      abef = _mm_sha256rnds2_epu32(abef, cdgh, msg);  // rounds 4g+2, 4g+3: back in place
    }
    abef = _mm_add_epi32(abef, abef_in);
    cdgh = _mm_add_epi32(cdgh, cdgh_in);
  }
  const __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
  const __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
  dcba = _mm_blend_epi16(feba, dchg, 0xF0);
  hgfe = _mm_alignr_epi8(dchg, feba, 8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&state[0]), dcba);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&state[4]), hgfe);
}

bool cpu_has_sha() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool sha = (b >> 29) & 1u;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool sse41 = (c >> 19) & 1u, ssse3 = (c >> 9) & 1u;
  return sha && sse41 && ssse3;
}
#endif

bool use_hardware() {
#ifdef SDXL_SHA256_X86
  static const bool has = cpu_has_sha();
  return has && !detail::sha256_force_portable;
#else
  return false;
#endif
}

class Sha256 {
 public:
  void update(const std::uint8_t* p, size_t n) {
    total_ += n;
    if (fill_ > 0) {  // finish the partial block first
      const size_t take = std::min(n, size_t{64} - fill_);
      std::memcpy(block_.data() + fill_, p, take);
      fill_ += take;
      p += take;
      n -= take;
      if (fill_ < 64) return;
      compress(block_.data(), 1);
      fill_ = 0;
    }
    if (n >= 64) {  // whole blocks straight from the input
      compress(p, n / 64);
      p += n / 64 * 64;
      n %= 64;
    }
    std::memcpy(block_.data(), p, n);
    fill_ = n;
  }
  std::string hex() {
    const std::uint64_t bits = total_ * 8;
    const std::uint8_t pad = 0x80;
    update(&pad, 1);
    const std::uint8_t zero = 0;
    while (fill_ != 56) update(&zero, 1);
    for (int i = 7; i >= 0; --i) {
      const auto b = static_cast<std::uint8_t>(bits >> (i * 8));
      update(&b, 1);
    }
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (std::uint32_t v : h_)
      for (int i = 28; i >= 0; i -= 4) out.push_back(digits[(v >> i) & 0xf]);
    return out;
  }

 private:
  void compress(const std::uint8_t* p, size_t blocks) {
#ifdef SDXL_SHA256_X86
    if (use_hardware()) return compress_shani(h_, p, blocks);
#endif
    compress_portable(h_, p, blocks);
  }

  std::array<std::uint32_t, 8> h_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<std::uint8_t, 64> block_{};
  size_t fill_ = 0;
  std::uint64_t total_ = 0;
};

}  // namespace

bool sha256_hardware() { return use_hardware(); }

std::string sha256_hex(std::span<const std::uint8_t> data) {
  Sha256 s;
  s.update(data.data(), data.size());
  return s.hex();
}

std::optional<std::string> sha256_file_hex(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  Sha256 s;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = in.gcount();
    if (n > 0) s.update(reinterpret_cast<const std::uint8_t*>(buf.data()), static_cast<size_t>(n));
  }
  if (in.bad()) return std::nullopt;
  return s.hex();
}

}  // namespace sdxl
