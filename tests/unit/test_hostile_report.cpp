// Hostile output folders for the report reader (issue 56): `sdxl-batch report DIR` and the last shard of an
// array merge every run report and manifest of a shared folder, where anyone with write access may plant a
// report, a manifest line, a link, a FIFO or a PNG bomb. Each test names the rule it checks.
// tests/e2e/test_hostile.py runs the same cases through the real binary.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "image/png_writer.h"
#include "report/report_html.h"
#include "scheduler/night_report.h"

#include "test_support.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using sdxl::testing::error_of;
using sdxl::testing::slurp;
using sdxl::testing::spit;
using sdxl::testing::TempDir;

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

size_t thumbnails_in(const fs::path& html) { return count_of(slurp(html), "src=\"data:image/png;base64,"); }

void write_png(const fs::path& path, int w = 64, int h = 48) {
  std::vector<std::uint8_t> px(static_cast<size_t>(w) * h * 3, 200);
  sdxl::write_png(path, w, h, 3, px.data(), {});
}

json image(const std::string& task, const std::string& file, double start_s = 0.5) {
  return {{"task", task}, {"index", 0}, {"seed", 7}, {"file", file}, {"prompt", "a cat"}, {"width", 64},
          {"height", 48}, {"start_s", start_s}, {"sample_s", 1.0}, {"total_s", 1.5}};
}

// A shard run's report as a run writes it (the keys the merge reads).
json shard_report(int index, int count, const std::string& started, json images, double run_s = 10) {
  return {{"batch", "/b/night.json"}, {"model", "sdxl-tiny"}, {"started", started}, {"host", "h1"},
          {"shard", {{"index", index}, {"count", count}}}, {"images_total", images.size()},
          {"images_done", images.size()}, {"images_skipped", 0}, {"images_failed", 0}, {"run_s", run_s},
          {"images", images}, {"failures", json::array()}, {"devices", json::array()}};
}

std::string shard_name(int index, int count) {
  return "report-shard-" + std::to_string(index) + "-of-" + std::to_string(count) + ".json";
}

std::string manifest_line(const std::string& task, const std::string& file, const std::string& finished,
                          double seconds) {
  return json{{"task", task}, {"index", 0}, {"seed", 9}, {"file", file}, {"sha256", "00"}, {"seconds", seconds},
              {"finished", finished},
              {"params", {{"prompt", "a dog"}, {"width", 64}, {"height", 48}, {"steps", 4}, {"cfg", 5.0}}}}
             .dump() +
         "\n";
}

fs::path merge_and_write(const fs::path& dir) { return sdxl::write_night_report(dir, sdxl::merge_run_reports(dir)); }

// A grey PNG of w x h pixels, all zero, written with a real zlib stream (a decompression bomb: a small file
// that decodes to w * h * 3 bytes of RGB).
void write_png_bomb(const fs::path& path, std::uint32_t w, std::uint32_t h) {
  std::vector<std::uint8_t> z;
  z_stream zs{};
  deflateInit(&zs, Z_BEST_COMPRESSION);
  const std::vector<std::uint8_t> row(size_t{w} + 1, 0);  // filter byte + grey samples
  std::vector<std::uint8_t> buf(1 << 16);
  for (std::uint32_t y = 0; y <= h; ++y) {
    zs.next_in = const_cast<std::uint8_t*>(row.data());
    zs.avail_in = y < h ? static_cast<uInt>(row.size()) : 0;
    do {
      zs.next_out = buf.data();
      zs.avail_out = static_cast<uInt>(buf.size());
      deflate(&zs, y < h ? Z_NO_FLUSH : Z_FINISH);
      z.insert(z.end(), buf.data(), buf.data() + (buf.size() - zs.avail_out));
    } while (zs.avail_out == 0);
  }
  deflateEnd(&zs);
  auto be32 = [](std::string& s, std::uint32_t v) {
    for (int k = 3; k >= 0; --k) s.push_back(static_cast<char>((v >> (8 * k)) & 255));
  };
  auto chunk = [&](std::string& out, const std::string& type, const std::string& data) {
    be32(out, static_cast<std::uint32_t>(data.size()));
    const std::string body = type + data;
    out += body;
    be32(out, static_cast<std::uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(body.data()),
                                               static_cast<uInt>(body.size()))));
  };
  std::string png = "\x89PNG\r\n\x1a\n", ihdr;
  be32(ihdr, w);
  be32(ihdr, h);
  ihdr += std::string("\x08\x00\x00\x00\x00", 5);  // 8-bit grey, deflate, no filter method, no interlace
  chunk(png, "IHDR", ihdr);
  chunk(png, "IDAT", std::string(z.begin(), z.end()));
  chunk(png, "IEND", "");
  spit(path, png);
}

}  // namespace

