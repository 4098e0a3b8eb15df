#include "batch/manifest.h"

#include <chrono>
#include <ctime>
#include <regex>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/input_text.h"
#include "core/atomic_file.h"
#include "core/error.h"

namespace sdxl {
namespace {

nlohmann::json to_json(const ManifestEntry& e) {
  const GenerationParams& p = e.params;
  nlohmann::json j = {{"task", e.task}, {"index", e.index}, {"seed", e.seed}, {"file", e.file}, {"sha256", e.sha256},
          {"seconds", e.seconds}, {"model", e.model}, {"finished", e.finished},
          {"params", {{"prompt", p.prompt}, {"negative", p.negative_prompt}, {"steps", p.steps}, {"cfg", p.cfg},
                      {"width", p.width}, {"height", p.height}, {"sampler", p.sampler}, {"schedule", p.schedule}}}};
  // LoRAs from --lora / the batch file (prompt tags are in the prompt): a rerun
  // with other LoRAs must not skip the image. Absent in older manifests = none.
  if (!p.loras.empty()) {
    nlohmann::json l = nlohmann::json::array();
    for (const auto& r : p.loras) l.push_back({{"name", r.name}, {"path", r.path.string()}, {"weight", r.weight}});
    j["params"]["loras"] = l;
  }
  if (p.clip_skip != 0) j["params"]["clip_skip"] = p.clip_skip;  // absent = not set
  if (!e.unet_precision.empty()) j["unet_precision"] = e.unet_precision;  // absent = the model's dtype
  // Every setting the resume check compares (scheduler/work_list.cpp same_settings)
  // must be here, or a rerun makes the image again; absent = the default.
  if (p.guidance_rescale != 0.0) j["params"]["guidance_rescale"] = p.guidance_rescale;
  if (!p.vae.empty()) j["params"]["vae"] = p.vae;
  if (!p.init_image.empty()) {
    j["params"]["init_image"] = p.init_image;
    j["params"]["strength"] = p.strength;
  }
  if (p.inpaint())
    j["params"]["mask"] = {{"file", p.mask}, {"sha256", p.mask_sha256}, {"blur", p.mask_blur},
                           {"area", p.inpaint_area}, {"padding", p.inpaint_padding}};
  for (const auto& c : p.controlnets)
    j["params"]["controlnets"].push_back(
        {{"model", c.model}, {"image", c.image}, {"strength", c.strength}, {"start", c.start}, {"end", c.end}});
  if (p.ip_adapter.on())
    j["params"]["ip_adapter"] = {
        {"model", p.ip_adapter.model}, {"images", p.ip_adapter.images}, {"scale", p.ip_adapter.scale}};
  if (p.hires_on())
    j["params"]["hires"] = {{"scale", p.hires.scale}, {"upscaler", p.hires.upscaler}, {"steps", p.hires.steps},
                            {"denoise", p.hires.denoise}};
  if (p.hires_uses_model()) j["params"]["hires"]["weights_sha256"] = p.hires.weights_sha256;
  if (p.upscale.on())
    j["params"]["upscale"] = {{"model", p.upscale.model}, {"scale", p.upscale.scale}, {"width", p.upscale.width},
                              {"height", p.upscale.height}, {"fit", p.upscale.fit},
                              {"weights_sha256", p.upscale.weights_sha256}};
  for (const auto& d : p.detailer)
    j["params"]["detailer"].push_back({{"detector", d.detector}, {"prompt", d.prompt}, {"negative", d.negative},
                                       {"confidence", d.confidence}, {"dilate", d.dilate}, {"blur", d.blur},
                                       {"denoise", d.denoise}, {"padding", d.padding}, {"max", d.max},
                                       {"steps", d.steps}, {"weights_sha256", d.weights_sha256}});
  if (!e.source_prompt.empty() && e.source_prompt != p.prompt) j["source_prompt"] = e.source_prompt;
  if (!e.characters.empty()) j["characters"] = e.characters;
  if (!e.style.empty()) j["style"] = e.style;
  if (!e.wildcards.empty()) j["wildcards"] = e.wildcards;
  return j;
}

ManifestEntry from_json(const nlohmann::json& j) {
  ManifestEntry e;
  e.task = j.at("task").get<std::string>();
  e.index = j.at("index").get<int>();
  e.seed = j.at("seed").get<std::int64_t>();
  e.file = j.at("file").get<std::string>();
  e.sha256 = j.at("sha256").get<std::string>();
  e.seconds = j.value("seconds", 0.0);
  e.model = j.value("model", "");
  e.unet_precision = j.value("unet_precision", "");
  e.finished = j.value("finished", "");
  if (j.contains("params")) {
    const auto& p = j["params"];
    e.params.prompt = p.value("prompt", "");
    e.params.negative_prompt = p.value("negative", "");
    e.params.steps = p.value("steps", 0);
    e.params.cfg = p.value("cfg", 0.0);
    e.params.width = p.value("width", 0);
    e.params.height = p.value("height", 0);
    e.params.sampler = p.value("sampler", "");
    e.params.schedule = p.value("schedule", "");
    e.params.clip_skip = p.value("clip_skip", 0);
    e.params.guidance_rescale = p.value("guidance_rescale", 0.0);
    e.params.vae = p.value("vae", "");
    e.params.init_image = p.value("init_image", "");
    e.params.strength = p.value("strength", GenerationParams{}.strength);
    if (p.contains("mask") && p["mask"].is_object()) {
      e.params.mask = p["mask"].value("file", "");
      e.params.mask_sha256 = p["mask"].value("sha256", "");
      e.params.mask_blur = p["mask"].value("blur", GenerationParams{}.mask_blur);
      e.params.inpaint_area = p["mask"].value("area", GenerationParams{}.inpaint_area);
      e.params.inpaint_padding = p["mask"].value("padding", GenerationParams{}.inpaint_padding);
    }
    if (p.contains("hires") && p["hires"].is_object()) {
      const auto& h = p["hires"];
      e.params.hires.scale = h.value("scale", 0.0);
      e.params.hires.upscaler = h.value("upscaler", GenerationParams{}.hires.upscaler);
      e.params.hires.steps = h.value("steps", 0);
      e.params.hires.denoise = h.value("denoise", GenerationParams{}.hires.denoise);
      e.params.hires.weights_sha256 = h.value("weights_sha256", "");
    }
    if (p.contains("upscale") && p["upscale"].is_object()) {
      const auto& u = p["upscale"];
      e.params.upscale.model = u.value("model", "");
      e.params.upscale.scale = u.value("scale", 0.0);
      e.params.upscale.width = u.value("width", 0);
      e.params.upscale.height = u.value("height", 0);
      e.params.upscale.fit = u.value("fit", UpscaleUse{}.fit);
      e.params.upscale.weights_sha256 = u.value("weights_sha256", "");
    }
    if (p.contains("controlnets") && p["controlnets"].is_array())
      for (const auto& c : p["controlnets"]) {
        ControlNetUse u;
        u.model = c.value("model", "");
        u.image = c.value("image", "");
        u.strength = c.value("strength", 1.0);
        u.start = c.value("start", 0.0);
        u.end = c.value("end", 1.0);
        e.params.controlnets.push_back(u);
      }
    if (p.contains("ip_adapter") && p["ip_adapter"].is_object()) {
      const auto& ip = p["ip_adapter"];
      e.params.ip_adapter.model = ip.value("model", "");
      e.params.ip_adapter.scale = ip.value("scale", 1.0);
      if (ip.contains("images") && ip["images"].is_array())
        for (const auto& f : ip["images"])
          if (f.is_string()) e.params.ip_adapter.images.push_back(f.get<std::string>());
    }
    if (p.contains("detailer") && p["detailer"].is_array())
      for (const auto& d : p["detailer"]) {
        if (!d.is_object()) continue;
        DetailerUse u;
        u.detector = d.value("detector", "");
        u.prompt = d.value("prompt", "");
        u.negative = d.value("negative", "");
        u.confidence = d.value("confidence", u.confidence);
        u.dilate = d.value("dilate", u.dilate);
        u.blur = d.value("blur", u.blur);
        u.denoise = d.value("denoise", u.denoise);
        u.padding = d.value("padding", u.padding);
        u.max = d.value("max", u.max);
        u.steps = d.value("steps", u.steps);
        u.weights_sha256 = d.value("weights_sha256", "");
        e.params.detailer.push_back(u);
      }
    if (p.contains("loras") && p["loras"].is_array())
      for (const auto& l : p["loras"]) {
        LoraRef r;
        r.name = l.value("name", "");
        r.path = l.value("path", "");
        r.weight = l.value("weight", 1.0);
        e.params.loras.push_back(r);
      }
  }
  e.params.seed = e.seed;
  return e;
}

}  // namespace

std::string utc_now_iso8601() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string manifest_file_name(int shard_index, int shard_count) {
  if (shard_count <= 1) return "manifest.jsonl";
  return "manifest-shard-" + std::to_string(shard_index) + "-of-" + std::to_string(shard_count) + ".jsonl";
}

bool is_manifest_file_name(const std::string& name) {
  static const std::regex re(R"(manifest(-shard-[0-9]+-of-[0-9]+)?\.jsonl)");
  return std::regex_match(name, re);
}

bool is_seeds_file_name(const std::string& name) {
  static const std::regex re(R"(seeds(-shard-[0-9]+-of-[0-9]+)?\.jsonl)");
  return std::regex_match(name, re);
}

namespace {

// seeds.jsonl beside manifest.jsonl; seeds-shard-K-of-N.jsonl beside manifest-shard-K-of-N.jsonl.
std::filesystem::path seeds_path_of(const std::filesystem::path& manifest) {
  const std::string name = manifest.filename().string();
  if (name.rfind("manifest-shard-", 0) == 0 && is_manifest_file_name(name))
    return manifest.parent_path() / ("seeds" + name.substr(std::string("manifest").size()));
  return manifest.parent_path() / "seeds.jsonl";
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Manifest::Manifest(std::filesystem::path path) : path_(std::move(path)), seeds_path_(seeds_path_of(path_)) {
  std::vector<std::filesystem::path> manifests{path_}, seeds{seeds_path_};
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(path_.parent_path().empty() ? "." : path_.parent_path(), ec)) {
    const std::string name = e.path().filename().string();
    if (is_manifest_file_name(name) && e.path().filename() != path_.filename()) manifests.insert(manifests.begin(), e.path());
    if (is_seeds_file_name(name) && e.path().filename() != seeds_path_.filename()) seeds.insert(seeds.begin(), e.path());
  }
  for (const auto& p : manifests) read_manifest_file(p);  // this run's own file last: it wins ties
  for (const auto& p : seeds) read_seeds_file(p);
}

void Manifest::read_manifest_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      ManifestEntry e = from_json(nlohmann::json::parse(line));
      auto it = latest_.find({e.task, e.index});
      if (it == latest_.end() || e.finished >= it->second.finished) latest_[{e.task, e.index}] = std::move(e);
    } catch (const std::exception&) {
      ++torn_lines_;  // a crash or a full disk mid-append tears at most that line
    }
  }
}

