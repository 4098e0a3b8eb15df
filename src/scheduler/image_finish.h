// The last step of every image, in a run and in `generate` alike: after its decode and, for a task
// with a "detailer", after the last region's pass, its frame ("upscale") is made. No stage makes it
// (the decode leaves every image as decoded), so an image's frame comes from one place whatever
// path the image took. torch-free.
#pragma once

#include "batch/generation_params.h"
#include "pipeline/generator.h"
#include "scheduler/device_lane.h"

namespace sdxl {

// Brings `image` (made with `params`) to its frame on `lane` (no-op without "upscale"). Throws what the
// lane throws (an upscaler folder that does not load: the image fails).
void finish_image(DeviceLane& lane, const GenerationParams& params, GeneratedImage& image);

}  // namespace sdxl