// Rule (issue 56, High 2): thumbnails come only from regular files that resolve inside the folder. A report or
// manifest line naming an absolute path, "../x.png" or a link out of the folder, or a listed PNG replaced by
// such a link, gets a "missing" card, not the private image.
TEST(HostileReport, ThumbnailsComeOnlyFromFilesInsideTheFolder) {
  TempDir d("report-confined");
  const fs::path out = d.root / "out", secret = d.root / "secret.png";
  fs::create_directories(out);
  write_png(secret);
  write_png(out / "own.png");
  fs::create_symlink(secret, out / "link.png");
  fs::create_symlink(d.root, out / "up");
  write_png(out / "replaced.png");
  spit(out / shard_name(0, 2),
       shard_report(0, 2, "2026-12-04T18:00:00Z",
                    {image("a", "own.png"), image("b", secret.string()), image("c", "../secret.png"),
                     image("d", "link.png"), image("e", "up/secret.png"), image("f", "replaced.png")})
           .dump());
  spit(out / shard_name(1, 2), shard_report(1, 2, "2026-12-04T18:00:01Z", json::array()).dump());
  spit(out / "manifest-shard-1-of-2.jsonl",
       manifest_line("g", (d.root / "." / "secret.png").string(), "2026-12-04T18:00:05Z", 1) +
           manifest_line("h", "../out/../secret.png", "2026-12-04T18:00:06Z", 1));
  fs::remove(out / "replaced.png");
  fs::create_symlink(secret, out / "replaced.png");
  merge_and_write(out);
  EXPECT_EQ(thumbnails_in(out / "report.html"), 1u);  // own.png alone
  EXPECT_EQ(count_of(slurp(out / "report.html"), "class=\"card missing\""), 7u);
}

// Rule (High 2): a listed image is decoded within the input image's pixel limit (image/png_reader.h); a PNG
// bomb over it is refused from its header, not decoded. And a FIFO listed as an image does not block.
TEST(HostileReport, PngBombsAndFifosGetNoThumbnail) {
  TempDir d("report-bomb");
  write_png_bomb(d.root / "bomb.png", 16385, 16384);  // 268 MiB of grey: 805 MiB as RGB
  ASSERT_EQ(::mkfifo((d.root / "fifo.png").c_str(), 0600), 0);
  write_png(d.root / "ok.png");
  const json report = {{"images", {image("a", "bomb.png"), image("b", "fifo.png"), image("c", "ok.png")}}};
  sdxl::write_report_html(d.root, report);
  EXPECT_EQ(thumbnails_in(d.root / "report.html"), 1u);
}

// Rule (M2): a run started years before the others (an old run, a wrong clock), "started" in 1970, a run_s
// of 1e300 or an image's start_s of 1e15 neither hang the report nor make its page large: the time axis
// draws a bounded number of ticks and leaves such runs and images off it.
TEST(HostileReport, AbsurdTimesDoNotStretchTheTimeAxis) {
  TempDir d("report-times");
  write_png(d.root / "a.png");
  json far = image("c", "c.png", 1e15);
  spit(d.root / shard_name(0, 4), shard_report(0, 4, "2026-12-04T18:00:00Z", {image("a", "a.png")}).dump());
  spit(d.root / shard_name(1, 4), shard_report(1, 4, "2020-12-04T18:00:00Z", {image("b", "b.png")}).dump());
  spit(d.root / shard_name(2, 4), shard_report(2, 4, "2026-12-04T18:00:02Z", {far}, 1e300).dump());
  spit(d.root / shard_name(3, 4), shard_report(3, 4, "1970-01-01T00:00:00Z", json::array()).dump());
  const json merged = sdxl::merge_run_reports(d.root);
  EXPECT_LT(merged["run_s"].get<double>(), 100.0) << merged["run_s"];
  EXPECT_TRUE(merged["runs"][1]["start_s"].is_null()) << merged["runs"][1];  // 6 years before: off the axis
  EXPECT_DOUBLE_EQ(merged["runs"][2]["start_s"].get<double>(), 2.0);
  for (const json& e : merged["images"]) {
    if (e["task"] != "a") {
      EXPECT_FALSE(e.contains("start_s")) << e;
    }
  }
  sdxl::write_night_report(d.root, merged);
  EXPECT_LT(fs::file_size(d.root / "report.html"), 200u * 1024);
  // The page alone, given the raw numbers.
  const json raw = {{"run_s", 1e300}, {"images", {image("x", "x.png", 1e15), image("y", "y.png", 2e8)}}};
  EXPECT_LT(sdxl::render_report_html(raw, {}).size(), 200u * 1024);
}

