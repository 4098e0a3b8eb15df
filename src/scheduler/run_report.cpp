#include "scheduler/run_report.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "core/atomic_file.h"
#include "report/report_html.h"
#include "scheduler/run_state.h"

namespace sdxl {

std::pair<double, double> busy_and_overlap(std::vector<std::pair<double, double>> iv) {
  std::vector<std::pair<double, int>> ev;
  for (const auto& [a, b] : iv)
    if (b > a) {
      ev.emplace_back(a, +1);
      ev.emplace_back(b, -1);
    }
  std::sort(ev.begin(), ev.end());
  double busy = 0, overlap = 0, last = 0;
  int open = 0;
  for (const auto& [t, d] : ev) {
    if (open >= 1) busy += t - last;
    if (open >= 2) overlap += t - last;
    open += d;
    last = t;
  }
  return {busy, overlap};
}

namespace {

// Totals over the devices, for the report's top level.
struct DeviceTotals {
  double load_s = 0;
  std::string device_names;
  std::uint64_t peak_allocated = 0, peak_reserved = 0, max_fragmentation = 0, limit = 0;
  LoraStats lora;
  bool any_lora = false;
};

void add_lora_stats(LoraStats& total, const LoraStats& s) {
  total.hits += s.hits;
  total.misses += s.misses;
  total.evictions += s.evictions;
  total.bytes_held += s.bytes_held;
  total.budget_bytes += s.budget_bytes;
  total.switches += s.switches;
  total.load_s += s.load_s;
  total.hash_s += s.hash_s;
  total.merge_s += s.merge_s;
}

nlohmann::json memory_record(const LaneFigures& f, const MemorySnapshot& now) {
  return {{"weights_bytes", f.weights_bytes}, {"peak_allocated_bytes", f.peak_allocated},
          {"peak_reserved_bytes", f.peak_reserved}, {"limit_bytes", now.limit},
          {"regions", {{"sample", {{"peak_work_bytes", f.sample_peak}, {"max_fragmentation_bytes", f.sample_frag}}},
                       {"decode", {{"peak_work_bytes", f.decode_peak}, {"max_fragmentation_bytes", f.decode_frag}}}}}};
}

// One device's record (devices[]); adds its figures to `t`.
nlohmann::json device_record(const LaneState& l, double run_s, DeviceTotals& t) {
  const LaneFigures& f = l.fig;
  const bool used = l.started && f.batches + f.failed_batches > 0;
  const double ls = used ? l.device.load_seconds() : 0.0;
  t.load_s = std::max(t.load_s, ls);
  const std::string dn = used ? l.device.device_name() : "";
  if (!dn.empty()) t.device_names += (t.device_names.empty() ? "" : ", ") + dn;
  const auto [busy, overlap] = busy_and_overlap(f.intervals);
  const double span = std::max(run_s - ls, 1e-9);
  MemorySnapshot now;
  if (used && l.alive) now = l.device.memory().value_or(MemorySnapshot{});
  t.limit = std::max(t.limit, now.limit);
  t.peak_allocated = std::max(t.peak_allocated, f.peak_allocated);
  t.peak_reserved = std::max(t.peak_reserved, f.peak_reserved);
  t.max_fragmentation = std::max({t.max_fragmentation, f.sample_frag, f.decode_frag});
  nlohmann::json d = {{"name", l.device.name()}, {"device", dn}, {"images", f.images}, {"batches", f.batches},
                      {"failed_batches", f.failed_batches}, {"oom", f.oom}, {"failed", !l.failure.empty()},
                      {"load_s", ls}, {"text_s", f.text_total}, {"sample_s", f.sample_total},
                      {"decode_s", f.decode_total}, {"busy_s", busy}, {"overlap_s", overlap},
                      {"busy_fraction", busy / span}, {"images_per_hour", f.images * 3600.0 / span},
                      {"memory", memory_record(f, now)}};
  if (!l.failure.empty()) d["failure"] = l.failure;
  if (const auto counters = l.device.engine_counters(); !counters.empty()) d["engine"] = counters;
  if (const LoraStats s = l.device.lora_stats(); s.hits + s.misses > 0) {
    t.any_lora = true;
    d["memory"]["regions"]["lora_cache"] = {{"bytes_held", s.bytes_held}, {"budget_bytes", s.budget_bytes}};
    add_lora_stats(t.lora, s);
  }
  if (used)
    spdlog::info("{}: {} image(s) in {} batch(es); busy {:.0f}% of the run, stages overlapping {:.1f} s{}",
                 l.device.name(), f.images, f.batches, 100.0 * busy / span, overlap,
                 l.failure.empty() ? "" : "; given up: " + l.failure);
  return d;
}

nlohmann::json lora_record(const LoraStats& ls) {
  spdlog::info("LoRA cache: {} hits, {} misses, {} evictions, {:.1f} MiB held of {:.1f} MiB; {} switches, load {:.2f} s, merge {:.2f} s",
               ls.hits, ls.misses, ls.evictions, ls.bytes_held / 1048576.0, ls.budget_bytes / 1048576.0, ls.switches,
               ls.load_s, ls.merge_s);
  return {{"hits", ls.hits}, {"misses", ls.misses}, {"evictions", ls.evictions}, {"bytes_held", ls.bytes_held},
          {"budget_bytes", ls.budget_bytes}, {"switches", ls.switches}, {"load_s", ls.load_s},
          {"hash_s", ls.hash_s}, {"merge_s", ls.merge_s}};
}

nlohmann::json report_json(const RunState& run, const DeviceTotals& t, const nlohmann::json& devices, double run_s) {
  const RunOptions& o = run.opts;
  const RunResult& res = run.res;
  // The model loads inside the run (in parallel on several devices); the rate counts the time after it.
  const double make_s = std::max(run_s - t.load_s, 1e-9);
  return {{"batch", run.batch.path.string()},
          {"model", o.model_name},
          {"unet_precision", o.model_sources.unet_precision.empty() ? "default" : o.model_sources.unet_precision},
          {"device", t.device_names},
          {"started", run.started},
          {"host", this_temp_file_owner().host},
          {"shard", {{"index", o.shard_index}, {"count", o.shard_count}}},
          {"images_total", res.total},
          {"images_done", res.done},
          {"images_skipped", res.skipped},
          {"images_failed", res.failed},
          {"images_not_started", res.not_started},
          {"stop_reason", res.stop_reason},
          {"load_s", t.load_s},
          {"run_s", run_s},
          {"images_per_hour", res.done * 3600.0 / make_s},
          {"peak_memory_bytes", t.peak_allocated},
          {"memory", {{"peak_allocated_bytes", t.peak_allocated},
                      {"peak_reserved_bytes", t.peak_reserved},
                      {"max_fragmentation_bytes", t.max_fragmentation},
                      {"limit_bytes", t.limit},
                      {"allocator", o.allocator ? o.allocator() : std::string()},
                      {"safety_factor", o.safety}}},
          {"queue", {{"batches", res.batches},
                     {"max_batch", o.queue.max_batch},
                     {"aging_s", o.queue.aging_s},
                     {"oom_recoveries", res.oom_recoveries},
                     {"retries", res.retries},
                     {"deadlines_missed", res.deadlines_missed}}},
          {"detailer", {{"regions", res.detailer_regions}, {"batches", res.detailer_batches}}},
          {"regions", {{"panels", res.panels_with_regions}, {"batches", res.region_batches}}},
          {"pipeline", {{"overlap", o.overlap}}},
          {"devices", devices},
          {"device_events", run.rec.device_events},
          {"batches", run.rec.batches},
          {"deadline_misses", run.rec.deadline_misses},
          {"images", run.rec.images},
          {"skipped", run.rec.skipped},
          {"failures", run.rec.failures}};
}

}  // namespace

std::filesystem::path write_run_report(RunState& run, double run_s) {
  DeviceTotals totals;
  nlohmann::json devices = nlohmann::json::array();
  for (const auto& l : run.lanes) devices.push_back(device_record(*l, run_s, totals));
  nlohmann::json report = report_json(run, totals, devices, run_s);
  if (run.opts.status_extra) report["status"] = run.opts.status_extra();
  if (totals.any_lora) report["lora"] = lora_record(totals.lora);
  const std::filesystem::path path = run.out_dir / report_file_name(run.opts.shard_index, run.opts.shard_count);
  write_file_atomic(path, report.dump(2) + "\n");
  try {
    std::filesystem::path html = path;
    write_report_html(run.out_dir, report, html.replace_extension(".html").filename().string());
  } catch (const std::exception& e) {  // the page is a convenience; report.json is what counts
    spdlog::warn("could not write the HTML report: {}", e.what());
  }
  return path;
}

std::string report_file_name(int shard_index, int shard_count) {
  if (shard_count <= 1) return "report.json";
  return "report-shard-" + std::to_string(shard_index) + "-of-" + std::to_string(shard_count) + ".json";
}

}  // namespace sdxl
