#include "model/task_size.h"

#include "core/error.h"

namespace sdxl {

std::string check_task_size(const ModelConfig& model, const GenerationParams& p) {
  check_generation_size(model, p.width, p.height, 1);
  std::string note = unchecked_size_note(model, p.width, p.height);
  if (!p.hires_on()) return note;
  try {
    check_generation_size(model, p.hires_width(), p.hires_height(), 1);
  } catch (const UsageError& e) {
    throw UsageError("hires fix to " + std::to_string(p.hires_width()) + "x" + std::to_string(p.hires_height()) +
                     " (scale " + format_number(p.hires.scale) + "): " + e.what());
  }
  if (note.empty()) note = unchecked_size_note(model, p.hires_width(), p.hires_height());
  return note;
}

std::string unmasked_task_on_inpainting_unet(const ModelConfig& model) {
  return "model '" + model.name + "' is an inpainting model (a 9-channel UNet, model.json /unet/in_channels " +
         std::to_string(model.unet_in_channels) + "): it only repaints the masked region of an init image, and " +
         "this task has no \"mask\" (give it \"init_image\" and \"mask\", or use a text-to-image model)";
}

}  // namespace sdxl
