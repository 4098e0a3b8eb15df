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

std::string regions_problem(const ModelConfig& model, const GenerationParams& p) {
  if (!p.has_regions()) return "";
  if (!model.unet_regions.supported())
    return "model '" + model.name + "' was exported before regional prompts (its unet.ts has no forward_regional "
           "methods and its model.json no unet.regions): export it again with scripts/export_sdxl.py (--max-regions N "
           "sets how many regions a panel may have)";
  if (p.regions.size() > static_cast<size_t>(model.unet_regions.max_regions))
    return "has " + std::to_string(p.regions.size()) + " regions; model '" + model.name + "' allows at most " +
           std::to_string(model.unet_regions.max_regions) +
           " (model.json unet.regions.max_regions: export it again with scripts/export_sdxl.py --max-regions N)";
  if (model.unet_precision == "fp8")
    return "has regions, which run on unet.ts's forward_regional methods; the FP8 UNet (unet_fp8.ts) has none: run "
           "it without --precision fp8";
  return "";
}

}  // namespace sdxl
