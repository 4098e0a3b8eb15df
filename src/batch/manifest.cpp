#include "batch/manifest.h"

#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>

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

Manifest::Manifest(std::filesystem::path path)
    : path_(std::move(path)), seeds_path_(path_.parent_path() / "seeds.jsonl") {
  std::ifstream in(path_);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      ManifestEntry e = from_json(nlohmann::json::parse(line));
      latest_[{e.task, e.index}] = std::move(e);
    } catch (const std::exception&) {
      ++torn_lines_;  // a crash or a full disk mid-append tears at most that line
    }
  }
  std::ifstream seeds(seeds_path_);
  while (std::getline(seeds, line)) {
    try {
      const auto j = nlohmann::json::parse(line);
      base_seeds_[j.at("task").get<std::string>()] = j.at("base_seed").get<std::int64_t>();
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
  if (auto it = base_seeds_.find(task); it != base_seeds_.end()) return it->second;
  for (auto it = latest_.lower_bound({task, 0}); it != latest_.end() && it->first.first == task; ++it)
    return it->second.seed - it->second.index;
  return std::nullopt;
}

void Manifest::record_base_seed(const std::string& task, std::int64_t base) {
  std::lock_guard<std::mutex> lock(mu_);
  append_line_durable(seeds_path_, nlohmann::json({{"task", task}, {"base_seed", base}}).dump() + "\n");
  base_seeds_[task] = base;
}

size_t Manifest::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_.size();
}

void Manifest::append(const ManifestEntry& e) {
  std::lock_guard<std::mutex> lock(mu_);
  append_line_durable(path_, to_json(e).dump() + "\n");
  latest_[{e.task, e.index}] = e;
}

}  // namespace sdxl
