#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "image/png_writer.h"

namespace fs = std::filesystem;

namespace {

fs::path temp_dir() {
  auto d = fs::temp_directory_path() / ("sdxl_png_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

std::vector<std::uint8_t> gradient(int w, int h) {
  std::vector<std::uint8_t> px(static_cast<size_t>(w * h * 3));
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<std::uint8_t>(i * 7);
  return px;
}

// The RGB pixels of an encode_png result: its IDAT chunks inflated by zlib (which checks the stream's
// Adler-32) and the PNG filters undone.
std::vector<std::uint8_t> decode_rgb(const std::vector<std::uint8_t>& png, int w, int h) {
  std::vector<std::uint8_t> idat;
  for (size_t pos = 8; pos + 12 <= png.size();) {
    const std::uint32_t len = (png[pos] << 24) | (png[pos + 1] << 16) | (png[pos + 2] << 8) | png[pos + 3];
    if (std::string(png.begin() + static_cast<long>(pos) + 4, png.begin() + static_cast<long>(pos) + 8) == "IDAT")
      idat.insert(idat.end(), png.begin() + static_cast<long>(pos) + 8, png.begin() + static_cast<long>(pos + 8 + len));
    pos += 12 + len;
  }
  std::vector<std::uint8_t> raw(static_cast<size_t>(h * (1 + w * 3)));
  uLongf raw_len = raw.size();
  EXPECT_EQ(uncompress(raw.data(), &raw_len, idat.data(), idat.size()), Z_OK);
  EXPECT_EQ(raw_len, raw.size());
  const int stride = w * 3;
  std::vector<std::uint8_t> out(static_cast<size_t>(h * stride));
  for (int y = 0; y < h; ++y) {
    const int f = raw[static_cast<size_t>(y * (stride + 1))];
    for (int x = 0; x < stride; ++x) {
      const int cur = raw[static_cast<size_t>(y * (stride + 1) + 1 + x)];
      const int a = x >= 3 ? out[static_cast<size_t>(y * stride + x - 3)] : 0;
      const int b = y > 0 ? out[static_cast<size_t>((y - 1) * stride + x)] : 0;
      const int c = (x >= 3 && y > 0) ? out[static_cast<size_t>((y - 1) * stride + x - 3)] : 0;
      int pred = 0;
      if (f == 1) pred = a;
      else if (f == 2) pred = b;
      else if (f == 3) pred = (a + b) / 2;
      else if (f == 4) {
        const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
        pred = (pa <= pb && pa <= pc) ? a : (pb <= pc ? b : c);
      }
      out[static_cast<size_t>(y * stride + x)] = static_cast<std::uint8_t>((cur + pred) & 0xff);
    }
  }
  return out;
}

}  // namespace

TEST(PngWriter, TextChunksRoundTripAsciiLatin1AndUtf8) {
  const auto dir = temp_dir();
  const auto px = gradient(16, 8);
  const std::string params =
      "a knight, (masterpiece:1.2)\nNegative prompt: blurry\nSteps: 8, Sampler: Euler, Schedule type: Automatic, "
      "CFG scale: 5, Seed: 42, Size: 16x8, Model: sdxl-tiny, Version: sdxl-batch 0.1.0";
  const sdxl::PngText text = {{"parameters", params}, {"latin1", "café crème"}, {"utf8", "一只猫在月光下 🐱"}};
  sdxl::write_png(dir / "a.png", 16, 8, 3, px.data(), text);
  EXPECT_EQ(sdxl::read_png_text(dir / "a.png"), text);
}

TEST(PngWriter, UsesTextForLatin1AndItxtOtherwise) {
  const auto px = gradient(4, 4);
  auto png = sdxl::encode_png(4, 4, 3, px.data(), {{"a", "café"}, {"b", "猫"}});
  const std::string s(png.begin(), png.end());
  EXPECT_NE(s.find("tEXta"), std::string::npos);
  EXPECT_NE(s.find(std::string("caf\xe9")), std::string::npos);  // stored as Latin-1
  EXPECT_NE(s.find("iTXtb"), std::string::npos);
}

TEST(PngWriter, PixelsDecodeBack) {
  const int w = 5, h = 3;
  const auto px = gradient(w, h);
  EXPECT_EQ(decode_rgb(sdxl::encode_png(w, h, 3, px.data(), {}), w, h), px);
}

TEST(PngWriter, ImageDeflatedInPartsDecodesBackAndIsTheSameBytesEachTime) {
  // 640x480 RGB: 922,080 filtered bytes, two parts of the parallel deflate; noisy rows so that the
  // filters and the second part's own dictionary are exercised.
  const int w = 640, h = 480;
  std::vector<std::uint8_t> px(static_cast<size_t>(w * h * 3));
  std::uint32_t r = 12345;
  for (size_t i = 0; i < px.size(); ++i) {
    r = r * 1664525u + 1013904223u;
    px[i] = static_cast<std::uint8_t>((i / 3 % 640) / 3 + (r >> 28));
  }
  const auto png = sdxl::encode_png(w, h, 3, px.data(), {{"parameters", "x"}});
  EXPECT_EQ(decode_rgb(png, w, h), px);
  EXPECT_EQ(sdxl::encode_png(w, h, 3, px.data(), {{"parameters", "x"}}), png);
  EXPECT_LT(png.size(), px.size());
}

TEST(PngWriter, ReaderRejectsCorruptFiles) {
  const auto dir = temp_dir();
  {
    std::ofstream(dir / "not.png") << "hello";
  }
  EXPECT_THROW(sdxl::read_png_text(dir / "not.png"), sdxl::IoError);
  const auto px = gradient(4, 4);
  auto png = sdxl::encode_png(4, 4, 3, px.data(), {{"parameters", "x"}});
  png[40] ^= 0x55;  // inside the tEXt chunk: CRC must catch it
  {
    std::ofstream f(dir / "bad.png", std::ios::binary);
    f.write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
  }
  try {
    sdxl::read_png_text(dir / "bad.png");
    FAIL() << "corrupt chunk not detected";
  } catch (const sdxl::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("CRC"), std::string::npos) << e.what();
  }
}
