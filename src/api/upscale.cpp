// upscale_images (sdxl_batch.h): existing PNGs brought to a frame by an upscaler folder or LANCZOS,
// resumable through out_dir/manifest.jsonl, under the folder's lock, with report.json.
#include <nlohmann/json.hpp>
#include <sdxl_batch/sdxl_batch.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "api/boundary.h"
#include "batch/generation_params.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/json_shape.h"
#include "core/run_lock.h"
#include "core/sha256.h"
#include "image/frame_upscale.h"
#include "image/png_reader.h"
#include "image/png_writer.h"
#include "scheduler/output_folder.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace sdxl::api {
namespace {

// The largest input PNG read (as an init image: image/png_reader.cpp) and the largest manifest.
constexpr std::uint64_t kMaxInputPngBytes = 256ull << 20;
constexpr std::uint64_t kMaxManifestBytes = 1ull << 30;

// The inputs' PNGs: files as given, a folder's *.png (sorted, one level deep). Only regular files
// are taken (core/input_file.h): a FIFO or device named like a PNG would block the read or never end.
std::vector<fs::path> input_pngs(const std::vector<std::string>& inputs) {
  std::vector<fs::path> out;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<fs::path> found;
      for (const auto& e : fs::directory_iterator(in, ec)) {
        if (e.path().extension() != ".png") continue;
        if (e.is_regular_file(ec)) found.push_back(e.path());
        else spdlog::warn("upscale: skipped '{}': not a regular file", e.path().string());
      }
      std::sort(found.begin(), found.end());
      out.insert(out.end(), found.begin(), found.end());
    } else if (const std::string why = input_file_problem(in, kMaxInputPngBytes); !why.empty()) {
      throw UsageError("upscale input '" + in + "' " + why + " (give PNG files or folders of PNGs)");
    } else {
      out.emplace_back(in);
    }
  }
  if (out.empty()) throw UsageError("upscale: no PNG among the inputs");
  std::set<std::string> names;
  for (const fs::path& p : out)
    if (!names.insert(p.filename().string()).second)
      throw UsageError("upscale: two inputs are named '" + p.filename().string() + "' (one output folder)");
  return out;
}

// `p` absolute with every link of its existing part resolved (as the system will find it).
fs::path resolved(const fs::path& p) {
  std::error_code ec;
  const fs::path r = fs::weakly_canonical(absolute_normal(p), ec);
  return ec ? absolute_normal(p) : r;
}

// The output folder must not be where an input is: the frames would replace the originals, and a
// rerun would upscale its own results. Refused (UsageError, both paths named) when --out is a file,
// when it resolves to the folder of an input (a folder given, or a file's folder), or when an
// output file would be an input file (a link to it, or a link to the output folder). An --out inside
// or above an input folder is allowed: folders are read one level deep, so its frames are never
// taken as inputs.
fs::path checked_out_dir(const std::string& out_dir, const std::vector<std::string>& inputs,
                         const std::vector<fs::path>& sources) {
  if (out_dir.empty()) throw UsageError("upscale: --out is required");
  const fs::path out(out_dir);
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec))
    throw UsageError("upscale --out '" + out_dir + "' is a file, not a folder (give a folder for the frames)");
  const fs::path out_real = resolved(out);
  for (const std::string& in : inputs) {
    const fs::path folder = fs::is_directory(in, ec) ? fs::path(in) : absolute_normal(in).parent_path();
    if (resolved(folder) == out_real)
      throw UsageError("upscale --out '" + out_dir + "' is the folder of the input '" + in +
                       "': the frames would overwrite the originals and a rerun would upscale them again "
                       "(give another --out folder)");
  }
  for (const fs::path& src : sources)
    if (fs::exists(out / src.filename(), ec) && fs::equivalent(out / src.filename(), src, ec))
      throw UsageError("upscale --out '" + out_dir + "': its '" + src.filename().string() + "' is the input '" +
                       src.string() + "' (through a link): it would be overwritten (give another --out folder)");
  return out;
}

FrameSpec frame_spec(const sdxl_batch::UpscaleOptions& o) {
  FrameSpec spec;
  if (o.scale != 0 || (o.width == 0 && o.height == 0)) {
    if (!(o.scale > 0) || !std::isfinite(o.scale) || o.scale > 16)
      throw UsageError("--upscale " + std::to_string(o.scale) + ": must be a number above 0 and at most 16");
    spec.scale = o.scale;
    return spec;
  }
  if (o.width < 8 || o.height < 8 || o.width > kMaxFrameSide || o.height > kMaxFrameSide)
    throw UsageError("--upscale-size " + std::to_string(o.width) + "x" + std::to_string(o.height) +
                     ": each side must be 8.." + std::to_string(kMaxFrameSide));
  spec.width = o.width;
  spec.height = o.height;
  spec.fit = parse_frame_fit(o.fit, "--upscale-fit");
  return spec;
}

