// A lane's three stage loops, each on its own thread: text encode (which also
// takes batches from the dispatcher and switches LoRA sets), sampling (with
// the batch's timeout checked between steps) and decode (then the images go
// to the writers). Batches pass from one stage to the next through queues of
// one, so the decode of a batch and the text encode of the next overlap the
// sampling of the one between, and a lane holds at most three batches.
#pragma once

#include "scheduler/run_state.h"
#include "scheduler/writer_pool.h"

namespace sdxl {

void encode_loop(RunState& run, LaneState& l);
void sample_loop(RunState& run, LaneState& l);
void decode_loop(RunState& run, LaneState& l, WriterPool& writers);

// Starts the lane's three threads; an unexpected exception in one stops the
// run and is rethrown by run_batch (as run.model_error).
void start_lane_threads(RunState& run, LaneState& l, WriterPool& writers);
// Waits for the lane's threads (the encode thread ends first, then its queues close).
void join_lane_threads(LaneState& l);

}  // namespace sdxl
