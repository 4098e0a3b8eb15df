// The dispatcher: which batch a lane takes next, and when. A lane takes a
// batch only while it has room: at most two batches in flight (one sampling,
// one decoding), memory for the new batch's estimated peak (× safety) on top
// of what the batches in flight may still need, and a batch of a size never
// measured runs alone (and is measured). The batch is the queue's best image
// plus compatible ones, as many as the budget, --max-batch and an earlier
// out-of-memory allow. While a lane waits for room, the queue head's LoRA
// files load, so that the switch does not idle the device later.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "scheduler/run_state.h"

namespace sdxl {

// The next batch for lane `l` (null: nothing more for it: the run stops, the
// lane was given up, or everything is done). Waits (releasing `lk` on run.mu)
// while the lane has no room or retries are in backoff.
BatchPtr next_batch(RunState& run, LaneState& l, std::unique_lock<std::mutex>& lk);

// Loads the files of LoRA set `set` used by `params` ahead of its switch, once
// per set. Only the lane's text thread calls it, without run.mu. A bad file is
// reported by the text stage later. Returns whether it loaded.
bool load_ahead(LaneState& l, const std::string& set, const std::vector<GenerationParams>& params);

}  // namespace sdxl
