// upscale_images (sdxl_batch.h): existing PNGs brought to a frame by an upscaler folder or LANCZOS,
// resumable through out_dir/manifest.jsonl, under the folder's lock, with report.json.
#include <nlohmann/json.hpp>
#include <sdxl_batch/sdxl_batch.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "api/boundary.h"
#include "batch/generation_params.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/run_lock.h"
#include "core/sha256.h"
#include "image/png_reader.h"
#include "image/png_writer.h"
#include "image/frame_upscale.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace sdxl::api {
namespace {


std::vector<fs::path> input_pngs(const std::vector<std::string>& inputs) {
  std::vector<fs::path> out;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<fs::path> found;
      for (const auto& e : fs::directory_iterator(in, ec))
        if (e.is_regular_file() && e.path().extension() == ".png") found.push_back(e.path());
      std::sort(found.begin(), found.end());
      out.insert(out.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(in, ec)) {
      out.emplace_back(in);
    } else {
      throw UsageError("upscale input '" + in + "': no such PNG file or folder");
    }
  }
  if (out.empty()) throw UsageError("upscale: no PNG among the inputs");
  std::set<std::string> names;
  for (const fs::path& p : out)
    if (!names.insert(p.filename().string()).second)
      throw UsageError("upscale: two inputs are named '" + p.filename().string() + "' (one output folder)");
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

// The manifest's lines of earlier runs: key (source sha256 + settings) -> output file.
std::map<std::string, std::string> read_done(const fs::path& manifest) {
  std::map<std::string, std::string> done;
  std::ifstream in(manifest);
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("key") && j.contains("file") && j["key"].is_string() && j["file"].is_string())
      done[j["key"].get<std::string>()] = j["file"].get<std::string>();
  }
  return done;
}

sdxl_batch::UpscaleResult upscale_images_impl(const sdxl_batch::UpscaleOptions& o) {
  const FrameSpec spec = frame_spec(o);
  const std::vector<fs::path> sources = input_pngs(o.inputs);
  if (o.out_dir.empty()) throw UsageError("upscale: --out is required");
  const fs::path out(o.out_dir);
  fs::create_directories(out);
  const RunLock lock(out / ".sdxl-batch.lock");
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
      const std::string sha = sha256_file_hex(src).value_or("");
      const std::string key = sha + "|" + settings;
      if (auto it = done.find(key); it != done.end() && it->second == file && fs::is_regular_file(out / file)) {
        ++r.skipped;
        continue;
      }
      const RgbImage img = read_png_rgb(src, "upscale input");
      int w = 0, h = 0;
      const std::vector<std::uint8_t> frame = upscaler.make(img.rgb.data(), img.width, img.height, spec, w, h);
      write_png(out / file, w, h, 3, frame.data(), output_text(src, o, name));
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
