#include "scheduler/night_report.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <utility>

#include "batch/manifest.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/json_shape.h"
#include "core/run_lock.h"
#include "report/report_html.h"
#include "scheduler/output_folder.h"

namespace sdxl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct RunReport {
  std::string name;  // file name in the folder
  json r;
  double start = 0;  // Unix seconds of "started" (0: unknown)
};

// The run reports of a folder, and those left out of the merge with why.
struct RunReports {
  std::vector<RunReport> runs;
  std::vector<std::pair<std::string, std::string>> left_out;  // (file name, why)
};

// A run report is read whole; sdxl-batch writes a few MiB for 100,000 images.
constexpr std::uint64_t kMaxRunReportBytes = 256ull << 20;
// The time axis of the merge is about one night: a run whose start lies further than this from the middle
// run's start (an old run left in the folder, a host whose clock is years off) keeps its row and images but
// gets no place on the axis, which would otherwise stretch over years.
constexpr double kMaxAxisSpanS = 31 * 86400.0;
// A run_s or start_s beyond this (a year) is not a time this program wrote: it is ignored on the axis.
constexpr double kMaxRunSeconds = 366 * 86400.0;

// Digits s[at, at + n) as a number, -1 when one is not a digit.
int digits_at(const std::string& s, size_t at, size_t n) {
  int v = 0;
  for (size_t i = at; i < at + n; ++i) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v;
}

// "2026-12-04T16:54:39Z" (what a run writes, UTC) -> Unix seconds; 0 when the text does not start with that
// form or names no real time. Read digit by digit, so that no number can overflow.
double unix_of(const std::string& iso) {
  if (iso.size() < 19 || iso[4] != '-' || iso[7] != '-' || iso[10] != 'T' || iso[13] != ':' || iso[16] != ':')
    return 0;
  std::tm tm{};
  tm.tm_year = digits_at(iso, 0, 4) - 1900;
  tm.tm_mon = digits_at(iso, 5, 2) - 1;
  tm.tm_mday = digits_at(iso, 8, 2);
  tm.tm_hour = digits_at(iso, 11, 2);
  tm.tm_min = digits_at(iso, 14, 2);
  tm.tm_sec = digits_at(iso, 17, 2);
  if (tm.tm_year < 70 || tm.tm_mon < 0 || tm.tm_mon > 11 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour < 0 ||
      tm.tm_hour > 23 || tm.tm_min < 0 || tm.tm_min > 59 || tm.tm_sec < 0 || tm.tm_sec > 60)
    return 0;
  return std::max(0.0, static_cast<double>(timegm(&tm)));
}

double num(const json& j, const char* key) {
  if (!j.is_object()) return 0;
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0;
}
std::string str(const json& j, const char* key) {
  if (!j.is_object()) return {};
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}
// `seconds` when it is a time a run can have taken (0 to a year), else 0.
double sane_seconds(double seconds) { return seconds >= 0 && seconds <= kMaxRunSeconds ? seconds : 0; }

// "a string", "an array", ... for messages.
std::string type_of(const json& v) {
  const std::string t = v.type_name();
  return (t == "array" || t == "object" ? "an " : "a ") + t;
}

bool is_count(const json& v) {
  if (!v.is_number()) return false;
  const double d = v.get<double>();
  return d >= 0 && d <= 2147483647.0 && d == std::floor(d);
}

// Why report `r` cannot be merged, naming the key as a JSON pointer, or "": every key the merge and the page
// read has the type a run writes (counts: integers in [0, 2^31); seconds, rates and bytes: numbers >= 0; the
// records: arrays of objects). A value out of a plausible range but of the right type is kept, and ignored
// where it would mislead (the time axis).
std::string report_shape_problem(const json& r) {
  for (const char* key : {"batch", "started", "host"})
    if (r.contains(key) && !r[key].is_string()) return "/" + std::string(key) + " is " + type_of(r[key]) + ", not a string";
  for (const char* key : {"images_total", "images_done", "images_skipped", "images_failed", "images_not_started"})
    if (r.contains(key) && !is_count(r[key]))
      return "/" + std::string(key) + " is " + r[key].dump() + ", not a count (an integer from 0 to 2^31 - 1)";
  for (const char* key : {"run_s", "load_s", "images_per_hour", "peak_memory_bytes"})
    if (r.contains(key) && !(r[key].is_number() && r[key].get<double>() >= 0))
      return "/" + std::string(key) + " is " + r[key].dump() + ", not a number >= 0";
  if (r.contains("shard")) {
    const json& s = r["shard"];
    if (!s.is_object()) return "/shard is " + type_of(s) + ", not an object";
    if (!is_count(s.value("index", json())) || !is_count(s.value("count", json())) ||
        num(s, "index") >= std::max(1.0, num(s, "count")))
      return "/shard is " + s.dump() + ", not {\"index\": K, \"count\": N} with 0 <= K < N";
  }
  for (const char* key : {"images", "failures", "devices"}) {
    if (!r.contains(key)) continue;
    const json& a = r[key];
    if (!a.is_array()) return "/" + std::string(key) + " is " + type_of(a) + ", not an array";
    for (size_t i = 0; i < a.size(); ++i) {
      const std::string at = "/" + std::string(key) + "/" + std::to_string(i);
      if (!a[i].is_object()) return at + " is " + type_of(a[i]) + ", not an object";
      if (a[i].contains("file") && !a[i]["file"].is_string()) return at + "/file is " + type_of(a[i]["file"]) + ", not a string";
    }
  }
  return "";
}

