#include "scheduler/failure_policy.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace sdxl {

void leave_lane(LaneState& l, const BatchPtr& b) {
  l.in_flight.erase(std::remove(l.in_flight.begin(), l.in_flight.end(), b), l.in_flight.end());
  l.active.erase(std::remove(l.active.begin(), l.active.end(), b), l.active.end());
  if (!b->sampled) {
    b->sampled = true;
    --l.unsampled;
  }
}

void give_back(RunState& run, LaneState& l, const BatchPtr& b) {
  leave_lane(l, b);
  run.queue.requeue(b->picked);
  run.cv.notify_all();
}

void fail_lane(RunState& run, LaneState& l, const std::string& why) {
  if (!l.alive) return;
  l.alive = false;
  l.failure = why;
  ++run.res.devices_failed;
  run.rec.device_events.push_back(
      {{"device", l.device.name()}, {"at_s", run.elapsed()}, {"event", "given up"}, {"reason", why}});
  spdlog::error("device {} given up: {}; its images go back to the queue{}", l.device.name(), why,
                run.alive_lanes() > 0 ? " for the other devices" : "");
  run.cv.notify_all();
}

namespace {

// Out of memory: smaller batches of the group from now on. Returns whether the
// batch went back to the queue (it had more than one image).
bool halve_after_oom(RunState& run, LaneState& l, const BatchPtr& b, const std::string& error) {
  ++run.res.oom_recoveries;
  ++l.fig.oom;
  if (l.overlap && run.opts.overlap)
    spdlog::warn("{}: out of memory with batches overlapping; one batch at a time from now on", l.device.name());
  l.overlap = false;
  const std::string& group = b->picked.front().group;
  if (b->n > 1) {
    const int smaller = std::max(1, b->n / 2);
    run.oom_cap[group] = smaller;
    spdlog::warn("out of device memory with {} image(s) of {}; freed cached blocks, retrying {} at a time", b->n, group,
                 smaller);
    run.queue.requeue(b->picked);
    return true;
  }
  spdlog::warn("out of device memory with a single image of {}: {}", group, error);
  return false;
}

// A single image failed: retried after a backoff while it has attempts left.
void retry_or_record(RunState& run, const BatchPtr& b, const StageFailure& f) {
  for (const auto& q : b->picked) {
    WorkItem& w = run.work[q.handle];
    if (f.retryable && w.attempts < run.opts.retries) {
      ++w.attempts;
      ++run.res.retries;
      const double wait = run.opts.retry_backoff_s * std::pow(2.0, w.attempts - 1);
      w.not_before_s = run.elapsed() + wait;
      spdlog::warn("{} failed (attempt {} of {}): {}; retrying in {:.1f} s", image_label(w), w.attempts,
                   run.opts.retries + 1, f.error, wait);
      run.waiting.push_back(q);
    } else {
      run.record_failure(w, f.error);
    }
  }
}

}  // namespace

bool on_failure(RunState& run, LaneState& l, const BatchPtr& b, const StageFailure& f) {
  leave_lane(l, b);
  ++run.res.batches;
  ++l.fig.failed_batches;
  run.rec.batches.push_back({{"start_s", b->picked_s}, {"size", b->n}, {"group", b->picked.front().group},
                             {"device", l.device.name()}, {"error", f.error}});
  run.cv.notify_all();
  ++l.failures_in_a_row;
  const bool give_up = l.alive && (f.device_lost || (run.alive_lanes() > 1 && l.failures_in_a_row >= run.opts.lane_failures));
  if (give_up) {
    fail_lane(run, l, f.device_lost ? f.error
                                    : std::to_string(l.failures_in_a_row) + " failed batches in a row, the last: " + f.error);
    if (run.alive_lanes() > 0) {
      run.queue.requeue(b->picked);
      return false;
    }
  }
  if (f.oom && halve_after_oom(run, l, b, f.error)) return true;
  if (b->n > 1) {
    spdlog::warn("a batch of {} failed ({}); running its images one at a time to find which", b->n, f.error);
    for (auto q : b->picked) {
      q.group += "|alone#" + std::to_string(q.handle);
      run.queue.requeue({q});
    }
    return f.oom;
  }
  retry_or_record(run, b, f);
  return f.oom;
}

namespace {

// A model that cannot be loaded or run: another device takes the batch, or
// the run stops with the error.
void on_model_error(RunState& run, LaneState& l, const BatchPtr& b, const ModelError& e) {
  std::lock_guard lk(run.mu);
  leave_lane(l, b);
  run.queue.requeue(b->picked);
  if (run.alive_lanes() > 1) {
    fail_lane(run, l, std::string("the model: ") + e.what());
  } else {
    if (!run.model_error) run.model_error = std::current_exception();
    run.cv.notify_all();
  }
}

// Errors the libraries raise as plain messages.
StageFailure from_message(std::string error) {
  StageFailure f;
  f.oom = is_out_of_memory_message(error);
  f.device_lost = !f.oom && is_device_lost_message(error);
  f.error = std::move(error);
  return f;
}

}  // namespace

bool run_stage(RunState& run, LaneState& l, const BatchPtr& b, const char* stage, const std::function<void()>& body) {
  StageFailure f;
  try {
    body();
    return true;
  } catch (const OutOfMemoryError& e) {
    f.error = e.what();
    f.oom = true;
  } catch (const TimeoutError& e) {
    f.error = e.what();
    f.retryable = false;
  } catch (const ModelError& e) {
    on_model_error(run, l, b, e);
    return false;
  } catch (const UsageError& e) {  // settings this model cannot do: retrying will not help
    f.error = e.what();
    f.retryable = false;
  } catch (const Error& e) {
    f = from_message(e.what());
  } catch (const std::exception& e) {  // anything else from the device libraries: this batch fails, not the run
    f = from_message(std::string("unexpected error: ") + e.what());
  }
  spdlog::debug("{}: {} stage of a batch of {} failed: {}", l.device.name(), stage, b->n, f.error);
  bool release = false;
  {
    std::lock_guard lk(run.mu);
    release = on_failure(run, l, b, f);
  }
  if (release && l.alive) l.device.release_cached();
  return false;
}

}  // namespace sdxl
