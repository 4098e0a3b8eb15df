// `sdxl-batch video BATCH --out DIR [--video FILE.mp4]`: the batch file's "video" section made
// into an MP4 and an .srt from the run's output folder (sdxl_batch::make_video: resumable per
// segment, atomic, under the folder's lock). Exit 3 with the list of tasks when images are
// missing. A client of the public API alone.
#include <sdxl_batch/sdxl_batch.h>

#include <cstdio>
#include <iostream>

#include "cli/commands.h"

namespace sdxl::cli {

struct VideoArgs {
  sdxl_batch::VideoOptions options;
};

CLI::App* add_video(CLI::App& app, std::shared_ptr<VideoArgs>& args) {
  args = std::make_shared<VideoArgs>();
  auto* cmd = app.add_subcommand("video", "Make the batch file's \"video\" section into an MP4 from a run's images");
  auto& o = args->options;
  cmd->add_option("batch", o.batch_file, "Batch file (JSON) with a \"video\" section")->required();
  cmd->add_option("--out", o.out_dir, "The run's output folder (manifest.jsonl and its PNGs)")->required();
  cmd->add_option("--video", o.video, "The MP4 to write (default: OUT/video.mp4); the .srt goes beside it");
  return cmd;
}

int run_video(const VideoArgs& a) {
  sdxl_batch::VideoOptions o = a.options;
  o.on_progress = [](int done, int total, double elapsed, double eta) {
    std::fprintf(stderr, "\rvideo: %d/%d frames encoded, %.0f s, ETA %.0f s ", done, total, elapsed, eta);
    if (done == total) std::fprintf(stderr, "\n");
  };
  const sdxl_batch::VideoResult r = sdxl_batch::make_video(o);
  if (!r.missing.empty()) {
    std::cout << "video: " << r.missing.size() << " image(s) the video needs are not made; run the batch first:\n";
    for (const auto& m : r.missing) std::cout << "  " << m << "\n";
    return r.exit_code();
  }
  std::cout << "video: " << r.clips_encoded << " clip(s) and " << r.transitions_encoded << " transition(s) encoded, "
            << r.segments_reused << " segment(s) reused; " << r.frames << " frames, " << r.seconds << " s\n"
            << "  " << r.video << "\n  " << r.srt << "\n";
  return 0;
}

}  // namespace sdxl::cli