// Rule (M3): a run report nested deeper than the batch parser allows (core/json_shape.h) is refused with
// an IoError naming it, before anything walks it (200,000 levels crashed the report with SIGSEGV).
TEST(HostileReport, DeeplyNestedReportIsRefusedNotWalked) {
  TempDir d("report-deep");
  const std::string deep = "{\"batch\": \"/b/night.json\", \"images\": [" + std::string(200000, '[') +
                           std::string(200000, ']') + "]}";
  spit(d.root / shard_name(0, 2), deep);
  const std::string why = error_of([&] { sdxl::merge_run_reports(d.root); });
  EXPECT_NE(why.find(shard_name(0, 2)), std::string::npos) << why;
  EXPECT_NE(why.find("nested deeper than 64 levels"), std::string::npos) << why;
  EXPECT_THROW(sdxl::merge_run_reports(d.root), sdxl::IoError);
}

// Rule (M4): the report reader opens only regular files: a FIFO named like a manifest, a seeds file or a run
// report is refused at once (as `run` refuses them), not waited on.
TEST(HostileReport, FifosNamedLikeTheFolderFilesAreRefusedWithoutBlocking) {
  for (const std::string& name : std::vector<std::string>{"manifest-shard-1-of-2.jsonl", "seeds.jsonl", shard_name(1, 2)}) {
    TempDir d("report-fifo");
    spit(d.root / shard_name(0, 2), shard_report(0, 2, "2026-12-04T18:00:00Z", json::array()).dump());
    ASSERT_EQ(::mkfifo((d.root / name).c_str(), 0600), 0);
    const std::string why = error_of([&] { sdxl::merge_run_reports(d.root); });
    EXPECT_NE(why.find(name), std::string::npos) << why;
    EXPECT_NE(why.find("not a regular file"), std::string::npos) << why;
  }
}

// Rule (Low): a report with a key of the wrong type is left out of the merge with a message naming the file
// and the key (a JSON pointer), not an "unexpected error"; the other reports, and the manifests' images, are
// merged.
TEST(HostileReport, WrongTypedReportsAreLeftOutByName) {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"images", 5}}, "/images is a number, not an array"},
      {{{"images", {1}}}, "/images/0 is a number, not an object"},
      {{{"failures", {"x"}}}, "/failures/0 is a string, not an object"},
      {{{"images", {{{"file", 3}}}}}, "/images/0/file is a number, not a string"},
      {{{"shard", {{"index", 1}, {"count", 1e300}}}}, "/shard is"},
      {{{"images_total", -3}}, "/images_total is -3, not a count"},
      {{{"run_s", "long"}}, "/run_s is \"long\", not a number >= 0"},
      {{{"started", 12}}, "/started is a number, not a string"}};
  for (const auto& [bad, expected] : cases) {
    TempDir d("report-types");
    spit(d.root / shard_name(0, 2), shard_report(0, 2, "2026-12-04T18:00:00Z", {image("a", "a.png")}).dump());
    json r = shard_report(1, 2, "2026-12-04T18:00:00Z", json::array());
    r.update(bad);
    spit(d.root / shard_name(1, 2), r.dump());
    json merged;
    ASSERT_NO_THROW(merged = sdxl::merge_run_reports(d.root)) << bad;
    EXPECT_EQ(merged["runs"].size(), 1u) << bad;
    ASSERT_EQ(merged["merged"]["left_out"].size(), 1u) << merged["merged"];
    EXPECT_EQ(merged["merged"]["left_out"][0]["report"], shard_name(1, 2));
    EXPECT_NE(merged["merged"]["left_out"][0]["why"].get<std::string>().find(expected), std::string::npos)
        << merged["merged"]["left_out"][0]["why"] << " / " << expected;
  }
  TempDir d("report-types-all");
  spit(d.root / shard_name(0, 2), json{{"images", "x"}}.dump());
  const std::string why = error_of([&] { sdxl::merge_run_reports(d.root); });
  EXPECT_NE(why.find(shard_name(0, 2) + ": /images is a string"), std::string::npos) << why;
}