// One report file parsed: IoError naming it when it cannot be read (not a regular file inside the folder,
// larger than kMaxRunReportBytes), is nested deeper than the batch parser allows, or is not a JSON object.
json parse_run_report(const fs::path& path, const fs::path& dir) {
  std::string text;
  try {
    text = read_input_file(path, "run report", kMaxRunReportBytes, dir);
  } catch (const UsageError& e) {
    throw IoError(e.what());
  }
  // Anything that walks the document (copies, dump) recurses once per level: refuse deep ones first.
  if (check_json_shape(text).too_deep)
    throw IoError(path.string() + ": not a run report (nested deeper than " + std::to_string(kMaxJsonDepth) +
                  " levels)");
  json r;
  try {
    r = json::parse(text);
  } catch (const json::exception& x) {
    throw IoError(path.string() + ": not a run report (" + x.what() + ")");
  }
  if (!r.is_object()) throw IoError(path.string() + ": not a run report (not a JSON object)");
  return r;
}

// The run reports of the folder, sorted by name (report.json only when it is not a merge). A report of the
// wrong shape is left out (logged); one that cannot be read throws IoError when `strict`, else is left out too.
RunReports read_run_reports(const fs::path& dir, bool strict, bool none_ok = false) {
  static const std::regex shard_name(R"(report-shard-[0-9]+-of-[0-9]+\.json)");
  RunReports out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name != "report.json" && !std::regex_match(name, shard_name)) continue;
    RunReport rr{name, {}, 0};
    try {
      rr.r = parse_run_report(e.path(), dir);
    } catch (const IoError& x) {
      if (strict) throw;
      out.left_out.emplace_back(name, x.what());
      continue;
    }
    if (name == "report.json" && rr.r.contains("merged")) continue;  // an earlier merge
    if (std::string why = report_shape_problem(rr.r); !why.empty()) {
      if (strict)
        spdlog::warn("{}: {}: the report is left out of the merge (its images still come from the manifests)",
                     e.path().string(), why);
      out.left_out.emplace_back(name, why);
      continue;
    }
    rr.start = unix_of(str(rr.r, "started"));
    out.runs.push_back(std::move(rr));
  }
  if (ec) throw IoError(dir.string() + ": " + ec.message());
  if (out.runs.empty() && !none_ok) {
    if (out.left_out.empty())
      throw UsageError(dir.string() + ": no report.json or report-shard-K-of-N.json: not the output folder of a run");
    std::string msg = dir.string() + ": no run report can be merged:";
    for (const auto& [name, why] : out.left_out) msg += " " + name + ": " + why + ";";
    throw IoError(msg);
  }
  std::sort(out.runs.begin(), out.runs.end(), [](const RunReport& a, const RunReport& b) { return a.name < b.name; });
  return out;
}

// UsageError when the runs made different batch files (their shards would not add up to one batch).
void check_one_batch(const std::vector<RunReport>& runs) {
  std::map<std::string, std::vector<std::string>> by_batch;
  for (const auto& rr : runs) by_batch[str(rr.r, "batch")].push_back(rr.name);
  if (by_batch.size() <= 1) return;
  std::string msg = "the folder holds runs of different batch files:";
  for (const auto& [batch, names] : by_batch) {
    msg += " '" + batch + "' (";
    for (size_t i = 0; i < names.size(); ++i) msg += (i ? ", " : "") + names[i];
    msg += ")";
  }
  throw UsageError(msg + "; give each batch file its own --out folder");
}

