#include "scheduler/run_batch.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>

#include "batch/manifest.h"
#include "core/atomic_file.h"
#include "scheduler/lane_loops.h"
#include "scheduler/night_report.h"
#include "scheduler/output_folder.h"
#include "scheduler/run_report.h"
#include "scheduler/run_state.h"
#include "scheduler/work_list.h"
#include "scheduler/writer_pool.h"

namespace sdxl {

namespace fs = std::filesystem;

namespace {

// One device whose whole generation is one function, run as the sample stage;
// text and decode only hand it on.
class FunctionLane final : public DeviceLane {
 public:
  FunctionLane(const RunOptions& o, const GenerateBatchFn& generate) : o_(o), generate_(generate) {}
  std::string name() const override { return "device"; }
  StageHandle encode(const std::vector<GenerationParams>& ps) override {
    return std::make_shared<std::vector<GenerationParams>>(ps);
  }
  StageHandle sample(const StageHandle& h, const StepHook& hook) override {
    const auto& ps = *static_cast<const std::vector<GenerationParams>*>(h.get());
    return std::make_shared<std::vector<GeneratedImage>>(generate_(ps, hook));
  }
  std::vector<GeneratedImage> decode(const StageHandle& h) override {
    return std::move(*static_cast<std::vector<GeneratedImage>*>(h.get()));
  }
  std::optional<MemorySnapshot> memory() override {
    if (!o_.device.memory) return std::nullopt;
    return o_.device.memory();
  }
  void reset_peak() override {
    if (o_.device.reset_peak) o_.device.reset_peak();
  }
  void release_cached() override {
    if (o_.device.release_cached) o_.device.release_cached();
  }
  std::string device_name() const override { return o_.device_name ? o_.device_name() : ""; }
  double load_seconds() const override { return o_.load_seconds ? o_.load_seconds() : 0.0; }
  LoraStats lora_stats() const override { return o_.lora_stats ? o_.lora_stats() : LoraStats{}; }

