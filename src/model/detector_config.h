// A detector folder's model.json (export_sdxl.py --detector; docs/models-and-export.md#detector-folders),
// read by the same readers as the other task folders (model_config.cpp).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace sdxl {

// A detector folder (model.json "kind": "detector"): detector.ts, Ultralytics' TorchScript export of a
// YOLO detect or segment model, maps [1,3,imgsz_h,imgsz_w] RGB in [0,1] (letterboxed) to
// [1,4+nc(+M),A] (segment: and the mask prototypes [1,M,imgsz_h/4,imgsz_w/4]).
struct DetectorConfig : TaskFolderConfig {
  std::string file, task;            // task: "detect" | "segment"
  std::vector<std::string> classes;  // names by class id
  int imgsz_h = 640, imgsz_w = 640, stride = 32;
  int mask_coefficients = 0;  // M (segment), 0 for detect
  std::string ultralytics_version;
};
// Throws ModelError naming the folder or the field.
DetectorConfig load_detector_config(const std::filesystem::path& dir);
DetectorConfig parse_detector_config(const std::string& json_text, const std::filesystem::path& dir,
                                     const std::string& origin, bool check_files);

}  // namespace sdxl
