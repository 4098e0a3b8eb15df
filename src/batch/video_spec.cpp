#include "batch/video_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "batch/json_fields.h"
#include "core/input_file.h"

namespace sdxl {

namespace {

using json = nlohmann::json;

constexpr int kMaxVideoSide = 8192;
constexpr double kMaxClipSeconds = 3600;
constexpr std::uint64_t kMaxAudioBytes = 4ull << 30;
constexpr std::uint64_t kMaxFontBytes = 256ull << 20;

std::string short_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Collects the section's problems; each reader adds at its own pointer (the typed reads: JsonFields).
struct VideoReader : JsonFields {
  const std::filesystem::path& base_dir;
  InputChecks* checks;

  bool object(const json& v, const std::string& ptr, const std::set<std::string>& allowed) {
    if (!v.is_object()) {
      add(ptr, "must be an object");
      return false;
    }
    check_keys(v, ptr, allowed);
    return true;
  }
  bool number(const json& o, const std::string& ptr, const char* key, double lo, double hi, double& out,
              bool lo_open = false) {
    if (!o.contains(key)) return false;
    const json& v = o[key];
    const double x = v.is_number() ? v.get<double>() : NAN;
    const bool ok = v.is_number() && std::isfinite(x) && (lo_open ? x > lo : x >= lo) && x <= hi;
    if (!ok) {
      add(ptr + "/" + key, "must be a number " + std::string(lo_open ? "> " : ">= ") + short_number(lo) +
                               " and <= " + short_number(hi));
      return false;
    }
    out = x;
    return true;
  }
  bool integer(const json& o, const std::string& ptr, const char* key, long long lo, long long hi, int& out) {
    long long v = 0;
    if (!get_int(o, ptr, key, lo, hi, v)) return false;
    out = static_cast<int>(v);
    return true;
  }
  bool string(const json& o, const std::string& ptr, const char* key, std::string& out) {
    return get_string(o, ptr, key, out);
  }
  // A file the batch file names (relative to its folder): a readable regular file, confined as every
  // input is (a plain relative path stays inside the batch file's folder).
  bool file(const json& o, const std::string& ptr, const char* key, std::uint64_t max_bytes, std::string& out) {
    std::string rel;
    if (!string(o, ptr, key, rel)) return false;
    if (rel.empty()) {
      add(ptr + "/" + key, "must not be empty (a path relative to the batch file)");
      return false;
    }
    const std::filesystem::path r(rel);
    const std::filesystem::path path = absolute_normal(r.is_relative() ? base_dir / r : r);
    bool named = r.is_absolute();
    for (const auto& part : r) named |= part == "..";
    const std::filesystem::path root = named ? path.parent_path() : base_dir.empty() ? "." : base_dir;
    std::string why = input_file_problem(path, max_bytes, root);
    if (!why.empty()) {
      add(ptr + "/" + key, "'" + path.string() + "' " + why);
      return false;
    }
    out = path.string();
    return true;
  }

