#include "batch/manifest.h"

#include <chrono>
#include <ctime>
#include <regex>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/input_text.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "batch/task_keys.h"

namespace sdxl {
namespace {

nlohmann::json to_json(const ManifestEntry& e) {
  const GenerationParams& p = e.params;
  nlohmann::json j = {{"task", e.task}, {"index", e.index}, {"seed", e.seed}, {"file", e.file}, {"sha256", e.sha256},
          {"seconds", e.seconds}, {"model", e.model}, {"finished", e.finished}, {"params", params_to_manifest(p)}};
  if (!e.unet_precision.empty()) j["unet_precision"] = e.unet_precision;  // absent = the model's dtype
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
  if (j.contains("params")) params_from_manifest(j["params"], e.params);
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