// The batch's image count: a plain run's total, or the sum over one array's shards (the largest of these).
double batch_total(const std::vector<RunReport>& runs) {
  std::map<int, double> by_count;
  double plain = 0;
  for (const auto& rr : runs) {
    const int count = rr.r.contains("shard") ? static_cast<int>(num(rr.r["shard"], "count")) : 1;
    if (count <= 1) plain = std::max(plain, num(rr.r, "images_total"));
    else by_count[count] += num(rr.r, "images_total");
  }
  for (const auto& [count, total] : by_count) plain = std::max(plain, total);
  return plain;
}

std::string fmt_shard(const json& shard) {
  return std::to_string(static_cast<int>(num(shard, "index"))) + "/" +
         std::to_string(static_cast<int>(num(shard, "count")));
}

// Where each run sits on the merge's time axis: the earliest start of the runs that started within
// kMaxAxisSpanS of the middle one; 0 when no run says when it started (then every run starts at 0).
struct TimeAxis {
  double night_start = 0;
  double median = 0;
  // The run's start in seconds after night_start; nullopt when the run has no place on the axis.
  std::optional<double> offset(const RunReport& rr) const {
    if (night_start <= 0) return 0.0;
    if (rr.start <= 0 || std::abs(rr.start - median) > kMaxAxisSpanS) return std::nullopt;
    return rr.start - night_start;
  }
};

TimeAxis time_axis(const std::vector<RunReport>& runs) {
  std::vector<double> starts;
  for (const auto& rr : runs)
    if (rr.start > 0) starts.push_back(rr.start);
  TimeAxis ax;
  if (starts.empty()) return ax;
  std::sort(starts.begin(), starts.end());
  ax.median = starts[starts.size() / 2];
  for (double s : starts)
    if (std::abs(s - ax.median) <= kMaxAxisSpanS) {
      ax.night_start = s;
      break;
    }
  return ax;
}

// One row per run, and the run's images, failures and devices moved onto the night's time axis (an image's
// start_s only when it is a time within its run and the run has a place on the axis).
json run_row(const RunReport& rr, const TimeAxis& ax, json& images, json& failures, json& devices) {
  const std::optional<double> offset = ax.offset(rr);
  const json shard = rr.r.value("shard", json::object());
  const std::string label = num(shard, "count") > 1 ? fmt_shard(shard) : "plain";
  for (json e : rr.r.value("images", json::array())) {
    const double start_s = num(e, "start_s");
    if (offset && e.contains("start_s") && e["start_s"].is_number() && sane_seconds(start_s) == start_s)
      e["start_s"] = start_s + *offset;
    else e.erase("start_s");
    e["run"] = label;
    images.push_back(std::move(e));
  }
  for (json f : rr.r.value("failures", json::array())) {
    f["run"] = label;
    failures.push_back(std::move(f));
  }
  for (json d : rr.r.value("devices", json::array())) {
    d["run"] = label;
    devices.push_back(std::move(d));
  }
  return {{"report", rr.name},        {"shard", label},
          {"host", str(rr.r, "host")}, {"device", rr.r.value("device", json())},
          {"started", str(rr.r, "started")}, {"start_s", offset ? json(*offset) : json()},
          {"run_s", num(rr.r, "run_s")}, {"images_done", num(rr.r, "images_done")},
          {"images_skipped", num(rr.r, "images_skipped")}, {"images_failed", num(rr.r, "images_failed")},
          {"images_not_started", num(rr.r, "images_not_started")},
          {"images_per_hour", num(rr.r, "images_per_hour")}, {"stop_reason", rr.r.value("stop_reason", json())}};
}

// The images of the manifests that no merged report lists (made by a run whose report a later run of the
// same shard replaced, as a requeued array task's first run): the contact sheet shows every image of the
// folder, with what its manifest line says (settings, seconds; its place on the time axis from when it
// finished, when that falls on the axis).
void add_earlier_images(const Manifest& manifest, const TimeAxis& ax, json& images) {
  std::set<std::string> listed;
  for (const json& e : images)
    if (e.contains("file") && e["file"].is_string()) listed.insert(e["file"].get<std::string>());
  for (const ManifestEntry& m : manifest.entries()) {
    if (listed.count(m.file)) continue;
    const GenerationParams& p = m.params;
    json e = {{"task", m.task}, {"index", m.index}, {"seed", m.seed}, {"file", m.file}, {"prompt", p.prompt},
              {"width", p.width}, {"height", p.height}, {"steps", p.steps}, {"cfg", p.cfg},
              {"sampler", p.sampler}, {"sha256", m.sha256}, {"run", "an earlier run"}};
    const double seconds = sane_seconds(m.seconds), finished = unix_of(m.finished);
    if (seconds > 0) e["total_s"] = seconds;
    const double start_s = finished - seconds - ax.night_start;
    if (ax.night_start > 0 && finished > 0 && std::abs(finished - ax.median) <= kMaxAxisSpanS && start_s >= 0)
      e["start_s"] = start_s;
    images.push_back(std::move(e));
  }
}

}  // namespace

