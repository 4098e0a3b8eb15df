#include "scheduler/run_state.h"

#include "scheduler/detailer_progress.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace sdxl {

RunState::RunState(const BatchFile& b, const RunOptions& o, std::filesystem::path dir,
                   const std::vector<DeviceLane*>& devices)
    : batch(b),
      opts(o),
      out_dir(std::move(dir)),
      manifest(out_dir / manifest_file_name(o.shard_index, o.shard_count)),
      date(local_date()),
      started(utc_now_iso8601()),
      start_unix(unix_now()),
      t_run(RunClock::now()),
      queue(o.queue) {
  for (const auto& [id, error] : o.invalid_tasks) {
    ++res.total;
    ++res.failed;
    rec.failures.push_back({{"task", id}, {"index", 0}, {"seed", 0}, {"error", "invalid task: " + error}});
    if (o.on_failure) o.on_failure({id, 0, 0, "invalid task: " + error});
  }
  WorkList wl = build_work(batch, {o.force, o.shard_index, o.shard_count, o.model_sources.unet_precision}, manifest, out_dir, date, start_unix);
  for (const auto& [task, base] : wl.drawn_seeds) manifest.record_base_seed(task, base);  // before any image
  work = std::move(wl.work);
  rec.skipped = std::move(wl.skipped);
  res.total += wl.total;
  res.skipped = wl.skipped_count;
  queue = make_queue(work, o.queue, start_unix);
  for (DeviceLane* d : devices) lanes.push_back(std::make_unique<LaneState>(*d, static_cast<int>(lanes.size())));
}

double RunState::elapsed() const { return std::chrono::duration<double>(RunClock::now() - t_run).count(); }

int RunState::alive_lanes() const {
  int n = 0;
  for (const auto& l : lanes) n += l->alive ? 1 : 0;
  return n;
}

bool RunState::anything_in_flight() const {
  if (detailing > 0) return true;  // a decode thread may still queue a detailer's region
  for (const auto& l : lanes)
    if (!l->in_flight.empty()) return true;
  return false;
}

std::string RunState::stop_reason_now() const {
  if (!fatal.empty()) return "output error";
  if (model_error) return "the model could not be loaded";
  if (alive_lanes() == 0) return "every device failed";
  if (opts.stop && opts.stop->load()) return "stopped by a signal";
  if (opts.max_runtime_s > 0 && elapsed() >= opts.max_runtime_s) return "--max-runtime reached";
  return "";
}

void RunState::record_failure(const WorkItem& w, const std::string& error) {
  // A detailer region's pass fails its image: recorded with the image's seed, the region named.
  const WorkItem& img = w.detailer ? w.detailer->base : w;
  const std::string why = w.detailer ? "detailer unit " + std::to_string(w.detailer->unit + 1) + " region " +
                                           std::to_string(w.detailer->next) + ": " + error
                                     : error;
  spdlog::error("{} failed: {}", image_label(img), why);
  rec.failures.push_back({{"task", img.task->id}, {"index", img.index}, {"seed", img.params.seed}, {"error", why},
                          {"attempts", w.attempts + 1}});
  ++res.failed;
  if (opts.on_failure) opts.on_failure({img.task->id, img.index, img.params.seed, why});
}

void RunState::progress(const std::string& file, std::uint64_t memory_bytes) {
  ProgressInfo pi;
  pi.total = res.total;
  pi.done = res.done;
  pi.skipped = res.skipped;
  pi.failed = res.failed;
  pi.elapsed_s = elapsed();
  const int finished = res.done + res.failed;
  if (finished > 0 && pi.elapsed_s > 0) {
    pi.images_per_minute = 60.0 * finished / pi.elapsed_s;
    const int left = res.total - res.skipped - finished;
    pi.eta_s = pi.elapsed_s / finished * std::max(0, left);
  }
  pi.memory_bytes = memory_bytes;
  pi.last_file = file;
  if (opts.status_extra) pi.extra = opts.status_extra();
  if (lanes.size() > 1) {  // per device: images made (and a device given up)
    std::string per;
    for (const auto& l : lanes)
      per += (per.empty() ? "" : " ") + l->device.name() + ":" + std::to_string(l->fig.images) + (l->alive ? "" : "(failed)");
    pi.extra = pi.extra.empty() ? per : per + " | " + pi.extra;
  }
  if (opts.on_progress) opts.on_progress(pi);
}

}  // namespace sdxl
