#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "image/png_writer.h"
#include "report/report_html.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("sdxl_report_html_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::uint8_t> base64_decode(const std::string& s) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::vector<std::uint8_t> out;
  std::uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    const int v = value(c);
    if (v < 0) break;  // padding
    acc = (acc << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<std::uint8_t>(acc >> bits));
    }
  }
  return out;
}

std::vector<std::string> data_uris(const std::string& html) {
  const std::string prefix = "src=\"data:image/png;base64,";
  std::vector<std::string> out;
  for (size_t pos = html.find(prefix); pos != std::string::npos; pos = html.find(prefix, pos)) {
    pos += prefix.size();
    const size_t end = html.find('"', pos);
    out.push_back(html.substr(pos, end - pos));
  }
  return out;
}

std::uint32_t be32(const std::vector<std::uint8_t>& b, size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) | (std::uint32_t{b[at + 2]} << 8) | b[at + 3];
}

// RGB8 pixels of a non-interlaced 8-bit RGB PNG (what encode_png writes):
// inflate the IDAT stream, undo the per-row filters.
std::vector<std::uint8_t> decode_rgb_png(const std::vector<std::uint8_t>& png, std::uint32_t& w, std::uint32_t& h) {
  w = be32(png, 16);
  h = be32(png, 20);
  std::vector<std::uint8_t> idat;
  for (size_t pos = 8; pos + 12 <= png.size();) {
    const std::uint32_t len = be32(png, pos);
    if (std::string(png.begin() + static_cast<long>(pos) + 4, png.begin() + static_cast<long>(pos) + 8) == "IDAT")
      idat.insert(idat.end(), png.begin() + static_cast<long>(pos) + 8, png.begin() + static_cast<long>(pos + 8 + len));
    pos += 12 + len;
  }
  const size_t stride = size_t{w} * 3;
  std::vector<std::uint8_t> raw(h * (stride + 1));
  uLongf raw_len = raw.size();
  if (uncompress(raw.data(), &raw_len, idat.data(), idat.size()) != Z_OK || raw_len != raw.size()) return {};
  std::vector<std::uint8_t> px(h * stride);
  for (size_t y = 0; y < h; ++y) {
    const std::uint8_t filter = raw[y * (stride + 1)];
    const std::uint8_t* in = &raw[y * (stride + 1) + 1];
    std::uint8_t* out = &px[y * stride];
    const std::uint8_t* up = y ? &px[(y - 1) * stride] : nullptr;
    for (size_t i = 0; i < stride; ++i) {
      const int a = i >= 3 ? out[i - 3] : 0, b = up ? up[i] : 0, c = (up && i >= 3) ? up[i - 3] : 0;
      int pred = 0;
      if (filter == 1) pred = a;
      if (filter == 2) pred = b;
      if (filter == 3) pred = (a + b) / 2;
      if (filter == 4) {
        const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
        pred = (pa <= pb && pa <= pc) ? a : pb <= pc ? b : c;
      }
      out[i] = static_cast<std::uint8_t>(in[i] + pred);
    }
  }
  return px;
}

void write_gradient_png(const fs::path& path, int w, int h) {
  std::vector<std::uint8_t> px(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      auto* p = &px[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = static_cast<std::uint8_t>(x * 255 / w);
      p[1] = static_cast<std::uint8_t>(y * 255 / h);
      p[2] = 128;
    }
  sdxl::write_png(path, w, h, 3, px.data(), {});
}

json image_entry(const std::string& task, int index, const std::string& file, double start_s) {
  return {{"task", task},      {"index", index},     {"seed", 1000 + index}, {"file", file},
          {"prompt", "a cat"}, {"width", 256},       {"height", 256},        {"steps", 8},
          {"cfg", 5.0},        {"start_s", start_s}, {"text_s", 0.05},       {"sample_s", 1.2},
          {"decode_s", 0.3},   {"write_s", 0.02},    {"total_s", 1.6},       {"memory_bytes", 98765432}};
}

json sample_report() {
  return {
      {"batch", "configs/example-batch.json"},
      {"model", "sdxl-tiny"},
      {"device", "cpu"},
      {"started", "2026-11-29T23:01:02Z"},
      {"images_total", 3},
      {"images_done", 2},
      {"images_failed", 1},
      {"images_skipped", 0},
      {"load_s", 1.2},
      {"run_s", 4.0},
      {"images_per_hour", 1800.0},
      {"peak_memory_bytes", 123456789},
      {"images",
       {image_entry("scene-01", 0, "scene-01-0-1000.png", 0.0),
        image_entry("scene-02", 1, "scene-02-1-1001.png", 1.6)}},
      {"failures", {{{"task", "scene-03"}, {"index", 0}, {"seed", 1203}, {"error", "unet failed: out of memory"}}}}};
}

}  // namespace

