// DeviceLane: what the scheduler needs from one device — the three pipeline
// stages and a few views for admission and the report. The real pipeline
// (GeneratorLane) and the tests' fakes implement it.
//
// Threads: start, encode and prefetch are called on the lane's text thread,
// sample on its sampling thread, decode on its decode thread, one call per
// stage at a time; the three stages of different batches run at once.
// encode of a batch whose LoRA set differs from the previous batch's is only
// called after every earlier batch's sample has returned (weights change).
// memory, reset_peak and release_cached may be called from any lane thread.
// A stage reports failures by throwing (OutOfMemoryError, TimeoutError from
// the step hook, ModelError, UsageError, TaskError); the scheduler decides.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "batch/generation_params.h"
#include "core/error.h"
#include "core/memory.h"
#include "lora/lora_stats.h"
#include "pipeline/generator.h"

namespace sdxl {

// A stage's opaque result, handed to the next stage.
using StageHandle = std::shared_ptr<void>;

class DeviceLane {
 public:
  virtual ~DeviceLane() = default;

  // "cuda:0", "cpu": the lane's name in the report and progress.
  virtual std::string name() const = 0;
  // Loads the model; called once, when there is work for the lane.
  virtual void start() {}

  //  1. text (and the LoRA switch); 2. sampling, `hook` between steps;
  //  3. decode: one image per params entry of the batch.
  virtual StageHandle encode(const std::vector<GenerationParams>& params) = 0;
  virtual StageHandle sample(const StageHandle& encoded, const StepHook& hook) = 0;
  virtual std::vector<GeneratedImage> decode(const StageHandle& sampled) = 0;

  // The detailer, on the decode thread (docs/detailer.md): the regions of one unit in an image. A lane
  // without a detector cannot detail. make_frame: an image's frame ("upscale"), its last step
  // (image_finish.h); a lane without an upscaler leaves the image as it is.
  virtual std::vector<DetailerRegion> detailer_regions(const DetailerUse& unit, const PixelImage& /*image*/,
                                                       std::string& /*model_name*/) {
    throw TaskError("device " + name() + " cannot run the detailer of '" + unit.detector + "'");
  }
  virtual void make_frame(const GenerationParams& /*p*/, GeneratedImage& /*image*/) {}

  // Loads a batch's LoRA files ahead of its encode, without changing weights
  // (safe while another batch samples). can_prefetch: whether prefetch does anything.
  virtual bool can_prefetch() const { return false; }
  virtual void prefetch(const std::vector<GenerationParams>& /*params*/) {}

  // Device memory now and since reset_peak; nullopt: no accounting (every
  // batch is admitted at the queue's size).
  virtual std::optional<MemorySnapshot> memory() { return std::nullopt; }
  virtual void reset_peak() {}
  // Returns the allocator's cached, unused blocks (after an out-of-memory).
  virtual void release_cached() {}

  // For the report, read after the lane's first batch.
  virtual std::string device_name() const { return ""; }
  virtual double load_seconds() const { return 0; }
  virtual LoraStats lora_stats() const { return {}; }
  // Named counters of the device's engine (devices[].engine), e.g. CUDA graph
  // captures and replays.
  virtual std::map<std::string, double> engine_counters() const { return {}; }
};

}  // namespace sdxl
