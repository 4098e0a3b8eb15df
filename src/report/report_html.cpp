#include "report/report_html.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <exception>
#include <functional>
#include <string_view>
#include <utility>

#include "core/atomic_stream.h"
#include "core/input_file.h"
#include "core/parallel.h"
#include "image/png_reader.h"
#include "image/png_writer.h"

namespace sdxl {
namespace {

using nlohmann::json;

// ---------------------------------------------------------------- report access
// report.json is written by another part of the program and may be older or
// newer than this code: every read has a default and none throws.

const json& field(const json& j, const char* key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

// A finite number, else `fallback` (a report may hold 1e400, read as infinity).
double num(const json& j, const char* key, double fallback = 0.0) {
  const json& v = field(j, key);
  return v.is_number() && std::isfinite(v.get<double>()) ? v.get<double>() : fallback;
}

bool has_num(const json& j, const char* key) {
  const json& v = field(j, key);
  return v.is_number() && std::isfinite(v.get<double>());
}

// Strings as they are, numbers and booleans as JSON writes them, else "".
std::string text(const json& j, const char* key) {
  const json& v = field(j, key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number() || v.is_boolean()) return v.dump();
  return {};
}

const json& array_field(const json& j, const char* key) {
  static const json kEmpty = json::array();
  const json& v = field(j, key);
  return v.is_array() ? v : kEmpty;
}

// ---------------------------------------------------------------- formatting

// Runs without a special character are appended whole: a thumbnail's data: URI is tens of KiB of them.
std::string escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 16);
  size_t at = 0;
  while (at < s.size()) {
    size_t special = at;
    while (special < s.size() && s[special] != '&' && s[special] != '<' && s[special] != '>' && s[special] != '"' &&
           s[special] != '\'')
      ++special;
    out.append(s.substr(at, special - at));
    if (special == s.size()) break;
    switch (s[special]) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += "&#39;";
    }
    at = special + 1;
  }
  return out;
}

// For href: keep unreserved characters and '/', percent-encode the rest, so a
// file name cannot leave the attribute or become a scheme ("javascript:").
std::string url_path(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += ch;
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// First max_chars code points of UTF-8 text, with an ellipsis if cut.
std::string truncate_utf8(const std::string& s, size_t max_chars) {
  size_t chars = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) continue;  // continuation byte
    if (chars++ == max_chars) return s.substr(0, i) + "\u2026";
  }
  return s;
}