TEST(ReportHtml, Base64MatchesRfc4648Vectors) {
  auto enc = [](const std::string& s) {
    return sdxl::base64_encode({reinterpret_cast<const std::uint8_t*>(s.data()), s.size()});
  };
  EXPECT_EQ(enc(""), "");
  EXPECT_EQ(enc("f"), "Zg==");
  EXPECT_EQ(enc("fo"), "Zm8=");
  EXPECT_EQ(enc("foo"), "Zm9v");
  EXPECT_EQ(enc("foob"), "Zm9vYg==");
  EXPECT_EQ(enc("fooba"), "Zm9vYmE=");
  EXPECT_EQ(enc("foobar"), "Zm9vYmFy");
  const std::vector<std::uint8_t> high = {0xfb, 0xff, 0xbf, 0x00};
  EXPECT_EQ(sdxl::base64_encode(high), "+/+/AA==");
}

TEST(ReportHtml, EscapesUserText) {
  json r = sample_report();
  r["batch"] = "night <b>&</b>.json";
  r["images"][0]["prompt"] = "<script>alert(1)</script> a \"quoted\" knight & 'friends'";
  r["images"][1]["task"] = "<img src=x onerror=alert(2)>";
  r["failures"][0]["error"] = "bad <tensor> & \"stuff\"";
  const std::string html = sdxl::render_report_html(r, {});
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<img src=x"), std::string::npos);
  EXPECT_EQ(html.find("<b>&</b>"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt; a &quot;quoted&quot; knight &amp; &#39;friends&#39;"),
            std::string::npos);
  EXPECT_NE(html.find("&lt;img src=x onerror=alert(2)&gt;"), std::string::npos);
  EXPECT_NE(html.find("bad &lt;tensor&gt; &amp; &quot;stuff&quot;"), std::string::npos);
  EXPECT_NE(html.find("night &lt;b&gt;&amp;&lt;/b&gt;.json"), std::string::npos);
}

TEST(ReportHtml, LongPromptCaptionIsCutOnACharacterBoundary) {
  json r = sample_report();
  std::string prompt;
  for (int i = 0; i < 100; ++i) prompt += "\xc3\xa9";  // é, two bytes each
  r["images"][0]["prompt"] = prompt;
  const std::string html = sdxl::render_report_html(r, {});
  std::string caption;
  for (int i = 0; i < 80; ++i) caption += "\xc3\xa9";
  EXPECT_NE(html.find("<div class=\"prompt\">" + caption + "\u2026</div>"), std::string::npos);
  EXPECT_NE(html.find(prompt), std::string::npos);  // whole prompt in the tooltip
}

TEST(ReportHtml, EmbedsThumbnailsAsPngDataUrisAtMost192Px) {
  const auto dir = temp_dir("thumbs");
  write_gradient_png(dir / "scene-01-0-1000.png", 300, 200);
  write_gradient_png(dir / "scene-02-1-1001.png", 100, 150);  // small: kept as is
  sdxl::write_report_html(dir, sample_report());
  const std::string html = read_text(dir / "report.html");
  const auto uris = data_uris(html);
  ASSERT_EQ(uris.size(), 2u);
  const std::pair<std::uint32_t, std::uint32_t> expected[] = {{192, 128}, {100, 150}};
  for (size_t i = 0; i < uris.size(); ++i) {
    const auto png = base64_decode(uris[i]);
    ASSERT_GT(png.size(), 33u);
    const std::uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    EXPECT_TRUE(std::equal(signature, signature + 8, png.begin()));
    EXPECT_EQ(std::string(png.begin() + 12, png.begin() + 16), "IHDR");
    EXPECT_EQ(be32(png, 16), expected[i].first);
    EXPECT_EQ(be32(png, 20), expected[i].second);
    EXPECT_LE(std::max(be32(png, 16), be32(png, 20)), 192u);
  }
  EXPECT_NE(html.find("href=\"scene-01-0-1000.png\""), std::string::npos);  // click through to the full image
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  fs::remove_all(dir);
}

TEST(ReportHtml, ThumbnailIsABoxFilteredDownscale) {
  // Red for x < 201, blue after, 400x100 -> 192x48 (2.083 source px per
  // output px): pure colours away from the seam, and output column 96 (source
  // [200, 202.08)) is 1/2.083 red and 1.083/2.083 blue.
  const auto dir = temp_dir("boxfilter");
  const int w = 400, h = 100;
  std::vector<std::uint8_t> px(static_cast<size_t>(w) * h * 3, 0);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) px[(static_cast<size_t>(y) * w + x) * 3 + (x < 201 ? 0 : 2)] = 255;
  sdxl::write_png(dir / "a.png", w, h, 3, px.data(), {});
  sdxl::write_report_html(dir, json{{"images", {{{"task", "t"}, {"index", 0}, {"file", "a.png"}}}}});
  const auto uris = data_uris(read_text(dir / "report.html"));
  ASSERT_EQ(uris.size(), 1u);
  std::uint32_t tw = 0, th = 0;
  const auto thumb = decode_rgb_png(base64_decode(uris[0]), tw, th);
  ASSERT_EQ(tw, 192u);
  ASSERT_EQ(th, 48u);
  ASSERT_EQ(thumb.size(), size_t{192} * 48 * 3);
  auto at = [&](std::uint32_t x, std::uint32_t y, int c) {
    return thumb[(size_t{y} * tw + x) * 3 + static_cast<size_t>(c)];
  };
  for (std::uint32_t y : {0u, 24u, 47u}) {
    EXPECT_EQ(at(0, y, 0), 255);
    EXPECT_EQ(at(0, y, 2), 0);
    EXPECT_EQ(at(95, y, 0), 255);
    EXPECT_NEAR(at(96, y, 0), 122, 1);
    EXPECT_NEAR(at(96, y, 2), 133, 1);
    EXPECT_EQ(at(97, y, 0), 0);
    EXPECT_EQ(at(97, y, 2), 255);
    EXPECT_EQ(at(191, y, 2), 255);
    EXPECT_EQ(at(191, y, 1), 0);
  }
  fs::remove_all(dir);
}

