#include "sdxl/generation_params.h"

#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>

namespace sdxl {
namespace {

// Shortest decimal that reads back the same double: 7 -> "7", 7.5 -> "7.5".
std::string format_number(double v) {
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

// A1111 quotes a value that contains ',', ':' or '"' (infotext quote()).
std::string quote_if_needed(const std::string& v) {
  if (v.find_first_of(",:\"\n") == std::string::npos) return v;
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

}  // namespace

std::string a1111_parameters(const GenerationParams& p, const std::string& model_name,
                             const std::vector<std::pair<std::string, std::string>>& lora_hashes) {
  std::ostringstream s;
  s << p.prompt << "\n";
  if (!p.negative_prompt.empty()) s << "Negative prompt: " << p.negative_prompt << "\n";
  s << "Steps: " << p.steps << ", Sampler: " << quote_if_needed(p.sampler)
    << ", Schedule type: " << quote_if_needed(p.schedule) << ", CFG scale: " << format_number(p.cfg)
    << ", Seed: " << p.seed << ", Size: " << p.width << "x" << p.height
    << ", Model: " << quote_if_needed(model_name);
  if (!lora_hashes.empty()) {
    std::string h;
    for (const auto& [name, hash] : lora_hashes) h += (h.empty() ? "" : ", ") + name + ": " + hash;
    s << ", Lora hashes: " << quote_if_needed(h);
  }
  s << ", Version: " << kProgramName << " " << kProgramVersion;
  return s.str();
}

std::int64_t random_seed() {
  // A1111 seeds are 32-bit; staying in that range keeps them portable to other tools.
  std::random_device rd;
  return static_cast<std::int64_t>(rd() & 0xffffffffu);
}

}  // namespace sdxl