// printf into a std::string of the right size (numbers in the report are
// unbounded, so no fixed buffer); the attribute keeps the format checks.
__attribute__((format(printf, 1, 2))) std::string fmt(const char* format, ...) {
  std::va_list args, args2;
  va_start(args, format);
  va_copy(args2, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string out(n > 0 ? static_cast<size_t>(n) + 1 : 1, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size(), format, args2);
  va_end(args2);
  out.pop_back();
  return out;
}

std::string format_bytes(double bytes) {
  if (bytes >= 1024.0 * 1024 * 1024) return fmt("%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  if (bytes >= 1024.0 * 1024) return fmt("%.1f MiB", bytes / (1024.0 * 1024));
  if (bytes >= 1024.0) return fmt("%.1f KiB", bytes / 1024.0);
  return fmt("%.0f B", bytes);
}

std::string format_duration(double s) {
  if (!(s >= 0)) s = 0;
  s = std::min(s, 1e15);  // llround of a larger number is undefined; no run lasts 30 million years
  if (s < 60) return fmt("%.1f s", s);
  const auto total = static_cast<long long>(std::llround(s));
  if (total < 3600) return fmt("%lld min %02lld s", total / 60, total % 60);
  return fmt("%lld h %02lld min", total / 3600, (total % 3600) / 60);
}

// 1, 2 or 5 times a power of ten, at least x.
double nice_step(double x) {
  if (!(x > 0)) return 1;
  const double mag = std::pow(10.0, std::floor(std::log10(x)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= x) return m * mag;
  return 10 * mag;
}

std::string format_tick_s(double t, double step) {
  if (step >= 3600) return fmt("%g h", t / 3600);
  if (step >= 60) return fmt("%g min", t / 60);
  return fmt("%g s", t);
}

// Natural order ("scene-2" before "scene-10") so the sheet follows the batch.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const bool da = std::isdigit(static_cast<unsigned char>(a[i])) != 0;
    const bool db = std::isdigit(static_cast<unsigned char>(b[j])) != 0;
    if (da && db) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      std::string_view na(a.data() + i, ie - i), nb(b.data() + j, je - j);
      while (na.size() > 1 && na.front() == '0') na.remove_prefix(1);
      while (nb.size() > 1 && nb.front() == '0') nb.remove_prefix(1);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

// ---------------------------------------------------------------- page parts

struct Stage {
  const char* key;
  const char* name;
  const char* colour;
};
constexpr Stage kStages[] = {{"text_s", "text", "#a78bfa"},
                             {"sample_s", "sample", "#3b82f6"},
                             {"decode_s", "decode", "#f59e0b"},
                             {"write_s", "write", "#10b981"}};
constexpr const char* kOtherColour = "#e5e7eb";

constexpr const char* kCss = R"css(
:root{--fg:#1f2937;--muted:#6b7280;--line:#e5e7eb;--card:#fff;--bg:#f6f7f9}
*{box-sizing:border-box}
body{margin:0;padding:20px 28px 40px;background:var(--bg);color:var(--fg);
 font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
h1{font-size:20px;margin:0 0 2px}h2{font-size:16px;margin:28px 0 10px}
.sub{color:var(--muted);margin-bottom:14px;word-break:break-all}
.stats{display:flex;flex-wrap:wrap;gap:8px}
.stat{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:6px 12px;min-width:96px}
.stat b{display:block;font-size:18px;font-variant-numeric:tabular-nums}
.stat span{color:var(--muted);font-size:12px}
.stat.ok b{color:#047857}.stat.bad b{color:#b91c1c}.stat.skip b{color:var(--muted)}
a.stat{text-decoration:none;color:inherit}
.sheet{display:grid;grid-template-columns:repeat(auto-fill,minmax(206px,1fr));gap:10px}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:6px;margin:0;min-width:0}
.thumb{display:flex;align-items:center;justify-content:center;height:192px;border-radius:4px;overflow:hidden;
 background:#f3f4f6}
.thumb img{max-width:100%;max-height:192px;display:block}
.card figcaption{font-size:12px;margin-top:5px;overflow-wrap:anywhere}
.card .id{font-weight:600}.card .meta{color:var(--muted)}
.card .prompt{color:#374151;display:-webkit-box;-webkit-line-clamp:2;-webkit-box-orient:vertical;overflow:hidden}
.card.missing .thumb{background:#e5e7eb;color:#4b5563;flex-direction:column;font-size:13px;padding:8px;
 text-align:center}
.boxed{position:relative;display:inline-block;line-height:0}
.boxed i{position:absolute;border:2px solid #f59e0b;box-sizing:border-box;pointer-events:none}
.card.failed{border-color:#fca5a5;background:#fef2f2}
.card.failed .thumb{background:#fee2e2;color:#991b1b;flex-direction:column;align-items:stretch;
 justify-content:flex-start;padding:10px;font-size:12px;overflow:auto;white-space:pre-wrap;overflow-wrap:anywhere}
.card.failed .thumb strong{font-size:14px;margin-bottom:4px}
.panel{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 12px}
.legend{display:flex;gap:14px;font-size:12px;color:var(--muted);margin-bottom:6px;flex-wrap:wrap}
.legend i{display:inline-block;width:11px;height:11px;border-radius:2px;vertical-align:-1px;margin-right:4px}
svg{display:block;width:100%;height:auto}
svg text{font-family:inherit;fill:#4b5563}
table{border-collapse:collapse;width:100%;background:var(--card);border:1px solid var(--line)}
th,td{text-align:left;padding:6px 10px;border-bottom:1px solid var(--line);vertical-align:top;font-size:13px}
th{background:#f9fafb;font-weight:600}
td.err{white-space:pre-wrap;overflow-wrap:anywhere;color:#991b1b;font-family:ui-monospace,Menlo,Consolas,monospace}
.none{color:var(--muted)}
)css";

void render_header(std::string& h, const json& r) {
  const std::string batch = text(r, "batch");
  h += "<header><h1>sdxl-batch report";
  if (!batch.empty()) h += " \u2014 " + escape(std::filesystem::path(batch).filename().string());
  h += "</h1>\n<div class=\"sub\">";
  std::vector<std::string> parts;
  if (!batch.empty()) parts.push_back("batch <b>" + escape(batch) + "</b>");
  if (auto m = text(r, "model"); !m.empty()) parts.push_back("model <b>" + escape(m) + "</b>");
  if (auto d = text(r, "device"); !d.empty()) parts.push_back("device <b>" + escape(d) + "</b>");
  if (auto s = text(r, "started"); !s.empty()) parts.push_back("started <b>" + escape(s) + "</b>");
  for (size_t i = 0; i < parts.size(); ++i) h += (i ? " \u00b7 " : "") + parts[i];
  h += "</div>\n<div class=\"stats\">\n";

  auto stat = [&h](const std::string& cls, const std::string& value, const std::string& label,
                   const std::string& href = "") {
    if (href.empty()) {
      h += "<div class=\"stat " + cls + "\">";
    } else {
      h += "<a class=\"stat " + cls + "\" href=\"" + href + "\">";
    }
    h += "<b>" + escape(value) + "</b><span>" + escape(label) + "</span>";
    h += href.empty() ? "</div>\n" : "</a>\n";
  };
  const size_t n_images = array_field(r, "images").size();
  const size_t n_failures = array_field(r, "failures").size();
  const double done = num(r, "images_done", static_cast<double>(n_images));
  const double failed = num(r, "images_failed", static_cast<double>(n_failures));
  stat("ok", fmt("%.0f", done), "done");
  stat(failed > 0 ? "bad" : "", fmt("%.0f", failed), "failed", failed > 0 ? "#failures" : "");
  stat("skip", fmt("%.0f", num(r, "images_skipped")), "skipped");
  stat("", fmt("%.0f", num(r, "images_total", done + failed + num(r, "images_skipped"))), "total");
  if (has_num(r, "images_per_hour")) stat("", fmt("%.0f", num(r, "images_per_hour")), "images / hour");
  if (has_num(r, "run_s")) stat("", format_duration(num(r, "run_s")), "run time");
  if (has_num(r, "load_s")) stat("", format_duration(num(r, "load_s")), "model load");
  if (has_num(r, "peak_memory_bytes")) stat("", format_bytes(num(r, "peak_memory_bytes")), "peak memory");
  h += "</div></header>\n";
}

struct Card {
  std::string task;
  double index = 0;
  const json* entry = nullptr;
  size_t image = 0;  // its index in report["images"]; failures: kNoImage
  bool failed = false;
};
constexpr size_t kNoImage = static_cast<size_t>(-1);

// Thumbnails of the images report["images"][i] for each i of `images`, as data: URIs ("" = missing), in
// that order.
using ThumbnailsOf = std::function<std::vector<std::string>(const std::vector<size_t>& images)>;
// Where the page goes, piece by piece.
using PageSink = std::function<void(std::string_view)>;
// The sheet is made this many cards at a time: their thumbnails, then their HTML, then out to the sink.
constexpr size_t kCardsPerBlock = 256;

std::string id_label(const json& e) {
  std::string s = text(e, "task");
  if (auto i = text(e, "index"); !i.empty()) s += " #" + i;
  return s;
}

// The detailer's regions of an image as boxes over its thumbnail (percentages of the image detailed).
std::string detailer_boxes(const json& regions) {
  std::string h;
  for (const json& d : regions) {
    if (!d.is_object() || !d.contains("box") || !d["box"].is_array() || d["box"].size() != 4) continue;
    const double w = num(d, "image_width"), ht = num(d, "image_height");
    if (!(w > 0 && ht > 0) || !d["box"][0].is_number() || !d["box"][1].is_number() || !d["box"][2].is_number() ||
        !d["box"][3].is_number())
      continue;
    const double x1 = d["box"][0].get<double>(), y1 = d["box"][1].get<double>(), x2 = d["box"][2].get<double>(),
                 y2 = d["box"][3].get<double>();
    h += fmt("<i style=\"left:%.2f%%;top:%.2f%%;width:%.2f%%;height:%.2f%%\"", 100 * x1 / w, 100 * y1 / ht,
             100 * (x2 - x1) / w, 100 * (y2 - y1) / ht) +
         " title=\"" + escape(text(d, "detector") + fmt(" %.2f", num(d, "score"))) + "\"></i>";
  }
  return h;
}

// One card of the sheet; `uri` is its thumbnail ("" = missing).
void render_card(std::string& h, const Card& c, const std::string& uri) {
  const json& e = *c.entry;
  const std::string prompt = text(e, "prompt");
  const std::string file = text(e, "file");
  std::string meta;
  if (auto seed = text(e, "seed"); !seed.empty()) meta += "seed " + seed;
  if (has_num(e, "width") && has_num(e, "height"))
    meta += fmt(" \u00b7 %.0f\u00d7%.0f", num(e, "width"), num(e, "height"));
  if (has_num(e, "total_s")) meta += fmt(" \u00b7 %.1f s", num(e, "total_s"));

  std::string tooltip = id_label(e) + (meta.empty() ? "" : "  " + meta);
  if (has_num(e, "steps")) tooltip += fmt("  steps %.0f", num(e, "steps"));
  if (has_num(e, "cfg")) tooltip += fmt("  cfg %g", num(e, "cfg"));
  if (!prompt.empty()) tooltip += "\n" + prompt;

  const char* cls = c.failed ? "card failed" : uri.empty() ? "card missing" : "card";
  h += "<figure class=\"" + std::string(cls) + "\" title=\"" + escape(tooltip) + "\"><div class=\"thumb\">";
  if (c.failed) {
    h += "<strong>failed</strong>" + escape(truncate_utf8(text(e, "error"), 400));
  } else if (uri.empty()) {
    h += "<strong>file missing</strong><span>" + escape(file) + "</span>";
  } else {
    std::string img = "<img src=\"" + escape(uri) + "\" alt=\"" + escape(truncate_utf8(prompt, 80)) + "\">";
    if (e.contains("detailer") && e["detailer"].is_array() && !e["detailer"].empty())
      img = "<span class=\"boxed\">" + img + detailer_boxes(e["detailer"]) + "</span>";
    h += file.empty() ? img : "<a href=\"" + escape(url_path(file)) + "\">" + img + "</a>";
  }
  h += "</div><figcaption><span class=\"id\">" + escape(id_label(e)) + "</span> <span class=\"meta\">" +
       escape(meta) + "</span>";
  if (!prompt.empty()) h += "<div class=\"prompt\">" + escape(truncate_utf8(prompt, 80)) + "</div>";
  h += "</figcaption></figure>\n";
}

// The contact sheet, kCardsPerBlock cards at a time (their thumbnails made, written to `sink`, dropped), so
// that a sheet of 60,000 images never holds more than one block of thumbnails.
void render_sheet(std::string& h, const json& r, const ThumbnailsOf& thumbnails_of, const PageSink& sink) {
  std::vector<Card> cards;
  const json& images = array_field(r, "images");
  for (size_t i = 0; i < images.size(); ++i) {
    const json& e = images[i];
    cards.push_back({text(e, "task"), num(e, "index"), &e, i, !text(e, "error").empty()});
  }
  for (const json& f : array_field(r, "failures"))
    cards.push_back({text(f, "task"), num(f, "index"), &f, kNoImage, true});
  std::stable_sort(cards.begin(), cards.end(), [](const Card& a, const Card& b) {
    if (a.task != b.task) return natural_less(a.task, b.task);
    return a.index < b.index;
  });

  h += "<h2>Images</h2>\n";
  if (cards.empty()) {
    h += "<p class=\"none\">No images in this run.</p>\n";
    return;
  }
  h += "<div class=\"sheet\">\n";
  for (size_t begin = 0; begin < cards.size(); begin += kCardsPerBlock) {
    const size_t end = std::min(cards.size(), begin + kCardsPerBlock);
    std::vector<size_t> wanted;
    for (size_t k = begin; k < end; ++k)
      if (cards[k].image != kNoImage && !cards[k].failed) wanted.push_back(cards[k].image);
    const std::vector<std::string> uris = thumbnails_of(wanted);
    for (size_t k = begin, w = 0; k < end; ++k) {
      const bool has_uri = cards[k].image != kNoImage && !cards[k].failed;
      render_card(h, cards[k], has_uri && w < uris.size() ? uris[w] : std::string());
      if (has_uri) ++w;
    }
    sink(h);
    h.clear();
  }
  h += "</div>\n";
}

// Shared geometry of the two charts, so their time axes line up.
constexpr double kSvgWidth = 1100, kLabelWidth = 150, kRightPad = 16;
constexpr double kPlotWidth = kSvgWidth - kLabelWidth - kRightPad;

// Times past this are not plotted: no run lasts a year, and a report that says otherwise (a start years
// off, a run_s of 1e300) must not stretch the axis.
constexpr double kMaxPlotSeconds = 366 * 86400.0;
// The most grid lines a chart draws (the step is chosen for about ten): each is a few hundred bytes of page.
constexpr int kMaxGridLines = 24;

bool plottable(double t) { return t >= 0 && t <= kMaxPlotSeconds; }

struct TimeAxis {
  double end_s = 1, step_s = 1;
  double x(double t) const { return kLabelWidth + std::clamp(t / end_s, 0.0, 1.0) * kPlotWidth; }
};

// Vertical grid lines at each tick, labelled above (labels_above) or below the plot.
void render_time_ticks(std::string& h, const TimeAxis& ax, double top, double bottom, bool labels_above) {
  for (int k = 0; k <= kMaxGridLines; ++k) {
    const double t = k * ax.step_s;
    if (t > ax.end_s + 1e-9) break;
    h += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eef0f3\"/>", ax.x(t), top, ax.x(t),
             bottom);
    h += fmt("<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">", ax.x(t),
             labels_above ? top - 5 : bottom + 14) +
         format_tick_s(t, ax.step_s) + "</text>";
  }
}

void render_timeline(std::string& h, const json& r, const TimeAxis& ax) {
  std::vector<const json*> rows;
  for (const json& e : array_field(r, "images"))
    if (has_num(e, "start_s") && plottable(num(e, "start_s"))) rows.push_back(&e);
  std::stable_sort(rows.begin(), rows.end(),
                   [](const json* a, const json* b) { return num(*a, "start_s") < num(*b, "start_s"); });

  h += "<h2>Timeline</h2>\n<div class=\"panel\"><div class=\"legend\">";
  for (const Stage& s : kStages)
    h += "<span><i style=\"background:" + std::string(s.colour) + "\"></i>" + s.name + "</span>";
  h += "<span><i style=\"background:" + std::string(kOtherColour) + "\"></i>other</span></div>\n";
  if (rows.empty()) {
    h += "<p class=\"none\">No timings in the report.</p></div>\n";
    return;
  }
  const size_t n = rows.size();
  const double row_h = n <= 40 ? 18 : n <= 120 ? 11 : 6;
  const double bar_h = std::max(3.0, row_h - (row_h >= 11 ? 5 : 2));
  // Dense timelines label every k-th row so the labels do not overlap.
  const size_t label_every = row_h >= 11 ? 1 : static_cast<size_t>(std::ceil(12 / row_h));
  const double top = 22, height = top + row_h * static_cast<double>(n) + 6;
  h += fmt("<svg viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"stage timeline\">", kSvgWidth, height);
  render_time_ticks(h, ax, top, height - 4, true);
  for (size_t i = 0; i < n; ++i) {
    const json& e = *rows[i];
    const double y = top + row_h * static_cast<double>(i);
    const double by = y + (row_h - bar_h) / 2;
    const std::string label = escape(id_label(e));
    if (i % label_every == 0)
      h += fmt("<text x=\"%.1f\" y=\"%.1f\" font-size=\"%.0f\" text-anchor=\"end\">", kLabelWidth - 8,
               y + row_h / 2 + 4, std::min(11.0, row_h * static_cast<double>(label_every) - 1)) +
           label + "</text>";
    double t = num(e, "start_s");
    double stage_sum = 0;
    for (const Stage& s : kStages) stage_sum += std::max(0.0, num(e, s.key));
    const double total = std::max(num(e, "total_s", stage_sum), stage_sum);
    // The whole image first (grey shows time outside the four stages), stages on top.
    h += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"><title>", ax.x(t), by,
             std::max(0.5, ax.x(t + total) - ax.x(t)), bar_h, kOtherColour) +
         label + fmt(" total %.2f s</title></rect>", total);
    for (const Stage& s : kStages) {
      const double d = std::max(0.0, num(e, s.key));
      if (d > 0)
        h += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"><title>", ax.x(t), by,
                 std::max(0.5, ax.x(t + d) - ax.x(t)), bar_h, s.colour) +
             label + fmt(" %s %.2f s</title></rect>", s.name, d);
      t += d;
    }
  }
  h += "</svg></div>\n";
}

void render_memory(std::string& h, const json& r, const TimeAxis& ax) {
  std::vector<std::pair<double, double>> pts;  // (time after the image, bytes)
  for (const json& e : array_field(r, "images")) {
    if (!has_num(e, "memory_bytes")) continue;
    double t = num(e, "start_s") + num(e, "total_s");
    pts.emplace_back(t, num(e, "memory_bytes"));
  }
  std::stable_sort(pts.begin(), pts.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  const double peak = num(r, "peak_memory_bytes");

  h += "<h2>Memory</h2>\n<div class=\"panel\">";
  if (pts.empty()) {
    h += "<p class=\"none\">No memory samples in the report.</p></div>\n";
    return;
  }
  double max_b = peak;
  for (const auto& p : pts) max_b = std::max(max_b, p.second);
  const double gib = 1024.0 * 1024 * 1024, mib = 1024.0 * 1024;
  const double unit = max_b >= gib ? gib : mib;
  const double step_b = nice_step(max_b / unit / 4) * unit;
  const double top_b = std::max(step_b, std::ceil(max_b / step_b) * step_b);
  const double top = 10, plot_h = 150, bottom = top + plot_h;
  auto y = [&](double b) { return bottom - std::clamp(b / top_b, 0.0, 1.0) * plot_h; };

  h += fmt("<svg viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"memory over the run\">", kSvgWidth, bottom + 20);
  render_time_ticks(h, ax, top, bottom, false);
  for (int k = 0; k <= kMaxGridLines; ++k) {
    const double b = k * step_b;
    if (b > top_b + 1) break;
    h += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eef0f3\"/>", kLabelWidth, y(b),
             kLabelWidth + kPlotWidth, y(b));
    h += fmt("<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">", kLabelWidth - 8, y(b) + 4) +
         format_bytes(b) + "</text>";
  }
  std::string line;
  for (const auto& [t, b] : pts) line += fmt("%.1f,%.1f ", ax.x(t), y(b));
  h += fmt("<polygon points=\"%.1f,%.1f ", ax.x(pts.front().first), bottom) + line +
       fmt("%.1f,%.1f\" fill=\"#3b82f6\" fill-opacity=\"0.15\"/>", ax.x(pts.back().first), bottom);
  h += "<polyline points=\"" + line + "\" fill=\"none\" stroke=\"#2563eb\" stroke-width=\"1.5\"/>";
  if (pts.size() <= 80)
    for (const auto& [t, b] : pts)
      h += fmt("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"#2563eb\"><title>%.1f s: ", ax.x(t), y(b), t) +
           format_bytes(b) + "</title></circle>";
  if (peak > 0) {
    h += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#dc2626\" stroke-dasharray=\"5 4\"/>",
             kLabelWidth, y(peak), kLabelWidth + kPlotWidth, y(peak));
    h += fmt("<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\" style=\"fill:#dc2626\">peak ",
             kLabelWidth + kPlotWidth - 4, y(peak) - 4) +
         format_bytes(peak) + "</text>";
  }
  h += "</svg></div>\n";
}

void render_failures(std::string& h, const json& r) {
  const json& failures = array_field(r, "failures");
  h += "<h2 id=\"failures\">Failures</h2>\n";
  if (failures.empty()) {
    h += "<p class=\"none\">None.</p>\n";
    return;
  }
  h += "<table><thead><tr><th>task</th><th>index</th><th>seed</th><th>error</th></tr></thead><tbody>\n";
  for (const json& f : failures)
    h += "<tr><td>" + escape(text(f, "task")) + "</td><td>" + escape(text(f, "index")) + "</td><td>" +
         escape(text(f, "seed")) + "</td><td class=\"err\">" + escape(text(f, "error")) + "</td></tr>\n";
  h += "</tbody></table>\n";
}

// A merged report's runs (sdxl-batch report, the last shard of an array): one row each, the slowest marked.
void render_runs(std::string& h, const json& r) {
  const json& runs = array_field(r, "runs");
  if (runs.empty()) return;
  const std::string slowest = text(field(r, "slowest_run"), "report");
  h += "<h2 id=\"runs\">Runs</h2>\n<table><thead><tr><th>report</th><th>shard</th><th>host</th><th>started</th>"
       "<th>done</th><th>skipped</th><th>failed</th><th>run time</th><th>images / hour</th></tr></thead><tbody>\n";
  for (const json& x : runs) {
    const std::string name = text(x, "report");
    h += "<tr><td>" + escape(name) + (name == slowest ? " (slowest)" : "") + "</td><td>" + escape(text(x, "shard")) +
         "</td><td>" + escape(text(x, "host")) + "</td><td>" + escape(text(x, "started")) + "</td><td>" +
         fmt("%.0f", num(x, "images_done")) + "</td><td>" + fmt("%.0f", num(x, "images_skipped")) + "</td><td>" +
         fmt("%.0f", num(x, "images_failed")) + "</td><td>" + format_duration(num(x, "run_s")) + "</td><td>" +
         fmt("%.0f", num(x, "images_per_hour")) + "</td></tr>\n";
  }
  h += "</tbody></table>\n";
  for (const json& x : array_field(field(r, "merged"), "left_out"))
    h += "<p class=\"none\">Left out: " + escape(text(x, "report")) + ": " + escape(text(x, "why")) + "</p>\n";
  const json& hosts = array_field(r, "hosts");
  if (hosts.size() < 2) return;
  h += "<table><thead><tr><th>host</th><th>images made</th><th>run time</th><th>images / hour</th></tr></thead>"
       "<tbody>\n";
  for (const json& x : hosts)
    h += "<tr><td>" + escape(text(x, "host")) + "</td><td>" + fmt("%.0f", num(x, "images_made")) + "</td><td>" +
         format_duration(num(x, "run_s")) + "</td><td>" + fmt("%.0f", num(x, "images_per_hour")) + "</td></tr>\n";
  h += "</tbody></table>\n";
}

// The axis spans the run and every plotted image (times past kMaxPlotSeconds are left out), in about ten
// steps: seconds, then 1, 2, 5, 10, 15, 30, 60 or 120 minutes, then hours.
TimeAxis make_time_axis(const json& r) {
  double end = plottable(num(r, "run_s")) ? num(r, "run_s") : 0;
  for (const json& e : array_field(r, "images"))
    if (const double t = num(e, "start_s") + num(e, "total_s"); plottable(num(e, "start_s")) && plottable(t))
      end = std::max(end, t);
  TimeAxis ax;
  if (end > 0) {
    ax.step_s = nice_step(end / 10);
    if (ax.step_s >= 60) {
      double m = 0;
      for (double c : {1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0})
        if (c * 60 >= end / 10) {
          m = c;
          break;
        }
      ax.step_s = m > 0 ? m * 60 : nice_step(end / 10 / 3600) * 3600;
    }
    ax.end_s = end;
  }
  return ax;
}

// ---------------------------------------------------------------- thumbnails

// Area-weighted downscale of one axis: weights of the source samples that make
// up each output sample (box filter with fractional edges).
struct Tap {
  int src;
  float weight;
};
std::vector<std::vector<Tap>> box_taps(int in, int out) {
  std::vector<std::vector<Tap>> taps(static_cast<size_t>(out));
  const double scale = static_cast<double>(in) / out;
  for (int o = 0; o < out; ++o) {
    const double a = o * scale, b = std::min<double>(in, (o + 1) * scale);
    for (int s = static_cast<int>(a); s < in && s < b; ++s) {
      const double w = std::min<double>(b, s + 1) - std::max<double>(a, s);
      if (w > 1e-9) taps[static_cast<size_t>(o)].push_back({s, static_cast<float>(w / (b - a))});
    }
  }
  return taps;
}

std::vector<std::uint8_t> downscale_rgb(const std::uint8_t* src, int w, int h, int tw, int th) {
  const auto xt = box_taps(w, tw), yt = box_taps(h, th);
  std::vector<float> rows(static_cast<size_t>(tw) * h * 3);  // horizontal pass
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < tw; ++x)
      for (int c = 0; c < 3; ++c) {
        float acc = 0;
        for (const Tap& t : xt[static_cast<size_t>(x)])
          acc += t.weight * src[(static_cast<size_t>(y) * w + t.src) * 3 + c];
        rows[(static_cast<size_t>(y) * tw + x) * 3 + c] = acc;
      }
  std::vector<std::uint8_t> out(static_cast<size_t>(tw) * th * 3);
  for (int y = 0; y < th; ++y)
    for (int x = 0; x < tw; ++x)
      for (int c = 0; c < 3; ++c) {
        float acc = 0;
        for (const Tap& t : yt[static_cast<size_t>(y)])
          acc += t.weight * rows[(static_cast<size_t>(t.src) * tw + x) * 3 + c];
        out[(static_cast<size_t>(y) * tw + x) * 3 + c] =
            static_cast<std::uint8_t>(std::clamp(acc + 0.5f, 0.0f, 255.0f));
      }
  return out;
}

// `png` with only its critical chunks (IHDR, PLTE, IDAT, IEND), each checked against its CRC: an image that
// needs no downscale is shown as it is, without being encoded again, and without its text chunks (its
// parameters) or any other ancillary chunk. "" when the chunks do not parse (then it is encoded again).
std::string critical_chunks(const std::string& png) {
  auto be32 = [&png](size_t at) {
    std::uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) v = (v << 8) | static_cast<unsigned char>(png[at + k]);
    return v;
  };
  std::string out = png.substr(0, 8);  // the signature (stb checked it)
  for (size_t at = 8; at + 12 <= png.size();) {
    const std::uint32_t len = be32(at);
    if (len > png.size() - at - 12) return {};
    const std::string type = png.substr(at + 4, 4);
    const auto* body = reinterpret_cast<const Bytef*>(png.data() + at + 4);
    if (crc32(0, body, static_cast<uInt>(len + 4)) != be32(at + 8 + len)) return {};
    if (type == "IHDR" || type == "PLTE" || type == "IDAT" || type == "IEND") out.append(png, at, 12 + size_t{len});
    if (type == "IEND") return out;
    at += 12 + size_t{len};
  }
  return {};
}

// The largest file a thumbnail is made from: what an input image may be (image/png_reader.cpp).
constexpr std::uint64_t kMaxThumbnailSourceBytes = 256ull << 20;

// A thumbnail of out_dir/file as a data: URI, "" when it cannot be shown. The file is read as every input
// is (core/input_file.h): only a regular file, at most kMaxThumbnailSourceBytes, that lies inside out_dir
// once links are resolved, so a report or manifest line planted in a shared folder that names
// "/abs/secret.png", "../x.png" or a link to either gets no thumbnail; and decoded by png_reader within
// its pixel limit (kMaxInputImagePixels, from the header, before any pixel is decoded).
std::string thumbnail_data_uri(const std::filesystem::path& out_dir, const std::string& file) {
  try {
    const std::filesystem::path root = out_dir.empty() ? std::filesystem::path(".") : out_dir;  // "" is unconfined
    const std::filesystem::path path = root / file;
    InputFile f(path, kMaxThumbnailSourceBytes, root);
    const std::string data = f.ok() ? f.read_all() : std::string();
    if (!f.ok() || !f.error().empty()) return {};
    const RgbImage img = decode_png_rgb(data, path, "image");
    const int w = img.width, h = img.height;
    if (w <= 0 || h <= 0) return {};
    const int longest = std::max(w, h);
    if (longest <= kThumbnailMaxSide)
      if (const std::string as_is = critical_chunks(data); !as_is.empty())
        return "data:image/png;base64," +
               base64_encode({reinterpret_cast<const std::uint8_t*>(as_is.data()), as_is.size()});
    std::vector<std::uint8_t> thumb;
    int tw = w, th = h;
    if (longest > kThumbnailMaxSide) {
      tw = std::max(1, static_cast<int>(std::lround(static_cast<double>(w) * kThumbnailMaxSide / longest)));
      th = std::max(1, static_cast<int>(std::lround(static_cast<double>(h) * kThumbnailMaxSide / longest)));
      thumb = downscale_rgb(img.rgb.data(), w, h, tw, th);
    }
    const auto encoded = encode_png(tw, th, 3, thumb.empty() ? img.rgb.data() : thumb.data(), {});
    return "data:image/png;base64," + base64_encode(encoded);
  } catch (const std::exception&) {
    return {};  // a broken thumbnail must not cost the report
  }
}

}  // namespace

std::string base64_encode(std::span<const std::uint8_t> data) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out((data.size() + 2) / 3 * 4, '=');
  char* o = out.data();
  size_t i = 0;
  for (; i + 3 <= data.size(); i += 3, o += 4) {
    const std::uint32_t v = (std::uint32_t{data[i]} << 16) | (std::uint32_t{data[i + 1]} << 8) | data[i + 2];
    o[0] = kAlphabet[(v >> 18) & 63];
    o[1] = kAlphabet[(v >> 12) & 63];
    o[2] = kAlphabet[(v >> 6) & 63];
    o[3] = kAlphabet[v & 63];
  }
  if (const size_t rest = data.size() - i; rest > 0) {  // the last 1 or 2 bytes; '=' pads the rest
    std::uint32_t v = std::uint32_t{data[i]} << 16;
    if (rest == 2) v |= std::uint32_t{data[i + 1]} << 8;
    o[0] = kAlphabet[(v >> 18) & 63];
    o[1] = kAlphabet[(v >> 12) & 63];
    if (rest == 2) o[2] = kAlphabet[(v >> 6) & 63];
  }
  return out;
}

namespace {

// The page, written to `sink` in pieces.
void render_page(const json& report, const ThumbnailsOf& thumbnails_of, const PageSink& sink) {
  std::string h;
  const std::string batch = text(report, "batch");
  h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
       "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>";
  h += escape(batch.empty() ? "sdxl-batch report" : "sdxl-batch report \u2014 " + batch);
  h += "</title>\n<style>";
  h += kCss;
  h += "</style></head>\n<body>\n";
  render_header(h, report);
  render_runs(h, report);
  render_sheet(h, report, thumbnails_of, sink);
  const TimeAxis ax = make_time_axis(report);
  render_timeline(h, report, ax);
  render_memory(h, report, ax);
  render_failures(h, report);
  h += "</body></html>\n";
  sink(h);
}

}  // namespace

std::string render_report_html(const nlohmann::json& report, const std::vector<std::string>& thumbnail_data_uris) {
  std::string page;
  const ThumbnailsOf given = [&](const std::vector<size_t>& images) {
    std::vector<std::string> uris;
    for (size_t i : images) uris.push_back(i < thumbnail_data_uris.size() ? thumbnail_data_uris[i] : std::string());
    return uris;
  };
  render_page(report, given, [&page](std::string_view piece) { page += piece; });
  return page;
}

void write_report_html(const std::filesystem::path& out_dir, const nlohmann::json& report,
                       const std::string& file_name) {
  const json& images = array_field(report, "images");
  // Each thumbnail is its own file's work (read, decode, downscale, encode): spread over the cores.
  const ThumbnailsOf made = [&](const std::vector<size_t>& wanted) {
    std::vector<std::string> uris(wanted.size());
    parallel_ranges(wanted.size(), 1e6 * static_cast<double>(wanted.size()), [&](size_t begin, size_t end) {
      for (size_t k = begin; k < end; ++k)
        if (const std::string file = text(images[wanted[k]], "file"); !file.empty())
          uris[k] = thumbnail_data_uri(out_dir, file);
    });
    return uris;
  };
  write_file_atomic_streamed(out_dir / file_name,
                             [&](const std::function<void(std::string_view)>& write) { render_page(report, made, write); });
}

}  // namespace sdxl
