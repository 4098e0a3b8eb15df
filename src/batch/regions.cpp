#include "batch/regions.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace sdxl {

using nlohmann::json;

std::string region_box_problem(double x0, double y0, double x1, double y1) {
  for (double v : {x0, y0, x1, y1})
    if (!std::isfinite(v) || v < 0 || v > 1)
      return "must be [x0, y0, x1, y1] with each value a fraction of the panel from 0 to 1 (got " + format_number(v) +
             ")";
  if (x0 >= x1 || y0 >= y1)
    return "has no area: x0 must be below x1 and y0 below y1 ([" + format_number(x0) + ", " + format_number(y0) +
           ", " + format_number(x1) + ", " + format_number(y1) + "])";
  return "";
}

std::string region_mask_aspect_problem(int mask_w, int mask_h, int width, int height) {
  if (mask_w <= 0 || mask_h <= 0) return "";
  const double w_at_height = static_cast<double>(mask_w) * height / mask_h;
  const double h_at_width = static_cast<double>(mask_h) * width / mask_w;
  if (std::abs(w_at_height - width) <= 1.0 || std::abs(h_at_width - height) <= 1.0) return "";
  return "is " + std::to_string(mask_w) + "x" + std::to_string(mask_h) + ", another aspect ratio than the panel's " +
         std::to_string(width) + "x" + std::to_string(height) +
         " (a region mask is scaled to each attention grid, never cropped: make it the panel's shape, any size)";
}

namespace {

// One region as its "Region N" field says it.
std::string region_text(const RegionUse& r) {
  std::ostringstream s;
  if (r.mask.empty())
    s << "Box: " << format_number(r.x0) << " " << format_number(r.y0) << " " << format_number(r.x1) << " "
      << format_number(r.y1);
  else
    s << "Mask: " << std::filesystem::path(r.mask).filename().string()
      << (r.mask_sha256.empty() ? "" : " [" + r.mask_sha256.substr(0, 10) + "]");
  s << ", Weight: " << format_number(r.weight);
  if (!r.character.empty()) s << ", Character: " << r.character;
  if (!r.reference.empty())
    s << ", Reference: " << std::filesystem::path(r.reference).filename().string()
      << ", Reference weight: " << format_number(r.reference_scale);
  s << ", Prompt: " << r.prompt;
  if (!r.negative.empty()) s << ", Negative prompt: " << r.negative;
  return s.str();
}

}  // namespace

std::string regions_a1111_fields(const GenerationParams& p) {
  if (!p.has_regions()) return "";
  std::string out = ", RP Active: True, RP Divide mode: Mask, RP Mask submode: Mask, RP Calc Mode: Attention";
  out += ", RP Base Ratios: " + format_number(p.region_base) + ", RP Use Base: True";
  for (size_t i = 0; i < p.regions.size(); ++i)
    out += ", Region " + std::to_string(i + 1) + ": " + quote_if_needed(region_text(p.regions[i]));
  return out;
}

void record_regions(const GenerationParams& p, json& params) {
  if (!p.has_regions()) return;
  json list = json::array();
  for (const RegionUse& r : p.regions) {
    json e = {{"prompt", r.prompt}, {"negative", r.negative}, {"weight", r.weight}};
    if (r.mask.empty()) e["box"] = {r.x0, r.y0, r.x1, r.y1};
    else e["mask"] = {{"file", r.mask}, {"sha256", r.mask_sha256}};
    if (!r.character.empty()) e["character"] = r.character;
    if (!r.reference.empty()) e["reference"] = {{"image", r.reference}, {"scale", r.reference_scale}};
    list.push_back(e);
  }
  params["regions"] = list;
}

void restore_regions(const json& params, GenerationParams& p) {
  const auto it = params.find("regions");
  if (it == params.end() || !it->is_array()) return;
  for (const json& e : *it) {
    if (!e.is_object()) continue;
    RegionUse r;
    r.prompt = e.value("prompt", "");
    r.negative = e.value("negative", "");
    r.weight = e.value("weight", 1.0);
    r.character = e.value("character", "");
    if (const auto b = e.find("box"); b != e.end() && b->is_array() && b->size() == 4 && (*b)[0].is_number()) {
      r.x0 = (*b)[0].get<double>(), r.y0 = (*b)[1].get<double>(), r.x1 = (*b)[2].get<double>();
      r.y1 = (*b)[3].get<double>();
    }
    if (const auto m = e.find("mask"); m != e.end() && m->is_object()) {
      r.mask = m->value("file", "");
      r.mask_sha256 = m->value("sha256", "");
    }
    if (const auto f = e.find("reference"); f != e.end() && f->is_object()) {
      r.reference = f->value("image", "");
      r.reference_scale = f->value("scale", 1.0);
    }
    p.regions.push_back(r);
  }
}

namespace {

// Text up to the first ':' and the rest; throws UsageError (naming `flag` and `text`) without one.
std::pair<std::string, std::string> split_flag(const std::string& flag, const std::string& text, const char* shape) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos || colon == 0)
    throw UsageError(flag + " '" + text + "' must be " + shape);
  return {text.substr(0, colon), text.substr(colon + 1)};
}

}  // namespace

RegionUse parse_region_flag(const std::string& text) {
  const char* shape = "x0,y0,x1,y1:PROMPT (fractions of the panel, e.g. 0,0,0.5,1:a woman waving)";
  const auto [box, prompt] = split_flag("--region", text, shape);
  double v[4];
  size_t at = 0;
  for (int k = 0; k < 4; ++k) {
    const size_t end = k < 3 ? box.find(',', at) : box.size();
    if (end == std::string::npos) throw UsageError("--region '" + text + "' must be " + shape);
    const std::string part = box.substr(at, end - at);
    char* stop = nullptr;
    v[k] = std::strtod(part.c_str(), &stop);
    if (part.empty() || *stop != '\0') throw UsageError("--region '" + text + "' must be " + shape);
    at = end + 1;
  }
  if (const std::string why = region_box_problem(v[0], v[1], v[2], v[3]); !why.empty())
    throw UsageError("--region '" + text + "': the box " + why);
  RegionUse r;
  r.x0 = v[0], r.y0 = v[1], r.x1 = v[2], r.y1 = v[3];
  r.prompt = prompt;
  return r;
}

RegionUse parse_region_mask_flag(const std::string& text) {
  const auto [file, prompt] = split_flag("--region-mask", text, "FILE:PROMPT (a mask PNG, white = inside)");
  RegionUse r;
  r.mask = file;
  r.prompt = prompt;
  return r;
}

}  // namespace sdxl
