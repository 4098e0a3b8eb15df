// WriteJob: one finished image on its way to the writers (writer_pool.h), with what its manifest
// line and the report record. torch-free.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "pipeline/generator.h"
#include "scheduler/work_list.h"

namespace sdxl {

// One finished image on its way to disk.
struct WriteJob {
  WorkItem item;
  GeneratedImage image;
  double start_s = 0, generate_s = 0;
  int batch_size = 1;
  std::uint64_t memory_bytes = 0;
  std::string device;
  // A detailed image: each region passed (unit, detector, box, score, class), for the report.
  nlohmann::json detailer;
};

}  // namespace sdxl