  bool box(const json& v, const std::string& ptr, VideoBox& b);
  void motion(const json& o, const std::string& ptr, VideoMotion& m);
  void transition(const json& o, const std::string& ptr, VideoTransition& t);
  void clip_settings(const json& o, const std::string& ptr, VideoClip& c);
  void audio(const json& o, VideoSpec& spec);
  void captions(const json& o, VideoSpec& spec);
};

bool VideoReader::box(const json& v, const std::string& ptr, VideoBox& b) {
  if (!v.is_array() || v.size() != 4 || !std::all_of(v.begin(), v.end(), [](const json& x) { return x.is_number(); })) {
    add(ptr, "must be a box [x0, y0, x1, y1] in fractions of the source image");
    return false;
  }
  b = {v[0].get<double>(), v[1].get<double>(), v[2].get<double>(), v[3].get<double>()};
  const bool inside = b.x0 >= 0 && b.y0 >= 0 && b.x1 <= 1 && b.y1 <= 1 && b.x0 < b.x1 && b.y0 < b.y1;
  if (!inside) add(ptr, "is outside the image: a box needs 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1");
  return inside;
}

void VideoReader::motion(const json& o, const std::string& ptr, VideoMotion& m) {
  if (!o.contains("motion")) return;
  const json& v = o["motion"];
  const std::string mp = ptr + "/motion";
  if (v.is_string()) {
    if (!named_video_motion(v.get<std::string>(), m))
      add(mp, "unknown motion '" + v.get<std::string>() +
                  "' (none, zoom-in, zoom-out, pan-left, pan-right, pan-up, pan-down, or {\"from\", \"to\", \"ease\"})");
    return;
  }
  if (!object(v, mp, {"from", "to", "ease"})) return;
  VideoMotion e;
  e.name = "explicit";
  for (const char* k : {"from", "to"})
    if (!v.contains(k)) add(mp + "/" + k, "is missing (a box [x0, y0, x1, y1])");
  bool ok = v.contains("from") && box(v["from"], mp + "/from", e.from);
  ok = v.contains("to") && box(v["to"], mp + "/to", e.to) && ok;
  if (string(v, mp, "ease", e.ease) && e.ease != "linear" && e.ease != "in-out") {
    add(mp + "/ease", "must be \"linear\" or \"in-out\"");
    ok = false;
  }
  if (ok) m = e;
}

void VideoReader::transition(const json& o, const std::string& ptr, VideoTransition& t) {
  if (!o.contains("transition")) return;
  const json& v = o["transition"];
  const std::string tp = ptr + "/transition";
  if (!object(v, tp, {"kind", "seconds"})) return;
  std::string kind = t.kind;
  if (string(v, tp, "kind", kind) && kind != "cut" && kind != "crossfade" && kind != "fade-black") {
    add(tp + "/kind", "must be \"cut\", \"crossfade\" or \"fade-black\"");
    return;
  }
  t.kind = kind;
  number(v, tp, "seconds", 0, kMaxClipSeconds, t.seconds);
  if (t.kind == "cut") t.seconds = 0;
}

void VideoReader::clip_settings(const json& o, const std::string& ptr, VideoClip& c) {
  number(o, ptr, "duration", 0, kMaxClipSeconds, c.duration, /*lo_open=*/true);
  motion(o, ptr, c.motion);
  transition(o, ptr, c.transition);
  string(o, ptr, "caption", c.caption);
}

void VideoReader::audio(const json& o, VideoSpec& spec) {
  if (!o.contains("audio")) return;
  if (!object(o["audio"], "/video/audio", {"file", "volume", "fade_out"})) return;
  const json& a = o["audio"];
  VideoAudio out;
  if (!a.contains("file")) add("/video/audio/file", "is missing (an audio file relative to the batch file)");
  bool ok = file(a, "/video/audio", "file", kMaxAudioBytes, out.file);
  if (ok && checks) {
    const std::string why = checks->audio_problem(out.file);
    if (!why.empty()) add("/video/audio/file", "'" + out.file + "' " + why);
    ok = why.empty();
  }
  number(a, "/video/audio", "volume", 0, 10, out.volume);
  number(a, "/video/audio", "fade_out", 0, kMaxClipSeconds, out.fade_out);
  if (ok) spec.audio = out;
}

void VideoReader::captions(const json& o, VideoSpec& spec) {
  if (!o.contains("captions")) return;
  const std::string cp = "/video/captions";
  if (!object(o["captions"], cp, {"font", "size", "position", "burn_in"})) return;
  const json& c = o["captions"];
  VideoCaptions& out = spec.captions;
  file(c, cp, "font", kMaxFontBytes, out.font);
  integer(c, cp, "size", 4, 1000, out.size);
  if (string(c, cp, "position", out.position) && out.position != "bottom" && out.position != "top" &&
      out.position != "middle")
    add(cp + "/position", "must be \"bottom\", \"top\" or \"middle\"");
  if (c.contains("burn_in")) {
    if (c["burn_in"].is_boolean()) out.burn_in = c["burn_in"].get<bool>();
    else add(cp + "/burn_in", "must be true or false");
  }
}

void read_size(VideoReader& r, const json& v, VideoSpec& spec) {
  std::string size;
  if (!r.string(v, "/video", "size", size)) return;
  int w = 0, h = 0;
  char x = 0, rest = 0;
  if (std::sscanf(size.c_str(), "%d%c%d%c", &w, &x, &h, &rest) != 3 || x != 'x' || w < 16 || h < 16 ||
      w > kMaxVideoSide || h > kMaxVideoSide || w % 2 || h % 2)
    r.add("/video/size", "must be \"WxH\", each even and in 16.." + std::to_string(kMaxVideoSide) +
                             " (yuv420p needs even sides), e.g. \"1080x1920\"");
  else spec.width = w, spec.height = h;
}

// Each clip's source (a task's image by id and index, or a PNG file) and its own settings over `dflt`.
void read_clips(VideoReader& r, const json& v, const std::vector<BatchTask>& tasks, const VideoClip& dflt,
                VideoSpec& spec) {
  std::map<std::string, int> counts;
  for (const BatchTask& t : tasks) counts[t.id] = t.count;
  if (!v.contains("clips")) {  // every image of the batch in file order
    for (size_t i = 0; i < tasks.size(); ++i)
      for (int k = 0; k < tasks[i].count; ++k) {
        VideoClip c = dflt;
        c.task = tasks[i].id, c.index = k, c.pointer = "/tasks/" + std::to_string(i);
        spec.clips.push_back(c);
      }
    return;
  }
  if (!v["clips"].is_array() || v["clips"].empty()) return r.add("/video/clips", "must be a non-empty array of clips");
  for (size_t i = 0; i < v["clips"].size(); ++i) {
    const std::string ptr = "/video/clips/" + std::to_string(i);
    const json& o = v["clips"][i];
    if (!r.object(o, ptr, {"task", "index", "image", "duration", "motion", "transition", "caption"})) continue;
    VideoClip c = dflt;
    c.pointer = ptr;
    const bool has_task = r.string(o, ptr, "task", c.task);
    r.integer(o, ptr, "index", 0, 1 << 20, c.index);
    if (o.contains("image") && has_task) r.add(ptr + "/image", "a clip names a task or an image, not both");
    else if (o.contains("image") && r.file(o, ptr, "image", 1ull << 30, c.image) && r.checks) {
      int w = 0, h = 0;
      if (std::string why = r.checks->png_size(c.image, w, h); !why.empty())
        r.add(ptr + "/image", "'" + c.image + "' " + why);
    } else if (!o.contains("image") && !has_task) r.add(ptr, "a clip needs \"task\" (and \"index\") or \"image\"");
    if (has_task && !counts.count(c.task)) r.add(ptr + "/task", "unknown task '" + c.task + "'");
    else if (has_task && c.index >= counts[c.task])
      r.add(ptr + "/index", "task '" + c.task + "' has " + std::to_string(counts[c.task]) + " image(s): index " +
                                std::to_string(c.index) + " does not exist");
    r.clip_settings(o, ptr, c);
    spec.clips.push_back(c);
  }
}

// Every clip has at least one frame, and its incoming and outgoing overlaps fit in it.
void check_timing(VideoReader& r, const VideoSpec& spec) {
  for (size_t i = 0; i < spec.clips.size(); ++i) {
    const VideoClip& c = spec.clips[i];
    const int n = video_frame_count(c.duration, spec.fps);
    if (n < 1) {
      r.add(c.pointer + "/duration", "is shorter than one frame at " + std::to_string(spec.fps) + " fps");
      continue;
    }
    if (i + 1 == spec.clips.size()) continue;  // the last clip's transition leads nowhere
    const int k = video_frame_count(c.transition.seconds, spec.fps);
    const int next_n = video_frame_count(spec.clips[i + 1].duration, spec.fps);
    const int in_k = i ? video_frame_count(spec.clips[i - 1].transition.seconds, spec.fps) : 0;
    const int next_out = i + 2 < spec.clips.size() ? video_frame_count(spec.clips[i + 1].transition.seconds, spec.fps) : 0;
    if (k > 0 && (in_k + k > n || k + next_out > next_n))
      r.add(c.pointer + "/transition", "a transition of " + std::to_string(k) +
                                           " frames is longer than a clip it joins (this clip has " + std::to_string(n) +
                                           " frames, " + std::to_string(in_k) + " already in its incoming transition; "
                                           "the next has " + std::to_string(next_n) + ")");
  }
}

}  // namespace

int video_frame_count(double seconds, int fps) { return static_cast<int>(std::lround(seconds * fps)); }

bool named_video_motion(const std::string& name, VideoMotion& out) {
  static const std::map<std::string, std::pair<VideoBox, VideoBox>> kMotions = {
      {"none", {{0, 0, 1, 1}, {0, 0, 1, 1}}},
      {"zoom-in", {{0, 0, 1, 1}, {0.1, 0.1, 0.9, 0.9}}},
      {"zoom-out", {{0.1, 0.1, 0.9, 0.9}, {0, 0, 1, 1}}},
      {"pan-left", {{0.2, 0, 1, 1}, {0, 0, 0.8, 1}}},
      {"pan-right", {{0, 0, 0.8, 1}, {0.2, 0, 1, 1}}},
      {"pan-up", {{0, 0.2, 1, 1}, {0, 0, 1, 0.8}}},
      {"pan-down", {{0, 0, 1, 0.8}, {0, 0.2, 1, 1}}},
  };
  const auto it = kMotions.find(name);
  if (it == kMotions.end()) return false;
  out = {name, it->second.first, it->second.second, "linear"};
  return true;
}

VideoSpec read_video_spec(const json& video, const std::filesystem::path& base_dir, const std::vector<BatchTask>& tasks,
                          InputChecks* checks, std::vector<BatchProblem>& problems) {
  VideoReader r{{problems}, base_dir, checks};
  VideoSpec spec;
  if (!r.object(video, "/video", {"size", "fps", "crf", "default", "clips", "audio", "captions"})) return spec;
  read_size(r, video, spec);
  r.integer(video, "/video", "fps", 1, 240, spec.fps);
  r.integer(video, "/video", "crf", 0, 51, spec.crf);
  VideoClip dflt;
  if (video.contains("default") && r.object(video["default"], "/video/default", {"duration", "motion", "transition"})) {
    dflt.pointer = "/video/default";
    r.clip_settings(video["default"], "/video/default", dflt);
  }
  read_clips(r, video, tasks, dflt, spec);
  r.audio(video, spec);
  r.captions(video, spec);
  check_timing(r, spec);
  return spec;
}

}  // namespace sdxl
