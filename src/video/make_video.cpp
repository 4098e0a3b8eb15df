#include "video/make_video.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <set>
#include <thread>
#include <cstdio>
#include <map>
#include <optional>

#include "batch/manifest.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/run_lock.h"
#include "core/sha256.h"
#include "core/subprocess.h"
#include "image/png_reader.h"
#include "video/ffmpeg_video.h"
#include "video/video_plan.h"

namespace sdxl {

namespace fs = std::filesystem;

namespace {

// The folder of the segments, inside the output folder.
constexpr const char* kSegmentsDir = ".video-segments";
// Raised when what a segment's bytes depend on changes without showing in its key.
constexpr const char* kSegmentFormat = "sdxl-batch video segment 1";

struct ClipSource {
  fs::path png;
  std::string sha256;
};

struct Segment {
  int clip = 0;             // the clip, or for a transition the clip it leads into
  bool transition = false;
  int first = 0, count = 0;  // a clip's frames [first, first + count); a transition's k frames
  std::string hash;
  fs::path file;
};

std::string sha256_hex_of(const std::string& text) {
  return sha256_hex({reinterpret_cast<const std::uint8_t*>(text.data()), text.size()});
}

std::string fmt_double(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// Each clip's PNG: a file clip's own, a task clip's as the run's manifest records it. Clips
// whose image is not there are listed in `missing`.
std::vector<ClipSource> clip_sources(const VideoSpec& spec, const fs::path& out_dir, std::vector<std::string>& missing) {
  const Manifest manifest(out_dir / "manifest.jsonl");
  std::vector<ClipSource> out;
  for (const VideoClip& c : spec.clips) {
    ClipSource s;
    if (c.task.empty()) {
      s.png = c.image;
    } else if (const auto e = manifest.find(c.task, c.index); !e) {
      missing.push_back(c.task + "#" + std::to_string(c.index) + " (" + c.pointer + "): not made yet (or failed)");
    } else {
      s.png = out_dir / e->file;
    }
    if (!s.png.empty()) {
      const auto sha = sha256_file_hex(s.png);
      if (!sha) missing.push_back((c.task.empty() ? c.image : c.task + "#" + std::to_string(c.index)) + " (" +
                                  c.pointer + "): '" + s.png.string() + "' cannot be read");
      else s.sha256 = *sha;
    }
    out.push_back(s);
  }
  return out;
}

// What a clip's frames depend on.
std::string clip_key(const VideoSpec& spec, const std::vector<ClipSource>& src, int c) {
  const VideoClip& clip = spec.clips[static_cast<size_t>(c)];
  const VideoMotion& m = clip.motion;
  std::string k = "src=" + src[static_cast<size_t>(c)].sha256 + " n=" +
                  std::to_string(video_frame_count(clip.duration, spec.fps)) + " ease=" + m.ease + " box=";
  for (const VideoBox& b : {m.from, m.to})
    k += fmt_double(b.x0) + "," + fmt_double(b.y0) + "," + fmt_double(b.x1) + "," + fmt_double(b.y1) + ";";
  return k;
}

std::optional<BurnedCaption> burned_caption(const VideoSpec& spec, int c, const std::string& family) {
  const std::string& text = spec.clips[static_cast<size_t>(c)].caption;
  if (!spec.captions.burn_in || text.empty()) return std::nullopt;
  return BurnedCaption{text, family, spec.captions.font.empty() ? "" : "fonts", spec.captions.size,
                       spec.captions.position};
}

// The segments in play order: the transition into clip c (if any), then clip c's own frames.
std::vector<Segment> plan_segments(const VideoSpec& spec, const VideoTimeline& t, const std::vector<ClipSource>& src,
                                   const std::string& common, const std::string& font_key, const fs::path& dir) {
  std::vector<Segment> out;
  auto caption_key = [&](int c) {
    const std::string& text = spec.clips[static_cast<size_t>(c)].caption;
    return spec.captions.burn_in && !text.empty() ? " caption=" + text + " font=" + font_key : std::string();
  };
  for (int c = 0; c < static_cast<int>(spec.clips.size()); ++c) {
    const ClipTiming& ct = t.clips[static_cast<size_t>(c)];
    if (ct.in_overlap > 0) {
      const std::string& kind = spec.clips[static_cast<size_t>(c - 1)].transition.kind;
      Segment s{c, true, 0, ct.in_overlap, "", {}};
      s.hash = sha256_hex_of(common + " transition=" + kind + " k=" + std::to_string(ct.in_overlap) + " a=" +
                             clip_key(spec, src, c - 1) + " b=" + clip_key(spec, src, c) + caption_key(c));
      out.push_back(s);
    }
    const int first = ct.in_overlap, count = ct.frames - ct.in_overlap - ct.out_overlap;
    if (count > 0) {
      Segment s{c, false, first, count, "", {}};
      s.hash = sha256_hex_of(common + " clip " + clip_key(spec, src, c) + " frames=" + std::to_string(first) + "+" +
                             std::to_string(count) + caption_key(c));
      out.push_back(s);
    }
  }
  for (Segment& s : out) s.file = dir / ("seg-" + s.hash.substr(0, 32) + ".mp4");
  return out;
}

// Decoded sources, the last two kept (a transition needs its two clips).
class SourceCache {
 public:
  const RgbImage& get(const fs::path& png) {
    for (auto& [p, img] : kept_)
      if (p == png) return img;
    if (kept_.size() == 2) kept_.erase(kept_.begin());
    kept_.emplace_back(png, read_png_rgb(png, "video clip image"));
    return kept_.back().second;
  }

 private:
  std::vector<std::pair<fs::path, RgbImage>> kept_;
};

// Removes a temporary file unless released (the output is then in place).
struct TempFile {
  fs::path path;
  ~TempFile() {
    std::error_code ec;
    if (!path.empty()) fs::remove(path, ec);
  }
};

// Encodes one segment under a temporary name, then renames it into place.
void encode_segment(const VideoSpec& spec, const VideoTimeline& t, const std::vector<ClipSource>& src,
                    const Segment& seg, const std::string& family, SourceCache& cache,
                    const std::function<void()>& on_frame) {
  TempFile tmp{seg.file.parent_path() / ("." + seg.file.filename().string() + ".tmp")};
  SegmentEncoder enc(tmp.path, seg.file.parent_path(), spec.width, spec.height, spec.fps, spec.crf,
                     burned_caption(spec, seg.clip, family));
  const auto c = static_cast<size_t>(seg.clip);
  auto frame_of = [&](size_t clip, int i) {
    const RgbImage& img = cache.get(src[clip].png);
    return render_clip_frame(img.rgb.data(), img.width, img.height, spec.clips[clip].motion, i,
                             t.clips[clip].frames, spec.width, spec.height);
  };
  for (int j = 0; j < seg.count; ++j) {
    if (seg.transition) {
      const int prev_n = t.clips[c - 1].frames;
      const auto a = frame_of(c - 1, prev_n - seg.count + j);
      enc.write_frame(blend_transition(spec.clips[c - 1].transition.kind, a, frame_of(c, j), j, seg.count));
    } else {
      enc.write_frame(frame_of(c, seg.first + j));
    }
    on_frame();
  }
  enc.finish();
  fs::rename(tmp.path, seg.file);
  tmp.path.clear();
}

// The caption font's family and what names it in a segment's key; links it into the segments'
// fonts folder, from which libass loads it.
std::pair<std::string, std::string> caption_font(const VideoSpec& spec, const fs::path& dir) {
  if (!spec.captions.burn_in) return {"", ""};
  if (spec.captions.font.empty()) return {"Noto Sans CJK SC", "default Noto Sans CJK SC"};
  const fs::path font = spec.captions.font;
  const auto sha = sha256_file_hex(font);
  if (!sha) throw UsageError("caption font '" + font.string() + "' cannot be read");
  const fs::path fonts = dir / "fonts";
  fs::create_directories(fonts);
  const fs::path link = fonts / (sha->substr(0, 16) + font.extension().string());
  std::error_code ec;
  if (!fs::is_symlink(link, ec) || fs::read_symlink(link, ec) != font) {
    fs::remove(link, ec);
    fs::create_symlink(font, link);
  }
  const std::string family = font_family(font);
  return {family, family + " " + *sha + " size=" + std::to_string(spec.captions.size) + " at=" +
                      spec.captions.position};
}

// Encodes the segments whose file is not there yet, on up to four threads (each segment once, even
// when two clips make the same one); progress is reported one call at a time.
void encode_missing(const VideoSpec& spec, const VideoTimeline& t, const std::vector<ClipSource>& src,
                    const std::vector<Segment>& segs, const std::string& family,
                    const std::function<void(const VideoProgress&)>& on_progress, VideoOutcome& r) {
  std::vector<const Segment*> pending;
  std::set<fs::path> planned;
  VideoProgress p;
  for (const Segment& s : segs) {
    if (fs::exists(s.file) || !planned.insert(s.file).second) {
      ++r.segments_reused;
      continue;
    }
    pending.push_back(&s);
    p.frames_total += s.count;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::mutex mu;
  std::exception_ptr failure;
  std::atomic<size_t> next{0};
  auto on_frame = [&] {
    const std::lock_guard<std::mutex> lock(mu);
    ++p.frames_done;
    p.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    p.eta_s = p.elapsed_s / p.frames_done * (p.frames_total - p.frames_done);
    if (on_progress && (p.frames_done % 10 == 0 || p.frames_done == p.frames_total)) on_progress(p);
  };
  auto worker = [&] {
    SourceCache cache;
    for (size_t i; (i = next++) < pending.size();) {
      try {
        encode_segment(spec, t, src, *pending[i], family, cache, on_frame);
        const std::lock_guard<std::mutex> lock(mu);
        ++(pending[i]->transition ? r.transitions_encoded : r.clips_encoded);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mu);
        if (!failure) failure = std::current_exception();
        next = pending.size();
      }
    }
  };
  const size_t threads = std::min<size_t>({pending.size(), std::max(1U, std::thread::hardware_concurrency()), 4});
  std::vector<std::thread> pool;
  for (size_t k = 1; k < threads; ++k) pool.emplace_back(worker);
  worker();
  for (std::thread& th : pool) th.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace

VideoOutcome make_video(const BatchFile& batch, const VideoRequest& req) {
  if (!batch.video) throw UsageError("batch file '" + batch.path.string() + "' has no \"video\" section (docs/video.md)");
  const VideoSpec& spec = *batch.video;
  VideoOutcome r;
  const fs::path out_dir = absolute_normal(req.out_dir);  // ffmpeg runs in the segments' folder
  const std::vector<ClipSource> src = clip_sources(spec, out_dir, r.missing);
  if (!r.missing.empty()) return r;
  fs::create_directories(out_dir);  // a video of file clips alone needs no run before it
  RunLock lock(out_dir / ".sdxl-batch.lock");
  const fs::path dir = out_dir / kSegmentsDir;
  fs::create_directories(dir);
  const VideoTimeline t = plan_timeline(spec);
  const auto [family, font_key] = caption_font(spec, dir);
  const std::string common = std::string(kSegmentFormat) + " " + ffmpeg_version() + " size=" +
                             std::to_string(spec.width) + "x" + std::to_string(spec.height) +
                             " fps=" + std::to_string(spec.fps) + " crf=" + std::to_string(spec.crf);
  const std::vector<Segment> segs = plan_segments(spec, t, src, common, font_key, dir);
  encode_missing(spec, t, src, segs, family, req.on_progress, r);
  r.frames = t.total_frames;
  r.seconds = static_cast<double>(t.total_frames) / spec.fps;
  r.video = absolute_normal(req.video_path.empty() ? out_dir / "video.mp4" : req.video_path);
  r.srt = fs::path(r.video).replace_extension(".srt");
  std::vector<fs::path> files;
  for (const Segment& s : segs) files.push_back(s.file);
  TempFile tmp{r.video.parent_path() / ("." + r.video.filename().string() + ".tmp")};
  join_segments(files, dir / "concat.txt", tmp.path, r.seconds, spec.audio);
  write_file_atomic(r.srt, captions_srt(spec, t));
  fs::rename(tmp.path, r.video);
  tmp.path.clear();
  spdlog::info("video: {} clip segment(s) and {} transition(s) encoded, {} reused; {} frames, {:.2f} s -> {}",
               r.clips_encoded, r.transitions_encoded, r.segments_reused, r.frames, r.seconds, r.video.string());
  return r;
}

}  // namespace sdxl
