// `sdxl-batch detect`: each PNG's detections by a detector folder (export_sdxl.py --detector), one JSON
// line per detection on stdout (sdxl_batch::detect_images). A client of the public API alone.
#include <nlohmann/json.hpp>
#include <sdxl_batch/sdxl_batch.h>

#include <iostream>

#include "cli/commands.h"

namespace sdxl::cli {

struct DetectArgs {
  sdxl_batch::DetectOptions options;
};

CLI::App* add_detect(CLI::App& app, std::shared_ptr<DetectArgs>& args) {
  args = std::make_shared<DetectArgs>();
  auto* cmd = app.add_subcommand("detect", "Find faces, hands, people ... in PNGs with a detector folder "
                                           "(export_sdxl.py --detector); one JSON line per detection");
  auto& o = args->options;
  cmd->add_option("--detector", o.detector, "A detector folder (export_sdxl.py --detector FILE.pt --out DIR)")
      ->required();
  cmd->add_option("--confidence", o.confidence, "Keep detections scoring above this, in (0, 1] (default 0.3)");
  cmd->add_option("--device", o.device, "auto (CUDA when present), cpu, cuda or cuda:N");
  cmd->add_option("images", o.images, "PNG files")->required();
  return cmd;
}

int run_detect(const DetectArgs& a) {
  sdxl_batch::detect_images(a.options, [](const sdxl_batch::ImageDetections& r) {
    for (const sdxl_batch::DetectedBox& b : r.boxes) {
      nlohmann::ordered_json line = {{"image", r.image}, {"width", r.width}, {"height", r.height}, {"x1", b.x1},
                             {"y1", b.y1},       {"x2", b.x2},       {"y2", b.y2},         {"score", b.score},
                             {"class", b.class_id}, {"name", b.class_name}};
      if (b.mask_area >= 0) line["mask_area"] = b.mask_area;
      std::cout << line.dump() << "\n";
    }
    std::cout.flush();
  });
  return 0;
}

}  // namespace sdxl::cli
