#include "video/ffmpeg_video.h"

#include <cmath>
#include <cstdio>
#include <fstream>

#include "core/atomic_file.h"
#include "core/error.h"

namespace sdxl {

namespace fs = std::filesystem;

namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6f", v);
  return buf;
}

std::string first_line(const std::string& s) {
  const size_t end = s.find('\n');
  return end == std::string::npos ? s : s.substr(0, end);
}

[[noreturn]] void ffmpeg_failed(const std::string& what, const ProgramResult& r) {
  throw IoError("ffmpeg failed to " + what + " (status " + std::to_string(r.status) + "): " + r.err.substr(0, 2000));
}

// The subtitles filter (libass) for one caption shown on every frame. libass sizes text against
// a 288-line script for SRT input, so the pixel size is scaled to it.
std::string subtitles_filter(const fs::path& srt, const BurnedCaption& c, int height) {
  const int alignment = c.position == "top" ? 8 : c.position == "middle" ? 5 : 2;  // ASS numpad
  const double font_size = c.size_px * 288.0 / height;
  std::string style = "FontName=" + c.font_family + ",FontSize=" + number(font_size) +
                      ",Alignment=" + std::to_string(alignment) + ",Outline=1.5,Shadow=0.5,MarginV=20";
  std::string f = "subtitles=filename=" + srt.filename().string();
  if (!c.fonts_dir.empty()) f += ":fontsdir=" + c.fonts_dir;
  return f + ":force_style='" + style + "',";
}

}  // namespace

SegmentEncoder::SegmentEncoder(const fs::path& out, const fs::path& work_dir, int width, int height, int fps, int crf,
                               const std::optional<BurnedCaption>& caption)
    : out_(out), frame_bytes_(static_cast<size_t>(width) * static_cast<size_t>(height) * 3) {
  std::string filters;
  if (caption) {
    // Names the filter reads are kept free of the characters its syntax gives meaning to.
    for (const std::string& s : {caption->font_family, caption->fonts_dir})
      if (s.find_first_of("':,;[]\\=") != std::string::npos)
        throw UsageError("caption font '" + s + "': its name has a character the subtitles filter cannot take");
    srt_ = work_dir / (out.filename().string() + ".srt");
    write_file_atomic(srt_, "1\n00:00:00,000 --> 99:00:00,000\n" + caption->text + "\n\n");
    filters = subtitles_filter(srt_, *caption, height);
  }
  filters += "scale=out_color_matrix=bt709:out_range=tv,format=yuv420p";
  const std::vector<std::string> argv = {
      "ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s",
      std::to_string(width) + "x" + std::to_string(height), "-r", std::to_string(fps), "-i", "-", "-vf", filters,
      "-c:v", "libx264", "-preset", "medium", "-crf", std::to_string(crf), "-pix_fmt", "yuv420p",
      "-colorspace", "bt709", "-color_primaries", "bt709", "-color_trc", "bt709", "-color_range", "tv",
      "-an", "-f", "mp4", out.string()};
  proc_ = std::make_unique<Subprocess>(argv, /*feed_stdin=*/true, work_dir.string());
}

SegmentEncoder::~SegmentEncoder() {
  std::error_code ec;
  if (!srt_.empty()) fs::remove(srt_, ec);
}

void SegmentEncoder::write_frame(const std::vector<std::uint8_t>& rgb) {
  if (rgb.size() != frame_bytes_) throw std::logic_error("a frame of the wrong size");
  proc_->write(rgb.data(), rgb.size());
}

void SegmentEncoder::finish() {
  const ProgramResult r = proc_->finish();
  if (r.status != 0) ffmpeg_failed("encode '" + out_.string() + "'", r);
}

void join_segments(const std::vector<fs::path>& segments, const fs::path& list_file, const fs::path& out,
                   double seconds, const std::optional<VideoAudio>& audio) {
  std::string list = "ffconcat version 1.0\n";
  for (const fs::path& s : segments) list += "file '" + s.filename().string() + "'\n";  // names are hashes
  write_file_atomic(list_file, list);
  std::vector<std::string> argv = {"ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y",
                                   "-f", "concat", "-safe", "0", "-i", list_file.string()};
  if (audio) {
    argv.insert(argv.end(), {"-i", audio->file, "-map", "0:v:0", "-map", "1:a:0"});
    std::string af = "volume=" + number(audio->volume) + ",atrim=0:" + number(seconds) + ",asetpts=PTS-STARTPTS";
    if (audio->fade_out > 0) {
      const double d = std::min(audio->fade_out, seconds);
      af += ",afade=t=out:st=" + number(seconds - d) + ":d=" + number(d);
    }
    argv.insert(argv.end(), {"-af", af, "-c:a", "aac", "-b:a", "192k"});
  }
  argv.insert(argv.end(), {"-c:v", "copy", "-movflags", "+faststart", "-f", "mp4", out.string()});
  const ProgramResult r = run_program(argv);
  if (r.status != 0) ffmpeg_failed("join the segments into '" + out.string() + "'", r);
}

std::string font_family(const fs::path& font) {
  const ProgramResult r = run_program({"fc-scan", "--format", "%{family[0]}\n", font.string()});
  const std::string family = first_line(r.out);
  if (r.status != 0 || family.empty())
    throw UsageError("caption font '" + font.string() + "' is not a font fontconfig can read");
  return family;
}

std::string ffmpeg_version() {
  const ProgramResult r = run_program({"ffmpeg", "-hide_banner", "-version"});
  if (r.status != 0) ffmpeg_failed("start (ffmpeg -version)", r);
  return first_line(r.out);
}

}  // namespace sdxl
