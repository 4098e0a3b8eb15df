// The frame maths of `sdxl-batch video` (docs/video.md): which frames each clip has, where the
// transitions overlap them, the box frame i of a clip shows, and the frame made from the
// full-resolution source as PIL's Image.resize((W, H), LANCZOS, box=...) makes it. torch-free;
// pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "batch/video_spec.h"

namespace sdxl {

// Clip c occupies video frames [start, start + frames); the first `in_overlap` of them blend with
// the previous clip's last frames, the last `out_overlap` with the next clip's first ones.
struct ClipTiming {
  int frames = 0;
  int start = 0;
  int in_overlap = 0, out_overlap = 0;
};

struct VideoTimeline {
  std::vector<ClipTiming> clips;
  int total_frames = 0;  // sum of frames - sum of overlaps
};

VideoTimeline plan_timeline(const VideoSpec& spec);

// ease(t) for t in [0, 1]: "linear" t, "in-out" 0.5 - 0.5 cos(pi t).
double video_ease(const std::string& ease, double t);

// The box (in fractions) frame i of n shows: lerp(from, to, ease(i / (n - 1))); frame 0 of 1 shows `from`.
VideoBox motion_box(const VideoMotion& m, int i, int n);

// The box in source pixels (x0 w, y0 h, x1 w, y1 h), centre-cropped to the aspect out_w : out_h.
VideoBox frame_source_box(const VideoBox& b, int src_w, int src_h, int out_w, int out_h);

// Frame i of n of a clip whose source is `rgb` (src_w x src_h): the box resized to out_w x out_h.
std::vector<std::uint8_t> render_clip_frame(const std::uint8_t* rgb, int src_w, int src_h, const VideoMotion& m, int i,
                                            int n, int out_w, int out_h);

// Frame j of a k-frame transition between frames a and b (same size): crossfade (1 - alpha) a +
// alpha b with alpha = (j + 1) / (k + 1); fade-black goes a -> black -> b over the k frames
// (a darkened by 1 - 2 alpha in the first half, b brightened by 2 alpha - 1 in the second).
// Each byte rounded to nearest.
std::vector<std::uint8_t> blend_transition(const std::string& kind, const std::vector<std::uint8_t>& a,
                                           const std::vector<std::uint8_t>& b, int j, int k);

// An .srt of the captions: clip c's caption from its first frame to the first frame of its
// outgoing transition (the next caption starts there), times at `fps`. Clips without a caption
// have no entry.
std::string captions_srt(const VideoSpec& spec, const VideoTimeline& t);

// "HH:MM:SS,mmm" of frame f at fps.
std::string srt_time(int frame, int fps);

}  // namespace sdxl
