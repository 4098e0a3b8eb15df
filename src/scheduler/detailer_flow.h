// The detailer in a run (docs/detailer.md): an image of a task with a "detailer" does not go to the
// writers after its decode. Its first unit's detector runs on the lane (decode thread), and each
// region found becomes a work item of its own — an only-masked inpainting of the image in memory —
// that goes through the queue like any image, so regions of different panels with the same settings
// share UNet calls. When region j's pass is decoded, the image is updated and region j + 1 is queued
// (then the next unit's detector runs on the result); after the last, the frame is made and the
// detailed image is written. torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "scheduler/detailer_progress.h"
#include "scheduler/run_state.h"
#include "scheduler/write_job.h"

namespace sdxl {

// What comes of one image of a decoded batch.
struct DetailerOutcome {
  bool involved = false;        // false: not a detailer's image (written as it is)
  std::optional<WorkItem> pass; // the next region's pass, to queue
  std::optional<WriteJob> done; // the detailed image, to write
  std::string error;            // the detailer failed: the image fails
};

// Whether `w` is a region pass or an image whose task has a detailer.
bool detailer_involved(const WorkItem& w);

// For each image of a decoded batch (`items` its work items, `base` the write job each would get):
// the detailer's next step. Runs detectors and frames on `lane` (the decode thread; run.mu not held).
std::vector<DetailerOutcome> advance_detailers(DeviceLane& lane, const std::vector<WorkItem>& items,
                                               std::vector<WriteJob>& base);

// The detailer of one image made outside a run (`sdxl-batch generate`): the steps advance_detailers
// takes for it, in the same order on `lane` (detector, each region's pass, the next unit, the frame), each pass made alone: the image a run at --max-batch 1 writes for the same task and seed.
// `params`: the image's (its detailer units); `image`: its decode. boxes (when given): each region
// passed, as the report records them. Throws what the lane's stages throw.
GeneratedImage detail_image(DeviceLane& lane, const GenerationParams& params, GeneratedImage image,
                            nlohmann::json* boxes = nullptr);

// Each unit's regions in a detailed image (`done`: advance_detailers' outcome, its boxes), observed
// by `est` so that --dry-run plans the region passes of the next run (mu held).
void observe_detailer_regions(WorkEstimator& est, const WriteJob& done);

// Queues a region's pass (mu held): a new work item and its queue entry.
void queue_detailer_pass(RunState& run, WorkItem pass);

}  // namespace sdxl
