// The failure policy: what happens to a batch whose stage threw, and to a
// device that keeps failing. All functions need run.mu held, except
// run_stage, which takes it.
//  - out of memory: the lane stops overlapping batches; a batch of n > 1 goes
//    back to the queue and its group is capped at n/2 (the caller frees the
//    allocator's cached blocks); a single image is a task failure;
//  - a failed batch of several images is split: each image runs alone (not
//    counted as a retry), so one image's problem stays with its owner;
//  - a single image is retried `retries` times with exponential backoff
//    (not for timeouts or settings the model cannot do), then recorded;
//  - a device that is lost (a sticky CUDA error), or fails `lane_failures`
//    batches in a row while another device works, is given up: the batch goes
//    back without an attempt and the other devices finish the run;
//  - a model that cannot load: another device takes the batch, or the run
//    stops and the error is rethrown by run_batch.
#pragma once

#include <functional>
#include <string>

#include "scheduler/run_state.h"

namespace sdxl {

// The batch is no longer on the lane (finished, failed or given back).
void leave_lane(LaneState& l, const BatchPtr& b);
// Puts a batch back without counting an attempt (its device was given up, or
// the run is stopping before it started sampling).
void give_back(RunState& run, LaneState& l, const BatchPtr& b);
// Gives the lane up for `why` (once), for the report and the log.
void fail_lane(RunState& run, LaneState& l, const std::string& why);

struct StageFailure {
  std::string error;
  bool oom = false, retryable = true, device_lost = false;
};
// Applies the policy to a batch whose stage failed. Returns whether the
// caller should release the device's cached blocks (after unlocking).
bool on_failure(RunState& run, LaneState& l, const BatchPtr& b, const StageFailure& f);

// Runs one stage of a batch and classifies what it throws; failures go to
// on_failure. Returns success.
bool run_stage(RunState& run, LaneState& l, const BatchPtr& b, const char* stage, const std::function<void()>& body);

}  // namespace sdxl
