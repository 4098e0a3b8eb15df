#include "batch/generation_params.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <tuple>

#include <cctype>
#include <filesystem>

#include "core/error.h"
#include "core/input_text.h"
#include "batch/regions.h"

namespace sdxl {

// Shortest decimal that reads back the same double: 7 -> "7", 7.5 -> "7.5".
std::string format_number(double v) {
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

// A value is one line: its control characters (a line break in a ControlNet's name, say) become
// spaces, so no value can start a line of its own (core/input_text.h).
std::string quote_if_needed(const std::string& raw) {
  const std::string v = clean_metadata_text(raw, false);
  if (v.find_first_of(",:\"") == std::string::npos) return v;
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

bool GenerationParams::region_references() const {
  return std::any_of(regions.begin(), regions.end(), [](const RegionUse& r) { return !r.reference.empty(); });
}

namespace {

// "NAME: HASH, NAME2: HASH2", quoted as A1111 quotes it.
std::string hash_list(const std::vector<std::pair<std::string, std::string>>& hashes) {
  std::string h;
  for (const auto& [name, hash] : hashes) h += (h.empty() ? "" : ", ") + name + ": " + hash;
  return quote_if_needed(h);
}

// A1111's ControlNet extension's unit text, for ControlNet `i` of the task.
std::string controlnet_unit(const GenerationParams& p, const ImageSources& src, size_t i) {
  const ControlNetUse& c = p.controlnets[i];
  std::string name = std::filesystem::path(c.model).filename().string(), hash;
  if (i < src.controlnets.size()) std::tie(name, hash) = src.controlnets[i];
  return "Module: none, Model: " + name + (hash.empty() ? "" : " [" + hash + "]") +
         ", Weight: " + format_number(c.strength) + ", Resize Mode: Just Resize, Guidance Start: " +
         format_number(c.start) + ", Guidance End: " + format_number(c.end);
}

// The IP-Adapter's text: model, scale and each reference image's file and hash.
std::string ip_adapter_unit(const GenerationParams& p, const ImageSources& src) {
  const IpAdapterUse& ip = p.ip_adapter;
  const std::string name =
      src.ip_adapter_name.empty() ? std::filesystem::path(ip.model).filename().string() : src.ip_adapter_name;
  std::string images;
  for (size_t i = 0; i < ip.images.size(); ++i) {
    std::string file = std::filesystem::path(ip.images[i]).filename().string(), hash;
    if (i < src.ip_images.size()) std::tie(file, hash) = src.ip_images[i];
    images += (images.empty() ? "" : ", ") + file + (hash.empty() ? "" : " [" + hash + "]");
  }
  return "Model: " + name + (src.ip_adapter_hash.empty() ? "" : " [" + src.ip_adapter_hash + "]") +
         ", Weight: " + format_number(ip.scale) + ", Images: " + images;
}

// ADetailer's fields of every detailer unit (its args.py extra_params order; optional ones only when set).
std::string detailer_fields(const GenerationParams& p, const ImageSources& src) {
  std::ostringstream s;
  for (size_t k = 0; k < p.detailer.size(); ++k) {
    const DetailerUse& d = p.detailer[k];
    const std::string x = detailer_unit_suffix(static_cast<int>(k));
    const std::string model = k < src.detailer_models.size() && !src.detailer_models[k].empty()
                                  ? src.detailer_models[k]
                                  : std::filesystem::path(d.detector).filename().string();
    s << ", ADetailer model" << x << ": " << quote_if_needed(model);
    if (!d.prompt.empty()) s << ", ADetailer prompt" << x << ": " << quote_if_needed(d.prompt);
    if (!d.negative.empty()) s << ", ADetailer negative prompt" << x << ": " << quote_if_needed(d.negative);
    s << ", ADetailer confidence" << x << ": " << format_number(d.confidence);
    if (d.max > 0) s << ", ADetailer mask only top k largest" << x << ": " << d.max;
    s << ", ADetailer dilate erode" << x << ": " << d.dilate << ", ADetailer mask blur" << x << ": " << d.blur
      << ", ADetailer denoising strength" << x << ": " << format_number(d.denoise) << ", ADetailer inpaint only masked"
      << x << ": True, ADetailer inpaint padding" << x << ": " << d.padding;
    if (d.steps > 0) s << ", ADetailer use separate steps" << x << ": True, ADetailer steps" << x << ": " << d.steps;
  }
  return s.str();
}

}  // namespace

std::string detailer_prompt(const std::string& unit_prompt, const std::string& image_prompt) {
  if (unit_prompt.empty()) return image_prompt;
  std::string out;
  const std::string tag = "[PROMPT]";
  size_t pos = 0;
  while (true) {
    const size_t at = unit_prompt.find(tag, pos);
    if (at == std::string::npos) break;
    out += unit_prompt.substr(pos, at - pos) + image_prompt;
    pos = at + tag.size();
  }
  return out + unit_prompt.substr(pos);
}

std::string detailer_unit_suffix(int k) {
  if (k <= 0) return "";
  const int n = k + 1;
  const int tens = n % 100, ones = n % 10;
  const char* th = (tens >= 11 && tens <= 13) ? "th" : ones == 1 ? "st" : ones == 2 ? "nd" : ones == 3 ? "rd" : "th";
  return " " + std::to_string(n) + th;
}

// The items in A1111's order (processing.py create_infotext): ..., Size, Model
// hash, Model, VAE hash, VAE, Denoising strength, Clip skip, then the extra
// items (init image, hires fix, Lora hashes, TI hashes), Version.
std::string a1111_parameters(const GenerationParams& p, const ImageSources& src) {
  std::ostringstream s;
  s << clean_metadata_text(p.prompt, true) << "\n";  // prompts may span lines, as in A1111
  if (!p.negative_prompt.empty()) s << "Negative prompt: " << clean_metadata_text(p.negative_prompt, true) << "\n";
  s << "Steps: " << p.steps << ", Sampler: " << quote_if_needed(p.sampler)
    << ", Schedule type: " << quote_if_needed(p.schedule) << ", CFG scale: " << format_number(p.cfg);
  if (p.guidance_rescale != 0.0) s << ", Guidance rescale: " << format_number(p.guidance_rescale);
  s << ", Seed: " << p.seed << ", Size: " << p.width << "x" << p.height;
  if (!src.model_hash.empty()) s << ", Model hash: " << src.model_hash;
  s << ", Model: " << quote_if_needed(src.model_name);
  if (!src.vae_hash.empty()) s << ", VAE hash: " << src.vae_hash;
  if (!src.vae_name.empty()) s << ", VAE: " << quote_if_needed(src.vae_name);
  const bool img2img = !p.init_image.empty();
  if (img2img) s << ", Denoising strength: " << format_number(p.strength);
  else if (p.hires_on()) s << ", Denoising strength: " << format_number(p.hires.denoise);
  if (p.clip_skip != 0) s << ", Clip skip: " << p.clip_skip;
  if (p.sampler == "TCD") s << ", Eta: " << format_number(p.eta);
  if (!p.timesteps.empty()) {
    std::string list;
    for (int t : p.timesteps) list += (list.empty() ? "" : ", ") + std::to_string(t);
    s << ", Timesteps: " << quote_if_needed(list);
  }
  // A1111's zero-SNR option writes this field (modules/sd_models.py, apply_alpha_schedule_override).
  if (src.zero_terminal_snr) s << ", Noise Schedule: Zero Terminal SNR";
  if (img2img) s << ", Init image: " << quote_if_needed(std::filesystem::path(p.init_image).filename().string());
  if (img2img && p.inpaint()) s << ", Mask blur: " << p.mask_blur;
  if (img2img && p.inpaint_masked())
    s << ", Inpaint area: Only masked, Masked area padding: " << p.inpaint_padding;
  if (p.hires_on()) {
    if (img2img) s << ", Hires denoising strength: " << format_number(p.hires.denoise);
    s << ", Hires upscale: " << format_number(p.hires.scale) << ", Hires steps: " << p.hires_steps()
      << ", Hires upscaler: "
      << quote_if_needed(p.hires_uses_model() ? upscaler_folder_name(p.hires.upscaler) : p.hires.upscaler);
  }
  if (!src.lora_hashes.empty()) s << ", Lora hashes: " << hash_list(src.lora_hashes);
  if (!src.ti_hashes.empty()) s << ", TI hashes: " << hash_list(src.ti_hashes);
  for (size_t i = 0; i < p.controlnets.size(); ++i)
    s << ", ControlNet " << i << ": " << quote_if_needed(controlnet_unit(p, src, i));
  if (p.ip_adapter.on()) s << ", IP-Adapter: " << quote_if_needed(ip_adapter_unit(p, src));
  s << detailer_fields(p, src);
  s << regions_a1111_fields(p);
  if (src.unet_precision == "fp8") s << ", UNet precision: fp8 e4m3";
  s << ", Version: " << kProgramName << " " << kProgramVersion;
  if (p.upscale.on())
    s << ", " << postprocess_upscale_fields(p.upscale.scale, p.upscale.width, p.upscale.height, p.upscale.fit,
                                            src.upscaler_name.empty()
                                                ? std::filesystem::path(p.upscale.model).filename().string()
                                                : src.upscaler_name);
  return s.str();
}

std::string a1111_parameters(const GenerationParams& p, const std::string& model_name,
                             const std::vector<std::pair<std::string, std::string>>& lora_hashes) {
  ImageSources src;
  src.model_name = model_name;
  src.lora_hashes = lora_hashes;
  return a1111_parameters(p, src);
}

namespace {

std::string lower_ascii(std::string v) {
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v;
}

}  // namespace

std::string canonical_upscale_model(const std::string& name) {
  return lower_ascii(name) == "lanczos" ? UpscaleUse::kLanczosUpscaler : name;
}

std::pair<int, int> upscale_frame_size(const UpscaleUse& u, int width, int height) {
  if (!(u.scale > 0)) return {u.width, u.height};
  return {std::max(1, static_cast<int>(std::lround(width * u.scale))),
          std::max(1, static_cast<int>(std::lround(height * u.scale)))};
}

std::pair<int, int> decoded_size(const GenerationParams& p) {
  return p.hires_on() ? std::pair{p.hires_width(), p.hires_height()} : std::pair{p.width, p.height};
}

std::string upscale_problem(const UpscaleUse& u, int width, int height, std::string& key) {
  const bool by = u.scale != 0, to = u.width != 0 || u.height != 0;
  key = by ? "scale" : "size";
  if (by && to) return "cannot be combined with \"size\" (give a factor or a frame size, not both)";
  if (!by && !to) return "is missing: give \"scale\" (a factor) or \"size\" (a frame, WxH)";
  if (by && (!std::isfinite(u.scale) || !(u.scale > 0) || u.scale > kMaxUpscaleFactor))
    return "must be a number above 0 and at most " + format_number(kMaxUpscaleFactor);
  if (!by && u.fit != "stretch" && u.fit != "crop" && u.fit != "pad") {
    key = "fit";
    return "'" + u.fit + "' is not a fit (crop, pad or stretch)";
  }
  const auto [w, h] = upscale_frame_size(u, width, height);
  if (w < 8 || h < 8 || w > kMaxFrameSide || h > kMaxFrameSide)
    return "makes a " + std::to_string(w) + "x" + std::to_string(h) + " frame from the " + std::to_string(width) +
           "x" + std::to_string(height) + " image; each side must be 8.." + std::to_string(kMaxFrameSide);
  return "";
}

bool parse_frame_size(const std::string& text, int& width, int& height) {
  const auto x = text.find('x');
  // At most 6 digits a side: far above any frame limit, far below int's range.
  if (x == std::string::npos || x == 0 || x > 6 || x + 1 >= text.size() || text.size() - x - 1 > 6) return false;
  for (size_t i = 0; i < text.size(); ++i)
    if (i != x && !std::isdigit(static_cast<unsigned char>(text[i]))) return false;
  width = std::stoi(text.substr(0, x));
  height = std::stoi(text.substr(x + 1));
  return width > 0 && height > 0;
}

std::string postprocess_upscale_fields(double scale, int width, int height, const std::string& fit,
                                       const std::string& upscaler_name) {
  const std::string what = scale > 0 ? "Postprocess upscale by: " + format_number(scale)
                                     : "Postprocess upscale to: " + std::to_string(width) + "x" +
                                           std::to_string(height) + ", Postprocess upscale fit: " + fit;
  return what + ", Postprocess upscaler: " + quote_if_needed(upscaler_name);
}

const std::vector<std::string>& hires_upscaler_names() {
  static const std::vector<std::string> names = {"Latent", "Latent (antialiased)", "Latent (bicubic)",
                                                 "Latent (bicubic antialiased)", "Latent (nearest)",
                                                 "Latent (nearest-exact)", "Nearest", "Lanczos"};
  return names;
}

std::string hires_upscaler_name_of(const std::string& name) {
  const std::string want = lower_ascii(name);
  for (const auto& n : hires_upscaler_names())
    if (lower_ascii(n) == want) return n;
  return "";
}

std::string hires_upscaler_name_list() {
  std::string list;
  for (const auto& n : hires_upscaler_names()) list += (list.empty() ? "\"" : ", \"") + n + "\"";
  return list;
}

bool is_hires_upscaler_folder(const std::string& upscaler) {
  const auto& names = hires_upscaler_names();
  return std::find(names.begin(), names.end(), upscaler) == names.end();
}

std::string upscaler_folder_name(const std::string& dir) {
  std::filesystem::path p(dir);
  if (p.filename().empty()) p = p.parent_path();  // "up/4x-anime/"
  return p.filename().string();
}

std::int64_t random_seed() {
  // A1111 seeds are 32-bit; staying in that range keeps them portable to other tools.
  std::random_device rd;
  return static_cast<std::int64_t>(rd() & 0xffffffffu);
}

}  // namespace sdxl
