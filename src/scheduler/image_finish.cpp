#include "scheduler/image_finish.h"

namespace sdxl {

void finish_image(DeviceLane& lane, const GenerationParams& params, GeneratedImage& image) {
  if (params.upscale.on()) lane.make_frame(params, image);
}

}  // namespace sdxl
