// The "video" section of a batch file (`sdxl-batch video`, docs/video.md): frame size and rate, the
// clips in order (a task's image, or a PNG file), each clip's motion ("Ken Burns" box from -> to with
// an ease), the transition into the next clip, the audio track and the captions. Read and checked by
// the batch parser, so `validate` and `video` refuse the same files at the same JSON pointers.
// Audio decoding is asked of InputChecks (check/ runs ffprobe). torch-free.
#pragma once

#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "batch/batch_file.h"

namespace sdxl {

// A region of the source image in fractions of its width and height: 0 <= x0 < x1 <= 1, same for y.
struct VideoBox {
  double x0 = 0, y0 = 0, x1 = 1, y1 = 1;
};

struct VideoMotion {
  std::string name = "none";  // a named motion, or "explicit"
  VideoBox from{}, to{};
  std::string ease = "linear";  // "linear" | "in-out" (0.5 - 0.5 cos(pi t))
};

// The transition into the next clip: "cut", "crossfade" or "fade-black", over `seconds`.
struct VideoTransition {
  std::string kind = "cut";
  double seconds = 0;
};

struct VideoClip {
  std::string task;   // a task's id (with index), or "" for a clip of `image`
  int index = 0;
  std::string image;  // an absolute PNG path (clips from files: title and end cards)
  double duration = 3.0;
  VideoMotion motion{};
  VideoTransition transition{};
  std::string caption;
  std::string pointer;  // where the clip is in the batch file ("/video/clips/N", or "/tasks/N" without clips)
};

struct VideoAudio {
  std::string file;  // absolute
  double volume = 1.0;
  double fade_out = 0;  // seconds at the end of the video
};

struct VideoCaptions {
  std::string font;  // a font file (absolute), "" = fontconfig's default sans (Noto CJK when installed)
  int size = 54;
  std::string position = "bottom";  // "bottom" | "top" | "middle"
  bool burn_in = false;
};

struct VideoSpec {
  int width = 1080, height = 1920;
  int fps = 30;
  int crf = 18;
  std::vector<VideoClip> clips;
  std::optional<VideoAudio> audio;
  VideoCaptions captions{};
};

// The documented start and end box of a named motion ("none", "zoom-in", "zoom-out", "pan-left",
// "pan-right", "pan-up", "pan-down"); false for another name.
bool named_video_motion(const std::string& name, VideoMotion& out);

// Frames of a clip of `seconds` at `fps`: round(seconds * fps).
int video_frame_count(double seconds, int fps);

// Reads `video` (the value of the top-level "video" key) against the tasks of the batch file;
// relative paths are relative to `base_dir`, confined as every input is (core/input_file.h).
// Problems are appended at their JSON pointers ("/video/...").
VideoSpec read_video_spec(const nlohmann::json& video, const std::filesystem::path& base_dir,
                          const std::vector<BatchTask>& tasks, InputChecks* checks,
                          std::vector<BatchProblem>& problems);

}  // namespace sdxl
