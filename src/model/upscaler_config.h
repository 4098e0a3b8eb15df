// An upscaler folder's model.json (export_sdxl.py --upscaler; docs/models-and-export.md#upscaler-folders),
// read by the same readers as the other task folders (model_config.cpp).
#pragma once

#include <filesystem>
#include <string>

#include "model/model_config.h"

namespace sdxl {

// An upscaler folder (export_sdxl.py --upscaler; model.json "kind": "upscaler"): upscaler.ts maps
// [B,3,h,w] RGB in [0,1] (its dtype) to [B,3,h*scale,w*scale], not clamped. A fixed tile
// (window-attention architectures) means it runs only at tile x tile.
struct UpscalerConfig : TaskFolderConfig {
  std::string file, architecture;
  int scale = 1;
  bool fixed_tile = false;
  int tile_size = 0;  // the fixed tile's side, 0 when any size runs
};
UpscalerConfig load_upscaler_config(const std::filesystem::path& dir);
UpscalerConfig parse_upscaler_config(const std::string& json_text, const std::filesystem::path& dir,
                                     const std::string& origin, bool check_files);

}  // namespace sdxl
