// `sdxl-batch video` (docs/video.md): a batch file's "video" section made into an MP4 (and an .srt
// beside it) from the run's output folder. Each clip's frames between its transitions are encoded
// once into a segment named by the hash of what makes it (source PNG, size, fps, crf, motion,
// frame range, burned caption and font, ffmpeg's version), and each transition into a segment of
// its own; the video is their concatenation (no re-encoding) with the audio. A rerun encodes only
// the segments whose inputs changed. Runs under the output folder's lock (as `run`); the video and
// the .srt are written under temporary names and renamed into place. torch-free.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "batch/batch_file.h"
#include "batch/video_spec.h"

namespace sdxl {

struct VideoProgress {
  int frames_done = 0, frames_total = 0;  // frames of the segments to encode
  double elapsed_s = 0, eta_s = 0;
};

struct VideoRequest {
  std::filesystem::path out_dir;     // the run's output folder: manifest.jsonl and the PNGs
  std::filesystem::path video_path;  // "" = out_dir/video.mp4
  std::function<void(const VideoProgress&)> on_progress;  // may be empty
};

struct VideoOutcome {
  std::vector<std::string> missing;  // "TASK#INDEX (pointer): why" for each image not made; then nothing is written
  std::filesystem::path video, srt;
  int clips_encoded = 0, transitions_encoded = 0, segments_reused = 0;
  int frames = 0;
  double seconds = 0;
};

// Throws UsageError when the batch file has no "video" section, LockedError when another process
// holds the folder, IoError when ffmpeg fails or a file cannot be written (nothing is left at the
// video's path then).
VideoOutcome make_video(const BatchFile& batch, const VideoRequest& request);

}  // namespace sdxl
