// DetailerProgress: where one image is on its way through its detailer (detailer_flow.h): the
// unit and region reached, the regions found, the image as the passes so far left it. A region's
// pass (a WorkItem) points to the progress of the image it details. torch-free.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipeline/detailer.h"
#include "scheduler/work_list.h"
#include "scheduler/write_job.h"

namespace sdxl {

// One image on its way through its detailer.
struct DetailerProgress {
  WorkItem base;          // the image's own item (its params hold the detailer)
  WriteJob job;           // what is written at the end: the image (rgb updated by each pass), its times
  int unit = -1;          // the unit whose regions are passed now (-1 before the first)
  std::vector<DetailerRegion> regions;
  int next = 0;           // the region whose pass comes next
  std::string model_name;
  nlohmann::json boxes = nlohmann::json::array();  // each region passed
};

}  // namespace sdxl
