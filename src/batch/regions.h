// Regions of a panel (attention couple; docs/story-tools.md#regions): what the batch file, the
// manifest, the PNG's parameters and `generate`'s flags say of GenerationParams::regions. The
// weights the UNet mixes with are made on the device side (pipeline/region_weights.h). torch-free.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "batch/generation_params.h"

namespace sdxl {

// The most regions a panel may have without a model (model.json unet.regions.max_regions may allow
// fewer).
inline constexpr int kMaxRegions = 32;

// What is wrong with a box [x0, y0, x1, y1] in fractions of the panel ("" fine): a value outside
// 0..1 or not finite, or an empty box (x0 >= x1 or y0 >= y1).
std::string region_box_problem(double x0, double y0, double x1, double y1);

// A region mask of mask_w x mask_h against a panel of width x height: "" when it has the panel's
// aspect ratio within a pixel along either side (it is scaled, never cropped), else why not.
std::string region_mask_aspect_problem(int mask_w, int mask_h, int width, int height);

// The A1111 fields of a panel with regions (Regional Prompter's, where they mean the same, then one
// "Region N" field per region: its box or mask file and hash, weight, character, prompt, negative),
// each starting with ", "; "" without regions.
std::string regions_a1111_fields(const GenerationParams& p);

// A manifest line's "regions" and back ("region_base" is a plain key of its own).
void record_regions(const GenerationParams& p, nlohmann::json& params);
void restore_regions(const nlohmann::json& params, GenerationParams& p);

// `generate --region "x0,y0,x1,y1:PROMPT"`: the box and the prompt (everything after the first ':');
// throws UsageError naming the flag's value when it is not four numbers, a ':' and a prompt, or the
// box is not one (region_box_problem).
RegionUse parse_region_flag(const std::string& text);
// `generate --region-mask "FILE:PROMPT"`: the mask file (up to the first ':') and the prompt.
RegionUse parse_region_mask_flag(const std::string& text);

}  // namespace sdxl