 private:
  const RunOptions& o_;
  const GenerateBatchFn& generate_;
};

// Not started: what is left in the queue or waiting for a retry, and why.
void count_not_started(RunState& run) {
  RunResult& res = run.res;
  res.not_started = static_cast<int>(run.queue.size() + run.waiting.size()) + run.dropped;
  if (res.not_started > 0 && res.stop_reason.empty()) {
    if (!run.fatal.empty()) res.stop_reason = "output error";
    else if (run.model_error) res.stop_reason = "the model could not be loaded";
    else if (run.alive_lanes() == 0) res.stop_reason = "every device failed";
    else res.stop_reason = "output error";
  }
  if (res.not_started > 0)
    spdlog::warn("{}: {} image(s) not started; rerun the same command to finish them", res.stop_reason, res.not_started);
}

// The output folder, created and made canonical, cleared of a killed run's temporary files.
fs::path prepare_output_folder(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError("cannot create output folder '" + dir.string() + "': " + ec.message());
  const fs::path out_dir = fs::canonical(dir);
  check_own_files(out_dir);
  if (const int n = remove_stale_temp_files(out_dir); n > 0)
    spdlog::info("removed {} temporary file(s) left by an interrupted run", n);
  return out_dir;
}

}  // namespace

RunResult run_batch(const BatchFile& batch, const RunOptions& o, const GenerateBatchFn& generate) {
  FunctionLane lane(o, generate);
  return run_batch(batch, o, std::vector<DeviceLane*>{&lane});
}

RunResult run_batch(const BatchFile& batch, const RunOptions& o, const std::vector<DeviceLane*>& devices) {
  if (devices.empty()) throw UsageError("run_batch: no device");
  // Temporary names say which shard wrote them (core/atomic_file.h).
  set_temp_file_tag(o.shard_count > 1 ? "shard-" + std::to_string(o.shard_index) + "-of-" + std::to_string(o.shard_count)
                                      : "");
  if (o.shard_count > 1) check_shard_batch(o.out_dir, batch.path.string());  // before anything is written
  else if (!o.force) check_plain_run_batch(o.out_dir, batch.path.string());
  RunState run(batch, o, prepare_output_folder(o.out_dir), devices);
  if (run.manifest.torn_lines() > 0)
    spdlog::warn("{}: ignored {} torn line(s) left by an interrupted run", run.manifest.path().string(),
                 run.manifest.torn_lines());
  spdlog::info("{} image(s): {} to generate, {} already done{}", run.res.total, run.work.size(), run.res.skipped,
               o.shard_count > 1 ? " (shard " + std::to_string(o.shard_index) + "/" + std::to_string(o.shard_count) + ")" : "");
  {
    WriterPool writers(run, o.writer_threads);
    for (auto& l : run.lanes) start_lane_threads(run, *l, writers);
    for (auto& l : run.lanes) join_lane_threads(*l);
    writers.finish();
  }
  count_not_started(run);
  if (run.model_error && run.res.done + run.res.failed == 0 && run.lanes.size() == 1) std::rethrow_exception(run.model_error);
  const double run_s = run.elapsed();
  RunResult res = run.res;
  res.report_path = write_run_report(run, run_s);
  if (o.shard_count > 1 && array_is_finished(run.out_dir, o.shard_index, o.shard_count)) {
    try {  // the last shard to finish writes the night's report.json of every run in the folder
      spdlog::info("the array's last shard: the folder's report {}", write_night_report(run.out_dir, merge_run_reports(run.out_dir)).string());
    } catch (const std::exception& e) {  // each shard's own report is written; `sdxl-batch report` can redo this
      spdlog::warn("could not write the folder's report: {}", e.what());
    }
  }
  spdlog::info("done: {} generated, {} already done, {} failed, {} not started of {}; {} batch(es); {:.1f} s; report {}",
               res.done, res.skipped, res.failed, res.not_started, res.total, res.batches, run_s,
               res.report_path.string());
  if (!run.fatal.empty()) throw IoError(run.fatal);
  if (run.model_error) std::rethrow_exception(run.model_error);
  return res;
}

namespace {

// The region passes of one task's `images` images (params: its first image's): per unit the regions
// per image measured before (capped by the unit's "max"), each pass timed as an image of the decoded
// size at the unit's steps (an only-masked inpainting, batch of one).
PlannedDetailer plan_detailer(const std::string& task, const GenerationParams& p, int images,
                              const WorkEstimator* est) {
  PlannedDetailer d;
  d.task = task;
  d.images = images;
  double regions = 0, seconds = 0;
  bool timed = true;
  const auto [w, h] = decoded_size(p);
  for (const DetailerUse& u : p.detailer) {
    d.detectors.push_back(u.detector);
    std::optional<double> per = est ? est->detailer_regions_per_image(u.detector) : std::nullopt;
    if (per && u.max > 0) per = std::min(*per, static_cast<double>(u.max));
    d.regions_per_image.push_back(per.value_or(-1.0));
    if (!per) {
      regions = -1;
      continue;
    }
    if (regions >= 0) regions += *per * images;
    const auto t = est->seconds_per_image(w, h, 1, u.steps > 0 ? u.steps : p.steps, 0);
    if (t) seconds += *per * images * t->seconds_per_image;
    else timed = false;
  }
  d.est_regions = regions;
  d.est_seconds = regions >= 0 && timed ? seconds : -1;
  return d;
}

// Each task with a detailer among the work, in the order of its first image.
void plan_detailers(const WorkList& wl, const WorkEstimator* est, BatchPlan& plan) {
  std::vector<std::string> order;
  std::map<std::string, std::pair<const WorkItem*, int>> tasks;  // id -> first image, images
  for (const WorkItem& w : wl.work) {
    if (w.params.detailer.empty()) continue;
    auto [it, fresh] = tasks.try_emplace(w.task->id, &w, 0);
    if (fresh) order.push_back(w.task->id);
    ++it->second.second;
  }
  for (const std::string& id : order) {
    const auto& [w, n] = tasks[id];
    plan.detailers.push_back(plan_detailer(id, w->params, n, est));
    plan.detailer_unknown |= plan.detailers.back().est_seconds < 0;
  }
}

}  // namespace

BatchPlan plan_batch(const BatchFile& batch, const RunOptions& o, std::uint64_t free_bytes) {
  BatchPlan plan;
  plan.free_bytes = free_bytes;
  std::error_code ec;
  const fs::path out_dir = fs::exists(o.out_dir, ec) ? fs::canonical(o.out_dir) : o.out_dir;
  const Manifest manifest(out_dir / "manifest.jsonl");  // read only: nothing is created
  const double start_unix = unix_now();
  WorkList wl = build_work(batch, {o.force, o.shard_index, o.shard_count, o.model_sources.unet_precision}, manifest, out_dir, local_date(), start_unix);
  plan.total = wl.total;
  plan.skipped = wl.skipped_count;
  plan.to_make = static_cast<int>(wl.work.size());
  TaskQueue queue = make_queue(wl.work, o.queue, start_unix);
  double clock = 0, total_s = 0;
  std::string plan_lora;
  bool all_timed = true;
  while (!queue.empty()) {
    auto admit = [&](const QueuedImage& head, int available) {
      const GenerationParams& p = wl.work[head.handle].params;
      if (!o.estimator || free_bytes == UINT64_MAX) return available;  // no budget given: --max-batch decides
      return o.estimator->max_batch(p.hires_on() ? p.hires_width() : p.width, p.hires_on() ? p.hires_height() : p.height,
                                    available, free_bytes, o.safety, side_modules_key(p));
    };
    const auto picked = queue.pop_batch(clock, plan_lora, admit);
    plan_lora = picked.front().lora_set;
    const WorkItem& w0 = wl.work[picked.front().handle];
    PlannedBatch pb;
    pb.group = picked.front().group;
    pb.width = w0.params.width;
    pb.height = w0.params.height;
    pb.steps = w0.params.steps;
    pb.priority = priority_name(w0.priority);
    int cns = 0;  // the estimates' key: the batch's most demanding image (regions differ within a batch)
    for (const auto& q : picked) {
      const GenerationParams& p = wl.work[q.handle].params;
      pb.images.push_back(image_label(wl.work[q.handle]));
      pb.regions = std::max(pb.regions, static_cast<int>(p.regions.size()));
      cns = std::max(cns, side_modules_key(p));
    }
    const int n = static_cast<int>(picked.size());
    const int est_w = w0.params.hires_on() ? w0.params.hires_width() : pb.width;
    const int est_h = w0.params.hires_on() ? w0.params.hires_height() : pb.height;
    if (o.estimator) {
      if (const auto m = o.estimator->peak_bytes(est_w, est_h, n, cns)) pb.est_peak_bytes = static_cast<std::int64_t>(*m);
      if (const auto t = o.estimator->seconds_per_image(est_w, est_h, n, pb.steps, cns)) {
        pb.est_seconds = t->seconds_per_image * n;
        pb.time_measured = t->measured;
      }
    }
    if (pb.est_seconds < 0) all_timed = false;
    else total_s += pb.est_seconds;
    clock += pb.est_seconds > 0 ? pb.est_seconds : 0;
    plan.batches.push_back(std::move(pb));
  }
  plan_detailers(wl, o.estimator, plan);
  for (const PlannedDetailer& d : plan.detailers) total_s += std::max(0.0, d.est_seconds);
  plan.est_seconds = all_timed ? total_s : -1;
  return plan;
}

}  // namespace sdxl
