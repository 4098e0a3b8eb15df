#include "scheduler/night_report.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <map>
#include <regex>
#include <set>

#include "batch/manifest.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/run_lock.h"
#include "report/report_html.h"

namespace sdxl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct RunReport {
  std::string name;  // file name in the folder
  json r;
  double start = 0;  // Unix seconds of "started"
};

// "2026-12-04T16:54:39Z" -> Unix seconds (0 when it does not parse).
double unix_of(const std::string& iso) {
  std::tm tm{};
  if (std::sscanf(iso.c_str(), "%d-%d-%dT%d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                  &tm.tm_sec) != 6)
    return 0;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<double>(timegm(&tm));
}

double num(const json& j, const char* key) { return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0; }
std::string str(const json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

// The run reports of the folder, sorted by name (report.json only when it is not a merge).
std::vector<RunReport> read_run_reports(const fs::path& dir, bool none_ok = false) {
  static const std::regex shard_name(R"(report-shard-[0-9]+-of-[0-9]+\.json)");
  std::vector<RunReport> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name != "report.json" && !std::regex_match(name, shard_name)) continue;
    RunReport rr{name, {}, 0};
    try {
      rr.r = json::parse(read_input_file(e.path(), "a run report", 256u << 20));
    } catch (const json::exception& x) {
      throw IoError(e.path().string() + ": not a run report (" + x.what() + ")");
    }
    if (!rr.r.is_object()) throw IoError(e.path().string() + ": not a run report (not a JSON object)");
    if (name == "report.json" && rr.r.contains("merged")) continue;  // an earlier merge
    rr.start = unix_of(str(rr.r, "started"));
    out.push_back(std::move(rr));
  }
  if (ec) throw IoError(dir.string() + ": " + ec.message());
  if (out.empty() && !none_ok)
    throw UsageError(dir.string() + ": no report.json or report-shard-K-of-N.json: not the output folder of a run");
  std::sort(out.begin(), out.end(), [](const RunReport& a, const RunReport& b) { return a.name < b.name; });
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

// One row per run, and the run's images, failures and devices moved onto the night's time axis.
json run_row(const RunReport& rr, double night_start, json& images, json& failures, json& devices) {
  const double offset = rr.start > 0 && night_start > 0 ? rr.start - night_start : 0;
  const json shard = rr.r.value("shard", json::object());
  const std::string label = num(shard, "count") > 1 ? fmt_shard(shard) : "plain";
  for (json e : rr.r.value("images", json::array())) {
    if (e.contains("start_s") && e["start_s"].is_number()) e["start_s"] = e["start_s"].get<double>() + offset;
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
          {"started", str(rr.r, "started")}, {"start_s", offset},
          {"run_s", num(rr.r, "run_s")}, {"images_done", num(rr.r, "images_done")},
          {"images_skipped", num(rr.r, "images_skipped")}, {"images_failed", num(rr.r, "images_failed")},
          {"images_not_started", num(rr.r, "images_not_started")},
          {"images_per_hour", num(rr.r, "images_per_hour")}, {"stop_reason", rr.r.value("stop_reason", json())}};
}

// The images of the manifests that no merged report lists (made by a run whose report a later run of
// the same shard replaced): the contact sheet shows every image of the folder.
void add_earlier_images(const Manifest& manifest, json& images) {
  std::set<std::string> listed;
  for (const json& e : images)
    if (e.contains("file") && e["file"].is_string()) listed.insert(e["file"].get<std::string>());
  for (const ManifestEntry& m : manifest.entries())
    if (!listed.count(m.file))
      images.push_back({{"task", m.task}, {"index", m.index}, {"seed", m.seed}, {"file", m.file},
                        {"run", "an earlier run"}});
}

}  // namespace

json merge_run_reports(const fs::path& out_dir) {
  const std::vector<RunReport> runs = read_run_reports(out_dir);
  check_one_batch(runs);
  double night_start = 0, night_end = 0, made = 0, failed = 0, peak = 0;
  for (const auto& rr : runs) {
    if (rr.start > 0) night_start = night_start > 0 ? std::min(night_start, rr.start) : rr.start;
  }
  json images = json::array(), failures = json::array(), devices = json::array(), rows = json::array();
  std::map<std::string, std::pair<double, double>> hosts;  // host -> {images made, seconds of its runs}
  const RunReport* slowest = &runs.front();
  for (const auto& rr : runs) {
    rows.push_back(run_row(rr, night_start, images, failures, devices));
    const double end = rows.back()["start_s"].get<double>() + num(rr.r, "run_s");
    night_end = std::max(night_end, end);
    made += num(rr.r, "images_done");
    failed += num(rr.r, "images_failed");
    peak = std::max(peak, num(rr.r, "peak_memory_bytes"));
    auto& h = hosts[str(rr.r, "host")];
    h.first += num(rr.r, "images_done");
    h.second += num(rr.r, "run_s");
    if (num(rr.r, "run_s") > num(slowest->r, "run_s")) slowest = &rr;
  }
  const Manifest manifest(out_dir / "manifest.jsonl");  // reads every run's manifest; appends nothing
  const double total = batch_total(runs), done = static_cast<double>(manifest.size());
  add_earlier_images(manifest, images);
  json per_host = json::array();
  for (const auto& [host, f] : hosts)
    per_host.push_back({{"host", host}, {"images_made", f.first}, {"run_s", f.second},
                        {"images_per_hour", f.second > 0 ? f.first * 3600 / f.second : 0.0}});
  const RunReport& first = runs.front();
  return {{"batch", str(first.r, "batch")}, {"model", first.r.value("model", json())},
          {"device", first.r.value("device", json())}, {"started", str(first.r, "started")},
          {"merged", {{"reports", runs.size()}, {"written", utc_now_iso8601()}}},
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
  std::vector<RunReport> reports;
  try {
    reports = read_run_reports(out_dir, /*none_ok=*/true);
  } catch (const IoError&) {  // an unreadable report is this run's to replace, not a reason to stop
    return;
  }
  for (const RunReport& rr : reports) {
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
