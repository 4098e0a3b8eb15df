#include "scheduler/dispatcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>

namespace sdxl {

bool load_ahead(LaneState& l, const std::string& set, const std::vector<GenerationParams>& params) {
  if (!l.device.can_prefetch() || set == l.prefetched_lora) return false;
  l.prefetched_lora = set;
  try {
    l.device.prefetch(params);
  } catch (const std::exception& e) {
    spdlog::debug("{}: loading LoRAs ahead failed ({}); the text stage will say why", l.device.name(), e.what());
  }
  return true;
}

namespace {

// The size an image's memory and time are keyed by (hires: the output size).
int est_width(const GenerationParams& p) { return p.hires_on() ? p.hires_width() : p.width; }
int est_height(const GenerationParams& p) { return p.hires_on() ? p.hires_height() : p.height; }

// The queue head's LoRA set loads while the lane waits. Returns whether it
// loaded something (then the caller looks again: the queue may have changed).
bool prefetch_head(RunState& run, LaneState& l, std::unique_lock<std::mutex>& lk, double now) {
  if (!l.device.can_prefetch() || run.queue.empty()) return false;
  const QueuedImage head = run.queue.front(now, l.current_lora);
  if (head.lora_set == l.current_lora || head.lora_set == l.prefetched_lora) return false;
  const std::vector<GenerationParams> ps{run.work[head.handle].params};
  lk.unlock();
  load_ahead(l, head.lora_set, ps);
  lk.lock();
  return true;
}

// Waits a little for room: loads the next LoRA set ahead, or sleeps.
void wait_for_room(RunState& run, LaneState& l, std::unique_lock<std::mutex>& lk, double now) {
  if (!prefetch_head(run, l, lk, now)) run.cv.wait_for(lk, std::chrono::milliseconds(200));
}

// Retries whose backoff is over go back to the queue.
void requeue_due_retries(RunState& run, double now) {
  for (auto it = run.waiting.begin(); it != run.waiting.end();) {
    if (run.work[it->handle].not_before_s <= now) {
      run.queue.requeue({*it});
      it = run.waiting.erase(it);
    } else {
      ++it;
    }
  }
}

// The lane's memory budget for a new batch.
struct Room {
  bool budget = false;                     // a device with an allocator budget (not the CPU)
  bool unknown_in_flight = false;          // a batch in flight has no estimate
  std::uint64_t free_work = UINT64_MAX;    // bytes for the new batch's work
};

Room lane_room(RunState& run, LaneState& l, bool busy) {
  const std::optional<MemorySnapshot> snap = l.device.memory();
  const MemorySnapshot before = snap.value_or(MemorySnapshot{});
  if (!busy) l.base_allocated = before.allocated;
  if (l.fig.weights_bytes == 0) l.fig.weights_bytes = before.allocated;  // first look: the resident weights
  Room r;
  r.budget = run.opts.estimator && snap && before.limit > 0;
  // What the batches in flight may still need (one of them decodes while the new one samples).
  std::uint64_t reserve = 0;
  for (const auto& b : l.in_flight) {
    if (b->est_peak) reserve = std::max<std::uint64_t>(reserve, static_cast<std::uint64_t>(*b->est_peak * run.opts.safety));
    else r.unknown_in_flight = true;
  }
  if (r.budget) {
    const std::uint64_t limit_free = before.limit > l.base_allocated ? before.limit - l.base_allocated : 0;
    r.free_work = limit_free > reserve ? limit_free - reserve : 0;
  }
  return r;
}

// Deadlines that cannot be met any more are said once, early.
void warn_hopeless_deadlines(RunState& run, LaneState& l, const GenerationParams& head, double now) {
  if (!run.opts.estimator) return;
  const auto t = run.opts.estimator->seconds_per_image(est_width(head), est_height(head), 1, head.steps,
                                                              side_modules_key(head));
  if (!t) return;
  for (const auto& q : run.queue.newly_hopeless(now, l.current_lora, t->seconds_per_image / std::max(1, run.alive_lanes())))
    spdlog::warn("{}: its deadline {} can no longer be met (about {:.0f} s of work is ahead of it)",
                 image_label(run.work[q.handle]), run.work[q.handle].task->deadline, t->seconds_per_image);
}

// Takes the batch from the queue and puts it on the lane.
BatchPtr take_batch(RunState& run, LaneState& l, const Room& room, double now) {
  const RunOptions& o = run.opts;
  auto admit = [&](const QueuedImage& h, int available) {
    const GenerationParams& p = run.work[h.handle].params;
    int n = available;
    if (auto it = run.oom_cap.find(h.group); it != run.oom_cap.end()) n = std::min(n, it->second);
    if (room.budget) n = std::min(n, o.estimator->max_batch(est_width(p), est_height(p), n, room.free_work, o.safety,
                                                                     side_modules_key(p)));
    return n;
  };
  auto b = std::make_shared<InFlightBatch>();
  b->picked = run.queue.pop_batch(now, l.current_lora, admit);
  for (const auto& q : b->picked) b->params.push_back(run.work[q.handle].params);
  const GenerationParams& p0 = b->params.front();
  b->n = static_cast<int>(b->picked.size());
  b->est_w = est_width(p0);
  b->est_h = est_height(p0);
  int key = 0;  // the batch's most demanding image (panels with other region counts share it)
  for (const GenerationParams& p : b->params) key = std::max(key, side_modules_key(p));
  if (room.budget) b->est_peak = o.estimator->peak_bytes(b->est_w, b->est_h, b->n, key);
  b->solo = room.budget && !b->est_peak;
  b->lora_switch = b->picked.front().lora_set != l.current_lora;
  l.current_lora = b->picked.front().lora_set;
  for (const auto& q : b->picked) {  // timeout: the smallest per-image timeout of the batch
    const double t = run.work[q.handle].task->timeout_s > 0 ? run.work[q.handle].task->timeout_s : o.timeout_s;
    if (t > 0) b->timeout = b->timeout == 0 ? t : std::min(b->timeout, t);
  }
  b->picked_s = now;
  b->base_allocated = l.base_allocated;
  l.in_flight.push_back(b);
  ++l.unsampled;
  return b;
}

}  // namespace

BatchPtr next_batch(RunState& run, LaneState& l, std::unique_lock<std::mutex>& lk) {
  const RunOptions& o = run.opts;
  while (true) {
    if (!l.alive) return nullptr;
    if (const std::string why = run.stop_reason_now(); !why.empty()) {
      if (run.res.stop_reason.empty() && why != "every device failed") run.res.stop_reason = why;
      return nullptr;
    }
    const double now = run.elapsed();
    requeue_due_retries(run, now);
    if (run.queue.empty()) {
      if (run.waiting.empty() && !run.anything_in_flight()) {
        run.cv.notify_all();
        return nullptr;  // all done
      }
      run.cv.wait_for(lk, std::chrono::milliseconds(50));
      continue;
    }
    const bool busy = !l.in_flight.empty();
    const Room room = lane_room(run, l, busy);
    if (busy && (!o.overlap || !l.overlap || l.in_flight.size() >= 2 || (room.budget && room.unknown_in_flight))) {
      wait_for_room(run, l, lk, now);
      continue;
    }
    const GenerationParams& hp = run.work[run.queue.front(now, l.current_lora).handle].params;
    if (busy && room.budget) {
      const auto head_est = o.estimator->peak_bytes(est_width(hp), est_height(hp), 1, side_modules_key(hp));
      if (!head_est || static_cast<double>(*head_est) * o.safety > static_cast<double>(room.free_work)) {
        wait_for_room(run, l, lk, now);  // it runs when the lane is empty
        continue;
      }
    }
    warn_hopeless_deadlines(run, l, hp, now);
    return take_batch(run, l, room, now);
  }
}

}  // namespace sdxl
