// `sdxl-batch upscale`: existing PNGs brought to a frame by an upscaler folder or LANCZOS
// (sdxl_batch::upscale_images: resumable, atomic, report.json). A client of the public API alone.
#include <sdxl_batch/sdxl_batch.h>

#include <iostream>

#include "cli/cli_common.h"
#include "cli/commands.h"

namespace sdxl::cli {

struct UpscaleArgs {
  sdxl_batch::UpscaleOptions options;
  UpscaleFlags frame;
};

CLI::App* add_upscale(CLI::App& app, std::shared_ptr<UpscaleArgs>& args) {
  args = std::make_shared<UpscaleArgs>();
  auto* cmd = app.add_subcommand("upscale", "Upscale existing PNGs to a frame with an upscaler model (resumable)");
  auto& o = args->options;
  add_upscale_flags(*cmd, args->frame, /*model_required=*/true);
  cmd->add_option("--out", o.out_dir, "Output folder (manifest.jsonl, report.json, one PNG per input)")->required();
  cmd->add_option("--device", o.device, "auto (CUDA when present), cpu, cuda or cuda:N");
  cmd->add_option("--tile", o.tile, "Tile size in pixels (ComfyUI's 512; halved on out-of-memory down to 128)")
      ->check(CLI::Range(64, 4096));
  cmd->add_flag("--force", o.force, "Make every image again, even those the manifest records");
  cmd->add_option("inputs", o.inputs, "PNG files, or folders of PNGs")->required();
  return cmd;
}

int run_upscale(const UpscaleArgs& a) {
  sdxl_batch::UpscaleOptions o = a.options;
  const sdxl_batch::Upscale u = upscale_of_flags(a.frame);
  o.upscaler = u.model;
  o.scale = u.scale;
  o.width = u.width;
  o.height = u.height;
  o.fit = u.fit;
  const sdxl_batch::UpscaleResult r = sdxl_batch::upscale_images(o);
  std::cout << "upscale: " << r.written << " written, " << r.skipped << " already done, " << r.failed << " failed\n";
  for (const auto& f : r.failures) std::cout << "  failed: " << f << "\n";
  return r.exit_code();
}

}  // namespace sdxl::cli