std::string number_text(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// The source's text chunks, "parameters" extended with A1111's postprocessing fields.
PngText output_text(const fs::path& source, const sdxl_batch::UpscaleOptions& o, const std::string& upscaler_name) {
  PngText text = read_png_text(source);
  const std::string fields = postprocess_upscale_fields(o.scale, o.width, o.height, o.fit, upscaler_name);
  auto it = std::find_if(text.begin(), text.end(), [](const auto& kv) { return kv.first == "parameters"; });
  if (it == text.end())
    text.emplace_back("parameters", fields);
  else
    it->second += (it->second.empty() ? "" : ", ") + fields;
  return text;
}

// The manifest's lines of earlier runs: key (source sha256 + settings) -> output file. A line nested
// too deep to walk safely is skipped as a torn one is.
std::map<std::string, std::string> read_done(const fs::path& manifest) {
  std::map<std::string, std::string> done;
  std::error_code ec;
  if (!fs::exists(manifest, ec)) return done;
  std::istringstream in(read_input_file(manifest, "upscale manifest", kMaxManifestBytes));
  for (std::string line; std::getline(in, line);) {
    if (check_json_shape(line).too_deep) continue;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("key") && j.contains("file") && j["key"].is_string() && j["file"].is_string())
      done[j["key"].get<std::string>()] = j["file"].get<std::string>();
  }
  return done;
}

// Why the frame of a width x height image is out of the batch key's bounds (generation_params.h:
// each side 8..kMaxFrameSide), naming the flag; "" when it is within them.
std::string frame_problem(const sdxl_batch::UpscaleOptions& o, const FrameSpec& spec, int width, int height) {
  UpscaleUse u;
  u.model = o.upscaler;
  u.scale = spec.scale;
  u.width = spec.width;
  u.height = spec.height;
  u.fit = o.fit;
  std::string key;
  const std::string why = upscale_problem(u, width, height, key);
  if (why.empty()) return "";
  return (key == "scale" ? "--upscale " + number_text(spec.scale) : "--upscale-" + key) + " " + why;
}

// One source to out_dir/file; throws for this image alone (IoError: for the output folder).
void upscale_one(const fs::path& src, const std::string& data, const sdxl_batch::UpscaleOptions& o,
                 const FrameSpec& spec, FrameUpscaler& upscaler, const fs::path& out_file, int& w, int& h) {
  const RgbImage img = decode_png_rgb(data, src, "upscale input");
  if (const std::string why = frame_problem(o, spec, img.width, img.height); !why.empty()) throw TaskError(why);
  const std::vector<std::uint8_t> frame = upscaler.make(img.rgb.data(), img.width, img.height, spec, w, h);
  write_png(out_file, w, h, 3, frame.data(), output_text(src, o, upscaler.name()));
}

sdxl_batch::UpscaleResult upscale_images_impl(const sdxl_batch::UpscaleOptions& o) {
  const FrameSpec spec = frame_spec(o);
  const std::vector<fs::path> sources = input_pngs(o.inputs);
  const fs::path out = checked_out_dir(o.out_dir, o.inputs, sources);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw IoError("cannot create the output folder '" + out.string() + "': " + ec.message());
  const RunLock lock(out / ".sdxl-batch.lock");
  check_own_files(out);  // manifest.jsonl: a regular file of its own, not a link or a FIFO
  FrameUpscaler upscaler(canonical_upscale_model(o.upscaler), o.device, o.tile);  // "lanczos" as generate takes it
  const std::string& name = upscaler.name();
  const std::string settings = name + "|" + upscaler.weights_sha256() + "|" + number_text(spec.scale) + "|" +
                               std::to_string(spec.width) + "x" + std::to_string(spec.height) + "|" + o.fit;
  const fs::path manifest = out / "manifest.jsonl";
  const auto done = o.force ? std::map<std::string, std::string>{} : read_done(manifest);
  sdxl_batch::UpscaleResult r;
  const auto t0 = std::chrono::steady_clock::now();
  for (const fs::path& src : sources) {
    const std::string file = src.filename().string();
    try {
      const std::string data = read_input_file(src, "upscale input", kMaxInputPngBytes);
      const std::string sha = sha256_hex({reinterpret_cast<const std::uint8_t*>(data.data()), data.size()});
      const std::string key = sha + "|" + settings;
      if (auto it = done.find(key); it != done.end() && it->second == file && fs::is_regular_file(out / file)) {
        ++r.skipped;
        continue;
      }
      int w = 0, h = 0;
      upscale_one(src, data, o, spec, upscaler, out / file, w, h);
      append_line_durable(manifest, json({{"key", key}, {"source", fs::absolute(src).string()}, {"source_sha256", sha},
                                          {"file", file}, {"upscaler", name}, {"width", w}, {"height", h}})
                                            .dump() +
                                        "\n");
      ++r.written;
      spdlog::info("upscale: {} -> {} ({}x{})", src.string(), (out / file).string(), w, h);
    } catch (const IoError&) {
      throw;  // the output folder cannot be written: the others would fail the same way
    } catch (const std::exception& e) {
      ++r.failed;
      r.failures.push_back(src.string() + ": " + e.what());
      spdlog::error("upscale: {}: {}", src.string(), e.what());
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  json failures = r.failures;
  write_file_atomic(out / "report.json", json({{"command", "upscale"}, {"upscaler", name}, {"written", r.written},
                                               {"skipped", r.skipped}, {"failed", r.failed},
                                               {"failures", failures}, {"seconds", secs}})
                                                 .dump(1) +
                                             "\n");
  return r;
}

}  // namespace
}  // namespace sdxl::api

namespace sdxl_batch {

UpscaleResult upscale_images(const UpscaleOptions& options) {
  return sdxl::api::guarded([&] { return sdxl::api::upscale_images_impl(options); });
}

}  // namespace sdxl_batch
