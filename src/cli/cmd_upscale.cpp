// `sdxl-batch upscale`: existing PNGs brought to a frame by an upscaler folder or LANCZOS
// (sdxl_batch::upscale_images: resumable, atomic, report.json). A client of the public API alone.
#include <sdxl_batch/sdxl_batch.h>

#include <iostream>

#include "cli/commands.h"

namespace sdxl::cli {

struct UpscaleArgs {
  sdxl_batch::UpscaleOptions options;
  std::string size, scale;  // as typed (an --upscale of 0 is an error, not "not given")
};

CLI::App* add_upscale(CLI::App& app, std::shared_ptr<UpscaleArgs>& args) {
  args = std::make_shared<UpscaleArgs>();
  auto* cmd = app.add_subcommand("upscale", "Upscale existing PNGs to a frame with an upscaler model (resumable)");
  auto& o = args->options;
  cmd->add_option("--upscale-model", o.upscaler,
                  "An upscaler folder (export_sdxl.py --upscaler), or Lanczos for no model")
      ->required();
  auto* by = cmd->add_option("--upscale", args->scale, "Upscale by this factor (the model's passes, then LANCZOS)");
  auto* to = cmd->add_option("--upscale-size", args->size, "Upscale to this frame, WxH (e.g. 1080x1920)");
  by->excludes(to);
  cmd->add_option("--upscale-fit", o.fit, "With --upscale-size: crop (fill, centre cut), pad (fit, black bars) "
                                          "or stretch (default)")
      ->check(CLI::IsMember({"crop", "pad", "stretch"}));
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
  if (!a.size.empty()) {
    const auto x = a.size.find('x');
    try {
      if (x == std::string::npos) throw std::invalid_argument("no x");
      std::size_t n1 = 0, n2 = 0;
      o.width = std::stoi(a.size.substr(0, x), &n1);
      o.height = std::stoi(a.size.substr(x + 1), &n2);
      if (n1 != x || n2 != a.size.size() - x - 1) throw std::invalid_argument("trailing text");
    } catch (const std::exception&) {
      throw sdxl_batch::UsageError("--upscale-size '" + a.size + "': expected WxH, e.g. 1080x1920");
    }
  } else if (!a.scale.empty()) {
    std::size_t n = 0;
    try {
      o.scale = std::stod(a.scale, &n);
    } catch (const std::exception&) {
      n = 0;
    }
    if (n != a.scale.size() || !(o.scale > 0))
      throw sdxl_batch::UsageError("--upscale '" + a.scale + "': must be a number above 0");
  } else {
    throw sdxl_batch::UsageError("upscale: give --upscale S or --upscale-size WxH");
  }
  const sdxl_batch::UpscaleResult r = sdxl_batch::upscale_images(o);
  std::cout << "upscale: " << r.written << " written, " << r.skipped << " already done, " << r.failed << " failed\n";
  for (const auto& f : r.failures) std::cout << "  failed: " << f << "\n";
  return r.exit_code();
}

}  // namespace sdxl::cli
