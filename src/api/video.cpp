// make_video (sdxl_batch.h): the batch file checked as `validate` checks it, then
// video/make_video.h over the run's output folder.
#include <sdxl_batch/sdxl_batch.h>

#include "api/boundary.h"
#include "batch/video_spec.h"
#include "check/batch_check.h"
#include "video/make_video.h"

namespace sdxl_batch {

VideoResult make_video(const VideoOptions& o) {
  return sdxl::api::guarded([&] {
    if (o.out_dir.empty()) throw UsageError("video: no output folder (--out)");
    const sdxl::CheckedBatch checked = sdxl::check_batch_file(o.batch_file, nullptr, sdxl::BatchCheckInputs{});
    if (!checked.problems.empty()) sdxl::api::throw_invalid(o.batch_file, checked.problems);
    sdxl::VideoRequest req;
    req.out_dir = o.out_dir;
    req.video_path = o.video;
    if (o.on_progress)
      req.on_progress = [&](const sdxl::VideoProgress& p) {
        o.on_progress(p.frames_done, p.frames_total, p.elapsed_s, p.eta_s);
      };
    const sdxl::VideoOutcome v = sdxl::make_video(checked.file, req);
    VideoResult r;
    r.missing = v.missing;
    r.video = v.video.string();
    r.srt = v.srt.string();
    r.clips_encoded = v.clips_encoded;
    r.transitions_encoded = v.transitions_encoded;
    r.segments_reused = v.segments_reused;
    r.frames = v.frames;
    r.seconds = v.seconds;
    return r;
  });
}

}  // namespace sdxl_batch