json merge_run_reports(const fs::path& out_dir) {
  const RunReports read = read_run_reports(out_dir, /*strict=*/true);
  const std::vector<RunReport>& runs = read.runs;
  check_one_batch(runs);
  const TimeAxis ax = time_axis(runs);
  double night_end = 0, made = 0, failed = 0, peak = 0;
  json images = json::array(), failures = json::array(), devices = json::array(), rows = json::array();
  std::map<std::string, std::pair<double, double>> hosts;  // host -> {images made, seconds of its runs}
  const RunReport* slowest = &runs.front();
  for (const auto& rr : runs) {
    rows.push_back(run_row(rr, ax, images, failures, devices));
    const double run_s = sane_seconds(num(rr.r, "run_s"));
    if (const auto offset = ax.offset(rr)) night_end = std::max(night_end, *offset + run_s);
    made += num(rr.r, "images_done");
    failed += num(rr.r, "images_failed");
    peak = std::max(peak, num(rr.r, "peak_memory_bytes"));
    auto& h = hosts[str(rr.r, "host")];
    h.first += num(rr.r, "images_done");
    h.second += run_s;
    if (run_s > sane_seconds(num(slowest->r, "run_s"))) slowest = &rr;
  }
  check_own_files(out_dir);  // a manifest or seeds file that is a FIFO or a link is refused, as a run refuses it
  const Manifest manifest(out_dir / "manifest.jsonl");  // reads every run's manifest; appends nothing
  const double total = batch_total(runs), done = static_cast<double>(manifest.size());
  add_earlier_images(manifest, ax, images);
  json per_host = json::array();
  for (const auto& [host, f] : hosts)
    per_host.push_back({{"host", host}, {"images_made", f.first}, {"run_s", f.second},
                        {"images_per_hour", f.second > 0 ? f.first * 3600 / f.second : 0.0}});
  json left_out = json::array();
  for (const auto& [name, why] : read.left_out) left_out.push_back({{"report", name}, {"why", why}});
  const RunReport& first = runs.front();
  return {{"batch", str(first.r, "batch")}, {"model", first.r.value("model", json())},
          {"device", first.r.value("device", json())}, {"started", str(first.r, "started")},
          {"merged", {{"reports", runs.size()}, {"written", utc_now_iso8601()}, {"left_out", left_out}}},
          {"images_total", total}, {"images_done", done}, {"images_made", made},
          {"images_skipped", 0}, {"images_failed", failed},
          {"images_not_started", std::max(0.0, total - done - failed)}, {"run_s", night_end},
          {"images_per_hour", night_end > 0 ? made * 3600 / night_end : 0.0}, {"peak_memory_bytes", peak},
          {"runs", rows}, {"hosts", per_host},
          {"slowest_run", {{"report", slowest->name}, {"run_s", num(slowest->r, "run_s")}}},
          {"devices", devices}, {"images", images}, {"failures", failures}};
}

void check_shard_batch(const fs::path& out_dir, const std::string& batch_path) {
  std::error_code ec;
  if (!fs::is_directory(out_dir, ec)) return;
  // An unreadable report is left out (this run may be the one to replace it); the others are checked.
  const RunReports reports = read_run_reports(out_dir, /*strict=*/false, /*none_ok=*/true);
  for (const RunReport& rr : reports.runs) {
    const std::string other = str(rr.r, "batch");
    if (other.empty() || other == batch_path || fs::equivalent(other, batch_path, ec)) continue;
    throw UsageError(out_dir.string() + " holds runs of batch file '" + other + "' (" + rr.name +
                     "); this shard run is of '" + batch_path + "': give each batch file its own --out folder");
  }
}

bool array_is_finished(const fs::path& out_dir, int index, int count) {
  std::error_code ec;
  for (int k = 0; k < count; ++k)
    if (!fs::exists(out_dir / ("report-shard-" + std::to_string(k) + "-of-" + std::to_string(count) + ".json"), ec))
      return false;
  const std::string self = std::to_string(index) + "/" + std::to_string(count);
  for (const std::string& held : held_shard_locks(out_dir))
    if (held != self) return false;
  return true;
}

fs::path write_night_report(const fs::path& out_dir, const json& merged) {
  const fs::path path = out_dir / "report.json";
  write_file_atomic(path, merged.dump(2) + "\n");
  write_report_html(out_dir, merged, "report.html");
  return path;
}

}  // namespace sdxl
