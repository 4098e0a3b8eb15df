#include "sdxl/batch_file.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "sdxl/error.h"

namespace sdxl {
namespace {

using nlohmann::json;

constexpr int kMaxSteps = 200;
constexpr int kMaxCount = 1000;

// Collects problems instead of stopping at the first, so a user fixes a file in one go.
struct Checker {
  std::vector<BatchProblem>& problems;

  void add(const std::string& pointer, const std::string& msg) { problems.push_back({pointer, msg}); }

  void check_keys(const json& obj, const std::string& pointer, const std::set<std::string>& allowed) {
    for (const auto& [key, value] : obj.items()) {
      if (!allowed.count(key)) {
        std::string list;
        for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
        add(pointer + "/" + key, "unknown key (allowed here: " + list + ")");
      }
    }
  }
  bool get_string(const json& obj, const std::string& pointer, const char* key, std::string& out) {
    if (!obj.contains(key)) return false;
    if (!obj[key].is_string()) {
      add(pointer + "/" + key, "must be a string");
      return false;
    }
    out = obj[key].get<std::string>();
    return true;
  }
  bool get_int(const json& obj, const std::string& pointer, const char* key, long long lo, long long hi, long long& out) {
    if (!obj.contains(key)) return false;
    const json& v = obj[key];
    if (!v.is_number_integer()) {
      add(pointer + "/" + key, "must be an integer");
      return false;
    }
    long long x = v.get<long long>();
    if (x < lo || x > hi) {
      add(pointer + "/" + key, std::to_string(x) + " is out of range " + std::to_string(lo) + ".." + std::to_string(hi));
      return false;
    }
    out = x;
    return true;
  }
  bool get_number(const json& obj, const std::string& pointer, const char* key, double lo, double hi, double& out) {
    if (!obj.contains(key)) return false;
    const json& v = obj[key];
    if (!v.is_number()) {
      add(pointer + "/" + key, "must be a number");
      return false;
    }
    double x = v.get<double>();
    if (!(x >= lo && x <= hi)) {
      add(pointer + "/" + key, "is out of range " + std::to_string(lo) + ".." + std::to_string(hi));
      return false;
    }
    out = x;
    return true;
  }

  // Fields shared by /defaults and each task.
  void read_settings(const json& obj, const std::string& pointer, GenerationParams& p) {
    get_string(obj, pointer, "prompt", p.prompt);
    get_string(obj, pointer, "negative", p.negative_prompt);
    long long v = 0;
    if (get_int(obj, pointer, "steps", 1, kMaxSteps, v)) p.steps = static_cast<int>(v);
    if (get_int(obj, pointer, "width", 8, 16384, v)) {
      p.width = static_cast<int>(v);
      if (v % 8) add(pointer + "/width", "must be a multiple of 8");
    }
    if (get_int(obj, pointer, "height", 8, 16384, v)) {
      p.height = static_cast<int>(v);
      if (v % 8) add(pointer + "/height", "must be a multiple of 8");
    }
    get_number(obj, pointer, "cfg", 0.0, 100.0, p.cfg);
  }
};

}  // namespace

BatchFile parse_batch_text(const std::string& text, const std::filesystem::path& origin,
                           const GenerationParams& fallback, std::vector<BatchProblem>* problems_out) {
  std::vector<BatchProblem> problems;
  Checker ck{problems};
  BatchFile bf;
  bf.path = origin;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    problems.push_back({"", std::string("not valid JSON: ") + e.what()});
    if (problems_out) *problems_out = problems;
    return bf;
  }
  if (!j.is_object()) {
    ck.add("", "a batch file is a JSON object with \"version\" and \"tasks\"");
  } else {
    ck.check_keys(j, "", {"$schema", "version", "model", "output", "defaults", "tasks"});
    long long version = 1;
    if (!j.contains("version")) ck.add("/version", "is missing (write \"version\": 1)");
    else if (ck.get_int(j, "", "version", 1, 1, version)) bf.version = static_cast<int>(version);
    ck.get_string(j, "", "model", bf.model);
    if (j.contains("output")) {
      if (!j["output"].is_object()) ck.add("/output", "must be an object like {\"dir\": \"out\"}");
      else {
        ck.check_keys(j["output"], "/output", {"dir"});
        ck.get_string(j["output"], "/output", "dir", bf.output_dir);
      }
    }
    GenerationParams defaults = fallback;
    if (j.contains("defaults")) {
      if (!j["defaults"].is_object()) ck.add("/defaults", "must be an object");
      else {
        ck.check_keys(j["defaults"], "/defaults", {"negative", "steps", "cfg", "width", "height"});
        ck.read_settings(j["defaults"], "/defaults", defaults);
      }
    }
    if (!j.contains("tasks") || !j["tasks"].is_array() || j["tasks"].empty()) {
      ck.add("/tasks", "must be a non-empty array of tasks");
    } else {
      std::set<std::string> ids;
      for (size_t i = 0; i < j["tasks"].size(); ++i) {
        const json& t = j["tasks"][i];
        const std::string ptr = "/tasks/" + std::to_string(i);
        if (!t.is_object()) {
          ck.add(ptr, "must be an object with at least \"id\" and \"prompt\"");
          continue;
        }
        ck.check_keys(t, ptr, {"id", "prompt", "negative", "seed", "count", "steps", "cfg", "width", "height"});
        BatchTask task;
        task.params = defaults;
        task.params.prompt.clear();
        if (!ck.get_string(t, ptr, "id", task.id) || task.id.empty()) {
          if (!t.contains("id")) ck.add(ptr + "/id", "is missing (each task needs a unique id)");
        } else if (!ids.insert(task.id).second) {
          ck.add(ptr + "/id", "'" + task.id + "' is used by an earlier task; ids must be unique");
        }
        if (!t.contains("prompt")) ck.add(ptr + "/prompt", "is missing");
        ck.read_settings(t, ptr, task.params);
        long long v = 0;
        if (t.contains("seed")) {
          if (ck.get_int(t, ptr, "seed", -1, (1LL << 53), v)) {
            task.seed_random = v == -1;
            task.params.seed = v == -1 ? 0 : v;
          }
        } else {
          task.seed_random = true;
        }
        if (ck.get_int(t, ptr, "count", 1, kMaxCount, v)) task.count = static_cast<int>(v);
        bf.tasks.push_back(task);
      }
    }
  }
  if (problems_out) *problems_out = problems;
  return bf;
}

BatchFile parse_batch_file(const std::filesystem::path& path, const GenerationParams& fallback) {
  std::ifstream in(path);
  if (!in) throw UsageError("cannot read batch file '" + path.string() + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<BatchProblem> problems;
  BatchFile bf = parse_batch_text(ss.str(), path, fallback, &problems);
  if (!problems.empty()) {
    std::string msg = "batch file '" + path.string() + "' has " + std::to_string(problems.size()) + " problem(s):";
    for (const auto& p : problems) msg += "\n  " + (p.pointer.empty() ? std::string("/") : p.pointer) + ": " + p.message;
    throw UsageError(msg);
  }
  return bf;
}

std::string output_file_name(const BatchTask& task, int index, std::int64_t seed) {
  std::string id;
  for (char c : task.id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    id.push_back(ok ? c : '_');
  }
  if (id.empty() || id[0] == '.') id.insert(0, "_");
  return id + "-" + std::to_string(index) + "-" + std::to_string(seed) + ".png";
}

}  // namespace sdxl
