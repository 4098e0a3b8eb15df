#include "scheduler/lane_loops.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>

#include "core/error.h"
#include "scheduler/detailer_flow.h"
#include "scheduler/dispatcher.h"
#include "scheduler/failure_policy.h"
#include "scheduler/image_finish.h"

namespace sdxl {

namespace {

// Loads the lane's model when there is work for it. Returns false when the
// lane cannot go on (no work, or the model failed to load).
bool start_lane(RunState& run, LaneState& l) {
  {
    std::lock_guard lk(run.mu);
    if (run.queue.empty() && run.waiting.empty()) return false;
  }
  l.started = true;
  try {
    l.device.start();
  } catch (const std::exception& e) {
    std::lock_guard lk(run.mu);
    if (run.alive_lanes() > 1) {
      fail_lane(run, l, std::string("could not start: ") + e.what());
    } else {
      l.alive = false;
      if (!run.model_error) run.model_error = std::current_exception();
      run.cv.notify_all();
    }
    return false;
  }
  return true;
}

// Peak and fragmentation of a stage, measured when the batch ran alone (mu held).
void note_stage_memory(LaneState& l, const InFlightBatch& b, const MemorySnapshot& m, std::uint64_t& peak,
                       std::uint64_t& frag) {
  if (b.alone && m.peak_allocated > b.base_allocated) peak = m.peak_allocated - b.base_allocated;
  frag = m.reserved > m.allocated ? m.reserved - m.allocated : 0;
  l.fig.peak_allocated = std::max(l.fig.peak_allocated, m.peak_allocated);
  l.fig.peak_reserved = std::max(l.fig.peak_reserved, m.peak_reserved);
}

}  // namespace

void encode_loop(RunState& run, LaneState& l) {
  while (true) {
    if (!l.started && !start_lane(run, l)) break;
    BatchPtr b;
    {
      std::unique_lock lk(run.mu);
      b = next_batch(run, l, lk);
    }
    if (!b) break;
    if (b->lora_switch) {
      // The files load (read, hash, upload) while the earlier batches sample,
      // unless they did while the lane waited; the merge waits for them. A
      // bad file fails in encode below.
      load_ahead(l, b->picked.front().lora_set, b->params);
      std::unique_lock lk(run.mu);
      run.cv.wait(lk, [&] { return l.unsampled <= 1 || !l.alive; });
      if (!l.alive) {
        give_back(run, l, b);
        break;
      }
    }
    const double t0 = run.elapsed();
    if (!run_stage(run, l, b, "text", [&] { b->handle = l.device.encode(b->params); })) continue;
    b->text_s[0] = t0;
    b->text_s[1] = run.elapsed();
    l.to_sample.push(b);
  }
  l.to_sample.close();
}

void sample_loop(RunState& run, LaneState& l) {
  while (auto next = l.to_sample.pop()) {
    BatchPtr b = *next;
    {
      std::unique_lock lk(run.mu);
      // A batch that has not started sampling when the run stops (or its
      // device is given up) goes back to the queue: a rerun makes it.
      if (!l.alive || !run.stop_reason_now().empty()) {
        give_back(run, l, b);
        continue;
      }
      if (b->solo) run.cv.wait(lk, [&] { return l.active.empty() || !l.alive; });
      for (auto& a : l.active) a->alone = b->alone = false;
      l.active.push_back(b);
      if (b->alone) l.device.reset_peak();
    }
    const auto t0 = RunClock::now();
    const double start_s = run.elapsed();
    const double batch_timeout = b->timeout * b->n;
    StepHook hook = [t0, batch_timeout, timeout = b->timeout](int step, int total) {
      const double s = std::chrono::duration<double>(RunClock::now() - t0).count();
      if (batch_timeout > 0 && s > batch_timeout)
        throw TimeoutError("timed out after " + std::to_string(static_cast<int>(s)) + " s at step " +
                           std::to_string(step) + "/" + std::to_string(total) + " (limit " +
                           std::to_string(static_cast<int>(timeout)) + " s per image)");
    };
    if (!run_stage(run, l, b, "sample", [&] { b->handle = l.device.sample(b->handle, hook); })) continue;
    {
      std::lock_guard lk(run.mu);
      b->sample_s[0] = start_s;
      b->sample_s[1] = run.elapsed();
      if (const auto m = l.device.memory()) note_stage_memory(l, *b, *m, b->sample_peak, b->sample_frag);
      b->sampled = true;
      --l.unsampled;
      run.cv.notify_all();
    }
    l.to_decode.push(b);
  }
  l.to_decode.close();
}

namespace {

// The report's record of a finished batch (mu held).
nlohmann::json batch_record(const LaneState& l, const InFlightBatch& b, const MemorySnapshot& m) {
  nlohmann::json rec = {{"start_s", b.picked_s}, {"seconds", b.decode_s[1] - b.picked_s}, {"size", b.n},
                        {"group", b.picked.front().group}, {"device", l.device.name()},
                        {"text", {b.text_s[0], b.text_s[1]}}, {"sample", {b.sample_s[0], b.sample_s[1]}},
                        {"decode", {b.decode_s[0], b.decode_s[1]}}, {"measured_alone", b.alone},
                        {"reserved_bytes", m.reserved}, {"allocated_bytes", m.allocated}};
  if (b.alone) {
    rec["peak_work_bytes"] = std::max(b.sample_peak, b.decode_peak);
    rec["sample_peak_work_bytes"] = b.sample_peak;
    rec["decode_peak_work_bytes"] = b.decode_peak;
  }
  if (b.est_peak) rec["estimated_work_bytes"] = *b.est_peak;
  return rec;
}

// A batch is through its last stage: figures, estimates, report record, and
// one write job per image. Returns whether cached blocks are due for release
// (--release-every). mu held.
bool finish_batch(RunState& run, LaneState& l, const BatchPtr& bp, std::vector<GeneratedImage>& out,
                  std::vector<WriteJob>& jobs) {
  InFlightBatch& b = *bp;
  MemorySnapshot m;
  if (const auto snap = l.device.memory()) {
    m = *snap;
    note_stage_memory(l, b, m, b.decode_peak, b.decode_frag);
    l.fig.sample_peak = std::max(l.fig.sample_peak, b.sample_peak);
    l.fig.decode_peak = std::max(l.fig.decode_peak, b.decode_peak);
    l.fig.sample_frag = std::max(l.fig.sample_frag, b.sample_frag);
    l.fig.decode_frag = std::max(l.fig.decode_frag, b.decode_frag);
  }
  leave_lane(l, bp);
  l.failures_in_a_row = 0;
  ++run.res.batches;
  ++l.fig.batches;
  l.fig.images += b.n;
  const double text = b.text_s[1] - b.text_s[0], sample = b.sample_s[1] - b.sample_s[0],
               decode = b.decode_s[1] - b.decode_s[0];
  l.fig.text_total += text;
  l.fig.sample_total += sample;
  l.fig.decode_total += decode;
  l.fig.intervals.emplace_back(b.text_s[0], b.text_s[1]);
  l.fig.intervals.emplace_back(b.sample_s[0], b.sample_s[1]);
  l.fig.intervals.emplace_back(b.decode_s[0], b.decode_s[1]);
  run.rec.batches.push_back(batch_record(l, b, m));
  if (WorkEstimator* est = run.opts.estimator) {
    // Only a device with an allocator budget (CUDA) has a per-batch peak,
    // and only a batch that ran alone on it measures its own.
    int controlnets = 0;  // the estimates' key: the batch's most demanding image (as the dispatcher keys it)
    for (const GenerationParams& p : b.params) controlnets = std::max(controlnets, side_modules_key(p));
    if (m.limit > 0 && b.alone)
      est->observe_memory(b.est_w, b.est_h, b.n, std::max(b.sample_peak, b.decode_peak), b.sample_peak, controlnets);
    est->observe_time(b.est_w, b.est_h, b.n, b.params.front().steps, text + sample + decode, controlnets);
  }
  for (size_t k = 0; k < b.picked.size(); ++k) {
    WriteJob j;
    j.item = run.work[b.picked[k].handle];
    j.image = std::move(out[k]);
    j.start_s = b.picked_s;
    j.generate_s = text + sample + decode;
    j.batch_size = b.n;
    j.memory_bytes = m.allocated;
    j.device = l.device.name();
    jobs.push_back(std::move(j));
  }
  // Detailer passes (they may share a batch with inpainting tasks of the same settings).
  const auto passes = std::count_if(jobs.begin(), jobs.end(), [](const WriteJob& j) { return j.item.detailer != nullptr; });
  run.res.detailer_regions += static_cast<int>(passes);
  run.res.detailer_batches += passes > 0 ? 1 : 0;
  const auto regional = std::count_if(jobs.begin(), jobs.end(), [](const WriteJob& j) {
    return j.item.detailer == nullptr && j.item.params.has_regions();
  });
  run.res.panels_with_regions += static_cast<int>(regional);
  run.res.region_batches += regional > 0 ? 1 : 0;
  for (const auto& q : b.picked) {  // a finished pass's pixels live on in its job only
    WorkItem& w = run.work[q.handle];
    if (!w.detailer) continue;
    w.params.init_pixels.reset();
    w.params.mask_pixels.reset();
    w.detailer.reset();
  }
  for (const auto& j : jobs) run.detailing += detailer_involved(j.item) ? 1 : 0;
  run.images_since_release += b.n;
  run.cv.notify_all();
  if (run.opts.release_every > 0 && run.images_since_release >= run.opts.release_every) {
    run.images_since_release = 0;
    return true;
  }
  return false;
}

// The images of a finished batch that belong to a detailer take its next step (detectors on this
// thread, without mu): a region's pass is queued, a detailed image joins `jobs`, a failure is
// recorded; the others stay in `jobs` as they are.
void route_detailers(RunState& run, LaneState& l, std::vector<WriteJob>& jobs) {
  if (std::none_of(jobs.begin(), jobs.end(), [](const WriteJob& j) { return detailer_involved(j.item); })) return;
  std::vector<WorkItem> items;  // the jobs' own move to the detailers
  for (const auto& j : jobs) items.push_back(j.item);
  std::vector<DetailerOutcome> steps = advance_detailers(l.device, items, jobs);
  std::vector<WriteJob> keep;
  std::lock_guard lk(run.mu);
  for (size_t k = 0; k < jobs.size(); ++k) {
    DetailerOutcome& o = steps[k];
    if (!o.involved) {
      keep.push_back(std::move(jobs[k]));
      continue;
    }
    --run.detailing;
    if (o.pass) queue_detailer_pass(run, std::move(*o.pass));
    else if (o.done) {
      if (run.opts.estimator) observe_detailer_regions(*run.opts.estimator, *o.done);
      keep.push_back(std::move(*o.done));
    }
    else run.record_failure(items[k], o.error);
  }
  jobs = std::move(keep);
  run.cv.notify_all();
}

}  // namespace

void decode_loop(RunState& run, LaneState& l, WriterPool& writers) {
  while (auto next = l.to_decode.pop()) {
    BatchPtr b = *next;
    {
      std::lock_guard lk(run.mu);
      if (!l.alive) {
        give_back(run, l, b);
        continue;
      }
      for (auto& a : l.active)
        if (a != b) a->alone = b->alone = false;
      if (b->alone) l.device.reset_peak();
    }
    const double start_s = run.elapsed();
    std::vector<GeneratedImage> out;
    if (!run_stage(run, l, b, "decode", [&] {
          out = l.device.decode(b->handle);
          if (out.size() != b->params.size())
            throw TaskError("the generator returned " + std::to_string(out.size()) + " image(s) for a batch of " +
                            std::to_string(b->params.size()));
          for (size_t k = 0; k < out.size(); ++k)  // a detailer's image: after its last pass (detailer_flow)
            if (b->params[k].detailer.empty()) finish_image(l.device, b->params[k], out[k]);
        }))
      continue;
    b->handle.reset();
    std::vector<WriteJob> jobs;
    bool release = false;
    {
      std::lock_guard lk(run.mu);
      b->decode_s[0] = start_s;
      b->decode_s[1] = run.elapsed();
      release = finish_batch(run, l, b, out, jobs);
    }
    route_detailers(run, l, jobs);
    for (auto& j : jobs) writers.push(std::move(j));
    if (release) l.device.release_cached();
  }
}

void start_lane_threads(RunState& run, LaneState& lane, WriterPool& writers) {
  auto guarded = [&run, l = &lane](std::function<void()> body) {
    return [&run, l, body = std::move(body)] {
      try {
        body();
      } catch (...) {
        std::lock_guard lk(run.mu);
        if (!run.model_error) run.model_error = std::current_exception();
        l->alive = false;
        run.cv.notify_all();
      }
    };
  };
  lane.decode_thread = std::thread(guarded([&run, &lane, &writers] { decode_loop(run, lane, writers); }));
  lane.sample_thread = std::thread(guarded([&run, &lane] { sample_loop(run, lane); }));
  lane.encode_thread = std::thread(guarded([&run, &lane] { encode_loop(run, lane); }));
}

void join_lane_threads(LaneState& l) {
  l.encode_thread.join();
  l.to_sample.close();  // also after an unexpected exception in the encode thread
  l.sample_thread.join();
  l.to_decode.close();
  l.decode_thread.join();
}

}  // namespace sdxl