// Rule (Low, the requeued array of bench/results/2026-12-04-slurm-merged-report.png): an image that only a
// manifest lists (its run's report was replaced by the shard's next run) gets its thumbnail, its settings
// and its time from the manifest line.
TEST(HostileReport, ImagesOfAReplacedRunKeepTheirThumbnailAndTime) {
  TempDir d("report-requeue");
  for (const char* f : {"a.png", "b.png", "c.png"}) write_png(d.root / f);
  spit(d.root / shard_name(0, 2), shard_report(0, 2, "2026-12-04T18:00:00Z", {image("a", "a.png")}).dump());
  spit(d.root / shard_name(1, 2), shard_report(1, 2, "2026-12-04T18:00:20Z", {image("c", "c.png")}).dump());
  spit(d.root / "manifest-shard-0-of-2.jsonl", manifest_line("a", "a.png", "2026-12-04T18:00:02Z", 1.5));
  spit(d.root / "manifest-shard-1-of-2.jsonl", manifest_line("b", "b.png", "2026-12-04T18:00:09Z", 4) +
                                                   manifest_line("c", "c.png", "2026-12-04T18:00:22Z", 1.5));
  const json merged = sdxl::merge_run_reports(d.root);
  ASSERT_EQ(merged["images"].size(), 3u);
  const json& b = merged["images"][2];
  EXPECT_EQ(b["task"], "b");
  EXPECT_DOUBLE_EQ(b["start_s"].get<double>(), 5.0);  // finished 9 s after the night's start, after 4 s
  EXPECT_DOUBLE_EQ(b["total_s"].get<double>(), 4.0);
  EXPECT_EQ(b["width"], 64);
  EXPECT_EQ(b["prompt"], "a dog");
  sdxl::write_night_report(d.root, merged);
  const std::string html = slurp(d.root / "report.html");
  EXPECT_EQ(thumbnails_in(d.root / "report.html"), 3u);
  EXPECT_NE(html.find("b #0 total 4.00 s"), std::string::npos);  // a bar on the timeline
}

// Rule (Low, cheap thumbnails): an image no larger than a thumbnail is shown as it is, without being encoded
// again: its critical chunks only, so its text chunks (the PNG's parameters) do not reach the page.
TEST(HostileReport, SmallImagesAreShownAsTheyAreWithoutTheirTextChunks) {
  TempDir d("report-small");
  std::vector<std::uint8_t> px(size_t{40} * 30 * 3, 90);
  sdxl::write_png(d.root / "small.png", 40, 30, 3, px.data(), {{"parameters", "a private prompt"}});
  const std::string file = slurp(d.root / "small.png");
  ASSERT_NE(file.find("tEXt"), std::string::npos);
  sdxl::write_report_html(d.root, json{{"images", {image("a", "small.png")}}});
  const std::string html = slurp(d.root / "report.html");
  const size_t at = html.find("src=\"data:image/png;base64,");
  ASSERT_NE(at, std::string::npos);
  const size_t begin = at + std::string("src=\"data:image/png;base64,").size();
  const std::string uri = html.substr(begin, html.find('"', begin) - begin);
  // The file without its tEXt chunk (12 bytes of frame + keyword, NUL and text), base64-encoded.
  const size_t text_at = file.find("tEXt") - 4;
  const size_t text_len = 12 + std::string("parameters").size() + 1 + std::string("a private prompt").size();
  std::string expected = file;
  expected.erase(text_at, text_len);
  EXPECT_EQ(uri, sdxl::base64_encode({reinterpret_cast<const std::uint8_t*>(expected.data()), expected.size()}));
  EXPECT_EQ(html.find("a private prompt"), std::string::npos);
}