TEST(ReportHtml, MissingOrBrokenPngGivesMissingCard) {
  const auto dir = temp_dir("missing");
  std::ofstream(dir / "scene-02-1-1001.png") << "not a png";
  json r = sample_report();
  EXPECT_NO_THROW(sdxl::write_report_html(dir, r));
  const std::string html = read_text(dir / "report.html");
  EXPECT_TRUE(data_uris(html).empty());
  size_t missing = 0;
  for (size_t pos = html.find("class=\"card missing\""); pos != std::string::npos;
       pos = html.find("class=\"card missing\"", pos + 1))
    ++missing;
  EXPECT_EQ(missing, 2u);
  EXPECT_NE(html.find("file missing"), std::string::npos);
  EXPECT_NE(html.find("scene-01-0-1000.png"), std::string::npos);
  fs::remove_all(dir);
}

TEST(ReportHtml, ListsFailuresAsCardsAndTableRows) {
  const std::string html = sdxl::render_report_html(sample_report(), {"", ""});
  EXPECT_NE(html.find("class=\"card failed\""), std::string::npos);
  EXPECT_NE(html.find("<tr><td>scene-03</td><td>0</td><td>1203</td><td class=\"err\">unet failed: out of memory</td>"),
            std::string::npos);
  EXPECT_NE(html.find("href=\"#failures\""), std::string::npos);
}

TEST(ReportHtml, HeaderTimelineAndMemoryChart) {
  const std::string html = sdxl::render_report_html(sample_report(), {});
  EXPECT_NE(html.find("sdxl-tiny"), std::string::npos);
  EXPECT_NE(html.find("2026-11-29T23:01:02Z"), std::string::npos);
  EXPECT_NE(html.find("<b>1800</b><span>images / hour</span>"), std::string::npos);
  EXPECT_NE(html.find("117.7 MiB"), std::string::npos);  // peak memory
  EXPECT_NE(html.find("aria-label=\"stage timeline\""), std::string::npos);
  EXPECT_NE(html.find("scene-01 #0 sample 1.20 s"), std::string::npos);
  EXPECT_NE(html.find("<polyline"), std::string::npos);
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
}

TEST(ReportHtml, ToleratesMissingKeysAndWrongTypes) {
  for (const json& r : {json(), json::object(), json::array(), json{{"images", "oops"}, {"failures", 3}},
                        json{{"images", {json::object(), 5, json{{"start_s", "x"}, {"task", 7}}}},
                             {"failures", {json::object()}},
                             {"run_s", "long"}}}) {
    std::string html;
    EXPECT_NO_THROW(html = sdxl::render_report_html(r, {"data:image/png;base64,AAAA"}));
    EXPECT_NE(html.find("</html>"), std::string::npos);
  }
  const auto dir = temp_dir("tolerant");
  EXPECT_NO_THROW(sdxl::write_report_html(dir, json{{"images", {json{{"file", 12}}, json{{"file", "nope.png"}}}}}));
  EXPECT_TRUE(fs::exists(dir / "report.html"));
  fs::remove_all(dir);
}
