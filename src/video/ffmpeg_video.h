// Encoding with the `ffmpeg` program (Debian's ffmpeg; docs/video.md says why the program and not
// the libraries): raw RGB frames fed on a pipe become an H.264 yuv420p segment (BT.709, x264 at a
// CRF), optionally with a caption burned in by libass (the `subtitles` filter); segments are
// joined without re-encoding and the audio track added, cut and faded. Every output is written
// under a temporary name and renamed into place by the caller. Throws IoError with ffmpeg's
// message when it fails. torch-free; one thread per encoder.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "batch/video_spec.h"
#include "core/subprocess.h"

namespace sdxl {

// A caption burned into every frame of a segment.
struct BurnedCaption {
  std::string text;
  std::string font_family;  // as fontconfig names it; with fonts_dir, a font in that folder
  std::string fonts_dir;    // "" = the system's fonts
  int size_px = 54;
  std::string position = "bottom";
};

// One segment being encoded: frames written one at a time, then finish().
class SegmentEncoder {
 public:
  // `out`: the file to write (MP4); `work_dir`: where the caption's .srt is placed.
  SegmentEncoder(const std::filesystem::path& out, const std::filesystem::path& work_dir, int width, int height,
                 int fps, int crf, const std::optional<BurnedCaption>& caption);
  ~SegmentEncoder();
  SegmentEncoder(const SegmentEncoder&) = delete;
  SegmentEncoder& operator=(const SegmentEncoder&) = delete;
  void write_frame(const std::vector<std::uint8_t>& rgb);
  void finish();

 private:
  std::filesystem::path out_, srt_;
  size_t frame_bytes_ = 0;
  std::unique_ptr<Subprocess> proc_;
};

// The segments joined (no re-encoding) into `out` (MP4, +faststart); with `audio`, its track
// mixed at its volume, cut to `seconds` and faded out over its last fade_out seconds, as AAC.
void join_segments(const std::vector<std::filesystem::path>& segments, const std::filesystem::path& list_file,
                   const std::filesystem::path& out, double seconds, const std::optional<VideoAudio>& audio);

// The family name of a font file (fontconfig's fc-scan; the first face of a collection).
// Throws UsageError when it reads no font.
std::string font_family(const std::filesystem::path& font);

// The version line of `ffmpeg -version` (part of what names a segment); IoError when it does not run.
std::string ffmpeg_version();

}  // namespace sdxl