void Manifest::read_seeds_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) {
    try {
      const auto j = nlohmann::json::parse(line);
      const RecordedSeed r{j.at("base_seed").get<std::int64_t>(), j.value("at_ns", std::int64_t{0})};
      auto [it, fresh] = base_seeds_.try_emplace(j.at("task").get<std::string>(), r);
      if (!fresh && r.at_ns >= it->second.at_ns) it->second = r;
    } catch (const std::exception&) {
      // a torn line: its task's seed was not yet used by any image
    }
  }
}

std::optional<ManifestEntry> Manifest::find(const std::string& task, int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = latest_.find({task, index});
  if (it == latest_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::int64_t> Manifest::task_base_seed(const std::string& task) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = base_seeds_.find(task); it != base_seeds_.end()) return it->second.base;
  for (auto it = latest_.lower_bound({task, 0}); it != latest_.end() && it->first.first == task; ++it)
    return it->second.seed - it->second.index;
  return std::nullopt;
}

void Manifest::record_base_seed(const std::string& task, std::int64_t base) {
  std::lock_guard<std::mutex> lock(mu_);
  const RecordedSeed r{base, now_ns()};
  append_line_durable(seeds_path_,
                      nlohmann::json({{"task", task}, {"base_seed", base}, {"at_ns", r.at_ns}}).dump() + "\n");
  base_seeds_[task] = r;
}

size_t Manifest::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_.size();
}

std::vector<ManifestEntry> Manifest::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ManifestEntry> out;
  out.reserve(latest_.size());
  for (const auto& [key, e] : latest_) out.push_back(e);
  return out;
}

namespace {

// Every string of `j` as valid UTF-8 (core/input_text.h's valid_utf8).
void repair_utf8(nlohmann::json& j) {
  if (j.is_string()) j = valid_utf8(j.get_ref<const std::string&>());
  else if (j.is_structured())
    for (auto& v : j) repair_utf8(v);
}

}  // namespace

void Manifest::append(const ManifestEntry& e) {
  std::lock_guard<std::mutex> lock(mu_);
  // Text is checked as UTF-8 when it comes in; should a byte that is not get here, it is
  // written as U+FFFD rather than failing the image after its PNG exists.
  nlohmann::json j = to_json(e);
  repair_utf8(j);
  append_line_durable(path_, j.dump() + "\n");
  latest_[{e.task, e.index}] = e;
}

}  // namespace sdxl
