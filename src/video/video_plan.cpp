#include "video/video_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>

#include "image/resize.h"

namespace sdxl {

VideoTimeline plan_timeline(const VideoSpec& spec) {
  VideoTimeline t;
  int at = 0;
  for (size_t c = 0; c < spec.clips.size(); ++c) {
    ClipTiming ct;
    ct.frames = video_frame_count(spec.clips[c].duration, spec.fps);
    ct.in_overlap = c ? t.clips.back().out_overlap : 0;
    ct.out_overlap = c + 1 < spec.clips.size() ? video_frame_count(spec.clips[c].transition.seconds, spec.fps) : 0;
    if (spec.clips[c].transition.kind == "cut") ct.out_overlap = 0;
    ct.start = at - ct.in_overlap;
    at = ct.start + ct.frames;
    t.clips.push_back(ct);
  }
  t.total_frames = at;
  return t;
}

double video_ease(const std::string& ease, double t) {
  if (ease == "in-out") return 0.5 - 0.5 * std::cos(std::numbers::pi * t);
  return t;
}

VideoBox motion_box(const VideoMotion& m, int i, int n) {
  const double t = video_ease(m.ease, n > 1 ? static_cast<double>(i) / (n - 1) : 0.0);
  auto lerp = [t](double a, double b) { return a + (b - a) * t; };
  return {lerp(m.from.x0, m.to.x0), lerp(m.from.y0, m.to.y0), lerp(m.from.x1, m.to.x1), lerp(m.from.y1, m.to.y1)};
}

VideoBox frame_source_box(const VideoBox& b, int src_w, int src_h, int out_w, int out_h) {
  VideoBox r{b.x0 * src_w, b.y0 * src_h, b.x1 * src_w, b.y1 * src_h};
  const double bw = r.x1 - r.x0, bh = r.y1 - r.y0;
  const double aspect = static_cast<double>(out_w) / out_h;
  if (bw / bh > aspect) {  // too wide: keep the height
    const double w = bh * aspect, cx = (r.x0 + r.x1) / 2;
    r.x0 = cx - w / 2, r.x1 = cx + w / 2;
  } else {  // too tall: keep the width
    const double h = bw / aspect, cy = (r.y0 + r.y1) / 2;
    r.y0 = cy - h / 2, r.y1 = cy + h / 2;
  }
  return r;
}

std::vector<std::uint8_t> render_clip_frame(const std::uint8_t* rgb, int src_w, int src_h, const VideoMotion& m, int i,
                                            int n, int out_w, int out_h) {
  const VideoBox b = frame_source_box(motion_box(m, i, n), src_w, src_h, out_w, out_h);
  return resize_lanczos_box_rgb8(rgb, src_w, src_h, out_w, out_h, {b.x0, b.y0, b.x1, b.y1});
}

std::vector<std::uint8_t> blend_transition(const std::string& kind, const std::vector<std::uint8_t>& a,
                                           const std::vector<std::uint8_t>& b, int j, int k) {
  const double alpha = static_cast<double>(j + 1) / (k + 1);
  double wa = 1 - alpha, wb = alpha;
  if (kind == "fade-black") {
    wa = std::max(0.0, 1 - 2 * alpha);
    wb = std::max(0.0, 2 * alpha - 1);
  }
  std::vector<std::uint8_t> out(a.size());
  for (size_t p = 0; p < a.size(); ++p) {
    const double v = wa * a[p] + wb * b[p];
    out[p] = static_cast<std::uint8_t>(std::clamp(std::lround(v), 0L, 255L));
  }
  return out;
}

std::string srt_time(int frame, int fps) {
  const long long ms = std::llround(1000.0 * frame / fps);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02lld:%02lld:%02lld,%03lld", ms / 3600000, ms / 60000 % 60, ms / 1000 % 60,
                ms % 1000);
  return buf;
}

std::string captions_srt(const VideoSpec& spec, const VideoTimeline& t) {
  std::string srt;
  int number = 0;
  for (size_t c = 0; c < spec.clips.size(); ++c) {
    if (spec.clips[c].caption.empty()) continue;
    const ClipTiming& ct = t.clips[c];
    const int end = ct.start + ct.frames - ct.out_overlap;
    srt += std::to_string(++number) + "\n" + srt_time(ct.start, spec.fps) + " --> " + srt_time(end, spec.fps) + "\n" +
           spec.clips[c].caption + "\n\n";
  }
  return srt;
}

}  // namespace sdxl
