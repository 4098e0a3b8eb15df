#include "batch/lora_ref.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "core/input_file.h"

namespace sdxl {
namespace {

bool parse_double(const std::string& s, double& out) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s.front()))) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(out);
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

}  // namespace

LoraRef parse_lora_arg(const std::string& arg) {
  LoraRef r;
  std::string file = arg;
  if (const auto colon = arg.rfind(':'); colon != std::string::npos) {
    double w = 0;
    if (parse_double(arg.substr(colon + 1), w)) {
      r.weight = w;
      file = arg.substr(0, colon);
    }
  }
  if (file.empty()) throw UsageError("--lora '" + arg + "': expected FILE[:WEIGHT], e.g. --lora style.safetensors:0.8");
  r.path = file;
  r.name = r.path.stem().string();
  return r;
}

PromptLoras extract_lora_tags(const std::string& prompt) {
  PromptLoras out;
  size_t i = 0;
  while (i < prompt.size()) {
    const size_t open = prompt.find("<lora:", i);
    if (open == std::string::npos) break;
    const size_t close = prompt.find('>', open);
    if (close == std::string::npos) break;  // unclosed: A1111's regex does not match either
    const std::string inside = prompt.substr(open + 6, close - open - 6);
    std::vector<std::string> parts(1);
    for (char c : inside) {
      if (c == ':') parts.emplace_back();
      else parts.back().push_back(c);
    }
    LoraTag tag;
    tag.name = trim(parts[0]);
    // A1111 (extra_networks_lora.py): the multiplier is args[1]; a separate UNet
    // multiplier (args[2]) is not supported: one weight applies to all modules.
    const std::string wtext = trim(parts.size() > 1 ? parts[1] : "");
    if (!wtext.empty() && !parse_double(wtext, tag.weight))
      throw UsageError("prompt tag '<lora:" + inside + ">': weight '" + wtext + "' is not a number");
    if (tag.name.empty()) throw UsageError("prompt tag '<lora:" + inside + ">' has no name");
    out.text += prompt.substr(i, open - i);
    out.tags.push_back(tag);
    i = close + 1;
  }
  out.text += prompt.substr(std::min(i, prompt.size()));
  return out;
}

LoraRef resolve_lora(const std::string& name, double weight, const LoraRegistry& registry,
                     const std::vector<std::filesystem::path>& dirs) {
  LoraRef r;
  r.name = name;
  r.weight = weight;
  if (auto it = registry.find(name); it != registry.end()) {
    r.path = it->second.path;
    r.pin = it->second.pin;
    return r;
  }
  const std::filesystem::path rel(name);
  bool leaves = rel.is_absolute();
  for (const auto& part : rel) leaves |= part == "..";
  if (leaves)
    throw UsageError("LoRA '" + name + "': a prompt tag names a file inside a --lora-dir (sub-folders allowed), " +
                     "not an absolute path or one with '..'; list other files in the batch file's \"loras\"");
  std::string searched;
  if (!registry.empty()) searched = "the batch file's \"loras\" registry";
  for (const auto& d : dirs) {
    for (const auto& candidate : {d / (name + ".safetensors"), d / name}) {
      std::error_code ec;
      if (std::filesystem::is_regular_file(candidate, ec)) {
        // The confinement rule (core/input_file.h): no link out of the --lora-dir.
        if (const std::string why = outside_folder_problem(candidate, d); !why.empty())
          throw UsageError("LoRA '" + name + "': '" + candidate.string() + "' " + why);
        r.path = candidate;
        return r;
      }
    }
    searched += (searched.empty() ? "" : ", ") + ("'" + d.string() + "'");
  }
  throw UsageError("unknown LoRA '" + name + "': not found in " +
                   (searched.empty() ? std::string("any directory (no --lora-dir given and no registry)") : searched) +
                   " (hint: add --lora-dir DIR or a \"loras\" entry in the batch file)");
}

namespace {

// Whether two references name one file (the same path, or paths that resolve to one).
bool same_lora_file(const LoraRef& a, const LoraRef& b) {
  if (a.path == b.path) return true;
  std::error_code ea, eb;
  const std::filesystem::path ca = std::filesystem::weakly_canonical(a.path, ea);
  const std::filesystem::path cb = std::filesystem::weakly_canonical(b.path, eb);
  return !ea && !eb && ca == cb;
}

std::string weight_text(double w) {
  std::string t = std::to_string(w);
  t.erase(t.find_last_not_of('0') + 1);
  if (!t.empty() && t.back() == '.') t.pop_back();
  return t;
}

}  // namespace

std::vector<LoraRef> merge_lora_tags(const std::vector<LoraRef>& loras, const std::vector<LoraTag>& tags,
                                     const LoraRegistry& registry, const std::vector<std::filesystem::path>& dirs) {
  std::vector<LoraRef> all = loras;
  for (const LoraTag& t : tags) all.push_back(resolve_lora(t.name, t.weight, registry, dirs));
  std::vector<LoraRef> out;
  for (const LoraRef& r : all) {
    const auto have = std::find_if(out.begin(), out.end(), [&](const LoraRef& o) { return same_lora_file(o, r); });
    if (have == out.end()) {
      out.push_back(r);
    } else if (have->weight == r.weight) {
      have->pin = have->pin || r.pin;
    } else {
      throw UsageError("LoRA '" + r.name + "' is named at weight " + weight_text(r.weight) + " and as '" + have->name +
                       "' at weight " + weight_text(have->weight) + " (" + r.path.string() +
                       "): name it once, or at one weight (the same weight counts once)");
    }
  }
  return out;
}

}  // namespace sdxl
