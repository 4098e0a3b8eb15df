#include "image/png_writer.h"

#include <zlib.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/input_text.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/parallel.h"

namespace sdxl {
unsigned char* deflate_for_stb(unsigned char* data, int data_len, int* out_len, int quality);
}

// stb_image_write is header-only; its implementation lives in this file alone. It writes the PNG
// (rows filtered with the filter it finds best) and hands the zlib stream to deflate_for_stb.
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STBI_WRITE_NO_STDIO
#define STBIW_ZLIB_COMPRESS sdxl::deflate_for_stb
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wunused-function"
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

namespace sdxl {
namespace {

constexpr std::uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

void put_u32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(v >> s));
}

std::uint32_t get_u32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

std::vector<std::uint8_t> make_chunk(const char type[4], const std::string& body) {
  std::vector<std::uint8_t> c;
  c.reserve(12 + body.size());
  put_u32(c, static_cast<std::uint32_t>(body.size()));
  c.insert(c.end(), type, type + 4);
  c.insert(c.end(), body.begin(), body.end());
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, c.data() + 4, static_cast<uInt>(4 + body.size()));
  put_u32(c, static_cast<std::uint32_t>(crc));
  return c;
}

// UTF-8 -> Latin-1 when every code point is below 256; false otherwise.
bool utf8_to_latin1(const std::string& in, std::string& out) {
  out.clear();
  for (size_t i = 0; i < in.size(); ++i) {
    auto c = static_cast<unsigned char>(in[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if ((c & 0xE0) == 0xC0 && i + 1 < in.size()) {
      unsigned cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(in[i + 1]) & 0x3Fu);
      if (cp >= 0x100) return false;
      out.push_back(static_cast<char>(cp));
      ++i;
    } else {
      return false;
    }
  }
  return true;
}

std::string latin1_to_utf8(const std::string& in) {
  std::string out;
  for (unsigned char c : in) {
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

// The output rule of core/input_text.h: a text chunk never carries a raw
// control character (a NUL would end it early; a line break is the text's own,
// as PNG allows) or a byte that is not UTF-8, whatever the caller passed.
std::vector<std::uint8_t> text_chunk(const std::string& raw_key, const std::string& raw_text) {
  const std::string key = clean_metadata_text(raw_key, false);
  const std::string text = clean_metadata_text(raw_text, true);
  std::string latin1;
  if (utf8_to_latin1(text, latin1)) return make_chunk("tEXt", key + std::string(1, '\0') + latin1);
  // iTXt: keyword \0, compression flag 0, method 0, empty language tag \0, empty translated keyword \0, text.
  std::string body = key;
  body.push_back('\0');
  body.push_back('\0');
  body.push_back('\0');
  body.push_back('\0');
  body.push_back('\0');
  body += text;
  return make_chunk("iTXt", body);
}

void collect(void* ctx, void* data, int size) {
  auto* out = static_cast<std::vector<std::uint8_t>*>(ctx);
  auto* bytes = static_cast<std::uint8_t*>(data);
  out->insert(out->end(), bytes, bytes + size);
}

// The image data is deflated in parts of kPartBytes bytes, each part on its own (raw deflate ending on
// a sync flush, the last one on a finish), and the parts concatenated into one zlib stream with the
// Adler-32 of the whole (pigz's way). The parts are fixed by the data, not by the threads, so the bytes
// are the same on any machine.
constexpr size_t kPartBytes = size_t{1} << 19;
constexpr int kDeflateLevel = 6;  // zlib's default, PIL's too

struct DeflatedPart {
  std::vector<std::uint8_t> bytes;
  uLong adler = 0, raw_bytes = 0;
  bool ok = false;
};

DeflatedPart deflate_part(const std::uint8_t* data, size_t n, bool last) {
  DeflatedPart part;
  part.raw_bytes = n;
  part.adler = adler32(adler32(0L, Z_NULL, 0), data, static_cast<uInt>(n));
  z_stream z{};
  if (deflateInit2(&z, kDeflateLevel, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK) return part;
  part.bytes.resize(deflateBound(&z, n) + 16);
  z.next_in = const_cast<std::uint8_t*>(data);
  z.avail_in = static_cast<uInt>(n);
  z.next_out = part.bytes.data();
  z.avail_out = static_cast<uInt>(part.bytes.size());
  const int rc = deflate(&z, last ? Z_FINISH : Z_SYNC_FLUSH);
  part.ok = last ? rc == Z_STREAM_END : (rc == Z_OK && z.avail_in == 0);
  part.bytes.resize(part.bytes.size() - z.avail_out);
  deflateEnd(&z);
  return part;
}

}  // namespace

// stb_image_write's compressor hook: a zlib stream of data, malloc'ed (stb frees it); null on failure.
unsigned char* deflate_for_stb(unsigned char* data, int data_len, int* out_len, int /*quality*/) {
  const size_t n = static_cast<size_t>(data_len);
  std::vector<DeflatedPart> parts(std::max<size_t>(1, (n + kPartBytes - 1) / kPartBytes));
  parallel_ranges(parts.size(), 20.0 * static_cast<double>(n), [&](size_t p0, size_t p1) {
    for (size_t p = p0; p < p1; ++p) {
      const size_t at = p * kPartBytes;
      parts[p] = deflate_part(data + at, std::min(kPartBytes, n - at), p + 1 == parts.size());
    }
  });
  std::vector<std::uint8_t> z = {0x78, 0x9C};  // deflate, 32 KiB window, default level
  uLong adler = adler32(0L, Z_NULL, 0);
  for (const DeflatedPart& p : parts) {
    if (!p.ok) return nullptr;  // stb reports the failure
    z.insert(z.end(), p.bytes.begin(), p.bytes.end());
    adler = adler32_combine(adler, p.adler, static_cast<z_off_t>(p.raw_bytes));
  }
  put_u32(z, static_cast<std::uint32_t>(adler));
  auto* out = static_cast<unsigned char*>(std::malloc(z.size()));
  if (out == nullptr) return nullptr;
  std::memcpy(out, z.data(), z.size());
  *out_len = static_cast<int>(z.size());
  return out;
}

std::vector<std::uint8_t> encode_png(int width, int height, int channels, const std::uint8_t* pixels,
                                     const PngText& text) {
  std::vector<std::uint8_t> png;
  if (!stbi_write_png_to_func(collect, &png, width, height, channels, pixels, width * channels))
    throw IoError("PNG encoding failed (" + std::to_string(width) + "x" + std::to_string(height) + ")");
  // stb writes signature + IHDR first; text chunks go right after IHDR (25 bytes).
  constexpr size_t kAfterIhdr = 8 + 8 + 13 + 4;
  std::vector<std::uint8_t> chunks;
  for (const auto& [key, value] : text) {
    auto c = text_chunk(key, value);
    chunks.insert(chunks.end(), c.begin(), c.end());
  }
  png.insert(png.begin() + kAfterIhdr, chunks.begin(), chunks.end());
  return png;
}

void write_png(const std::filesystem::path& path, int width, int height, int channels, const std::uint8_t* pixels,
               const PngText& text) {
  write_file_atomic(path, encode_png(width, height, channels, pixels, text));
}

PngText read_png_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open PNG '" + path.string() + "'");
  std::vector<std::uint8_t> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (b.size() < 8 || std::memcmp(b.data(), kSignature, 8) != 0)
    throw IoError("'" + path.string() + "' is not a PNG file (bad signature)");
  PngText out;
  size_t pos = 8;
  while (pos + 12 <= b.size()) {
    const std::uint32_t len = get_u32(&b[pos]);
    if (len > b.size() - pos - 12) throw IoError("PNG '" + path.string() + "': truncated chunk at byte " + std::to_string(pos));
    const std::string type(reinterpret_cast<const char*>(&b[pos + 4]), 4);
    const std::uint8_t* body = &b[pos + 8];
    uLong crc = crc32(crc32(0L, Z_NULL, 0), &b[pos + 4], len + 4);
    if (static_cast<std::uint32_t>(crc) != get_u32(body + len))
      throw IoError("PNG '" + path.string() + "': CRC mismatch in " + type + " chunk at byte " + std::to_string(pos));
    const std::string data(reinterpret_cast<const char*>(body), len);
    const size_t nul = data.find('\0');
    if (type == "tEXt" && nul != std::string::npos) {
      out.emplace_back(data.substr(0, nul), latin1_to_utf8(data.substr(nul + 1)));
    } else if (type == "iTXt" && nul != std::string::npos && nul + 2 < data.size() && data[nul + 1] == '\0') {
      // skip compression flag/method, language tag and translated keyword
      size_t p = nul + 3;
      size_t lang_end = data.find('\0', p);
      size_t tk_end = lang_end == std::string::npos ? lang_end : data.find('\0', lang_end + 1);
      if (tk_end != std::string::npos) out.emplace_back(data.substr(0, nul), data.substr(tk_end + 1));
    }
    if (type == "IEND") break;
    pos += 12 + len;
  }
  return out;
}

}  // namespace sdxl
