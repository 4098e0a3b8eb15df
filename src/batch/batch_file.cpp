#include "batch/batch_file.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <type_traits>
#include <variant>

#include "core/error.h"
#include "core/input_file.h"
#include "core/json_shape.h"
#include "core/sha256.h"
#include "batch/batch_strings.h"
#include "batch/json_fields.h"
#include "batch/output_names.h"
#include "batch/priority.h"
#include "batch/regions.h"
#include "batch/story.h"
#include "batch/task_keys.h"
#include "batch/video_spec.h"
#include "batch/wildcards.h"
#include "core/units.h"

namespace sdxl {
namespace {

using nlohmann::json;

constexpr int kMaxDetailerDilate = 128;   // ADetailer's slider limit (negative: erode)
constexpr int kMaxDetailerRegions = 1000;

// The keys allowed in a task (defaults = false) or in /defaults: the table's (batch/task_keys.h).
const std::set<std::string>& allowed_keys(bool defaults) {
  static const std::set<std::string> task = [] {
    const auto names = task_key_names(false);
    return std::set<std::string>(names.begin(), names.end());
  }();
  static const std::set<std::string> in_defaults = [] {
    const auto names = task_key_names(true);
    return std::set<std::string>(names.begin(), names.end());
  }();
  return defaults ? in_defaults : task;
}

// Whether `v` is one of `choices` ("a|b|c").
bool is_choice(std::string_view choices, const std::string& v) {
  size_t start = 0;
  while (start <= choices.size()) {
    const size_t bar = std::min(choices.find('|', start), choices.size());
    if (choices.substr(start, bar - start) == v) return true;
    start = bar + 1;
  }
  return false;
}

// Collects problems instead of stopping at the first, so a user fixes a file in one go.
struct Checker : JsonFields {
  std::filesystem::path base_dir;  // relative LoRA paths start here
  InputChecks* checks = nullptr;  // null: folders, PNGs and sampler names are taken as written
  const LoraRegistry* registry = nullptr;

  std::map<std::string, std::string> folder_errors{};  // kind + folder -> "" or why it does not load
  std::set<std::string> bad_upscales{};  // "upscale" objects with a problem of their own (not checked again per task)
  std::string task_id{};  // the id of the task being read ("" in /defaults): named in its detailer's problems


  // Whether folder `dir` reads as `kind` (InputChecks::folder_problem); each
  // folder is read once per batch file, however many tasks name it.
  bool check_folder(const char* kind, const std::string& dir, const std::string& pointer) {
    if (!checks) return true;
    auto [it, fresh] = folder_errors.try_emplace(std::string(kind) + ":" + dir);
    if (fresh) it->second = checks->folder_problem(kind, dir);
    if (!it->second.empty()) add(pointer, it->second);
    return it->second.empty();
  }
  // A folder the batch file names as `rel` (resolved: `dir`): confined as every input is (stays_inside:
  // no link out of the folder it is named relative to), then read as `kind` (check_folder).
  bool folder_ok(const char* kind, const std::string& rel, const std::string& dir, const std::string& pointer) {
    return stays_inside(pointer, rel, dir) && check_folder(kind, dir, pointer);
  }
  // A PNG's size, or why it cannot be used ("" and 0x0 without checks).
  std::string png_size(const std::string& path, int& w, int& h) {
    w = h = 0;
    return checks ? checks->png_size(path, w, h) : std::string();
  }

  // A file or folder named by the batch file: a string that is not empty.
  bool get_path(const json& obj, const std::string& pointer, const char* key, std::string& out) {
    if (!get_string(obj, pointer, key, out)) return false;
    if (!out.empty()) return true;
    add(pointer + "/" + key, "must not be empty (a path relative to the batch file)");
    return false;
  }
  // An integer key of the table within its range there.
  bool get_key_int(const json& obj, const std::string& pointer, std::string_view name, long long& out) {
    const TaskKey* k = find_task_key(name);
    if (!k) throw std::logic_error("no task key '" + std::string(name) + "'");
    return get_int(obj, pointer, std::string(name).c_str(), static_cast<long long>(k->lo), static_cast<long long>(k->hi),
                   out);
  }

  // Fields shared by /defaults and each task.
  // "vae": a VAE folder (export_sdxl.py --vae-only), relative to the batch file.
  void read_vae(const json& obj, const std::string& pointer, GenerationParams& p) {
    std::string rel;
    if (!get_path(obj, pointer, "vae", rel)) return;
    const std::string path = resolve(rel);
    if (folder_ok("vae", rel, path, pointer + "/vae")) p.vae = path;
  }

  // The confinement rule (core/input_file.h) for a file the batch file names
  // as `rel`: it must stay inside the batch file's folder when `rel` is a plain
  // relative path, inside the folder it names when it is absolute or has "..".
  // False (with a problem at `pointer`) when a link leads it out.
  bool stays_inside(const std::string& pointer, const std::string& rel, const std::filesystem::path& resolved) {
    const std::filesystem::path r(rel);
    bool named = r.is_absolute();
    for (const auto& part : r) named |= part == "..";
    const std::filesystem::path root = named ? resolved.parent_path() : base_dir.empty() ? "." : base_dir;
    const std::string why = outside_folder_problem(resolved, root);
    if (!why.empty()) add(pointer, "'" + resolved.string() + "' " + why);
    return why.empty();
  }

  // A path of the batch file (relative to its folder), absolute and normal; never throws
  // (an empty path, refused by get_path, stays empty).
  std::string resolve(const std::string& rel) const {
    const std::filesystem::path path(rel);
    return absolute_normal(path.is_relative() ? base_dir / path : path).string();
  }

  // A control image of "controlnets" at `cp`: a readable PNG inside the batch file's folder.
  void read_control_image(const json& c, const std::string& cp, ControlNetUse& u) {
    std::string rel;
    if (get_path(c, cp, "image", rel)) {
      u.image = resolve(rel);
      int w = 0, h = 0;
      const bool inside = stays_inside(cp + "/image", rel, u.image);
      if (const std::string why = inside ? png_size(u.image, w, h) : ""; !why.empty())
        add(cp + "/image", "'" + u.image + "' " + why);
    } else if (!c.contains("image")) {
      add(cp + "/image", "is missing (the control image: a PNG pose, edge or depth map)");
    }
    if (get_string(c, cp, "type", u.type) && u.type.empty())
      add(cp + "/type", "must not be empty (a Union ControlNet's control type, e.g. \"openpose\")");
    get_number(c, cp, "strength", 0.0, 10.0, u.strength);
    get_number(c, cp, "start", 0.0, 1.0, u.start);
    get_number(c, cp, "end", 0.0, 1.0, u.end);
    if (u.start >= u.end) add(cp + "/start", "must be below \"end\" (fractions of the steps)");
  }

  // One entry of "controlnets": a ControlNet folder and a readable PNG (with a Union
  // ControlNet's "type"), strength and window; or a Union ControlNet's "images" of one
  // call, each {image, type} with the entry's strength and window unless it has its own.
  void read_controlnet(const json& c, const std::string& cp, GenerationParams& p) {
    check_keys(c, cp, {"model", "image", "type", "images", "strength", "start", "end"});
    ControlNetUse u;
    std::string rel;
    if (get_path(c, cp, "model", rel)) {
      u.model = resolve(rel);
      folder_ok("controlnet", rel, u.model, cp + "/model");
    } else if (!c.contains("model")) {
      add(cp + "/model", "is missing (a ControlNet folder made by scripts/export_sdxl.py --controlnet)");
    }
    if (!c.contains("images")) {
      read_control_image(c, cp, u);
      p.controlnets.push_back(u);
      return;
    }
    const json& list = c["images"];
    for (const char* key : {"image", "type"})
      if (c.contains(key))
        add(cp + "/" + key, "goes with \"images\" only inside its entries (one call's images, each with its type)");
    if (!list.is_array() || list.size() < 2) {
      add(cp + "/images", "must be an array of 2 or more {\"image\": PNG, \"type\": NAME} (for one image: "
                          "\"image\" and \"type\")");
      return;
    }
    get_number(c, cp, "strength", 0.0, 10.0, u.strength);
    get_number(c, cp, "start", 0.0, 1.0, u.start);
    get_number(c, cp, "end", 0.0, 1.0, u.end);
    for (size_t k = 0; k < list.size(); ++k) {
      const std::string ip = cp + "/images/" + std::to_string(k);
      if (!list[k].is_object()) {
        add(ip, "must be an object {\"image\": PNG, \"type\": NAME}");
        continue;
      }
      check_keys(list[k], ip, {"image", "type", "strength", "start", "end"});
      ControlNetUse part = u;
      part.same_call = k > 0;
      read_control_image(list[k], ip, part);
      if (!list[k].contains("type")) add(ip + "/type", "is missing (each image of \"images\" names its control type)");
      p.controlnets.push_back(part);
    }
  }

  // "controlnets": a task's list replaces the defaults'.
  void read_controlnets(const json& obj, const std::string& pointer, GenerationParams& p) {
    if (!obj.contains("controlnets")) return;
    const std::string ptr = pointer + "/controlnets";
    const json& list = obj["controlnets"];
    const char* shape = "an array of {\"model\": DIR, \"image\": PNG, \"type\": NAME (a Union ControlNet), "
                        "\"strength\": 1, \"start\": 0, \"end\": 1}";
    if (!list.is_array()) {
      add(ptr, std::string("must be ") + shape);
      return;
    }
    p.controlnets.clear();
    for (size_t k = 0; k < list.size(); ++k) {
      if (list[k].is_object()) read_controlnet(list[k], ptr + "/" + std::to_string(k), p);
      else add(ptr + "/" + std::to_string(k), std::string("must be an object; \"controlnets\" is ") + shape);
    }
  }

  // "ip_adapter": {"model": DIR, "images": [PNG, ...], "scale": 1}; a task's replaces
  // the defaults'; null turns the defaults' off for a task.
  void read_ip_adapter(const json& obj, const std::string& pointer, GenerationParams& p) {
    if (!obj.contains("ip_adapter")) return;
    const std::string ptr = pointer + "/ip_adapter";
    const json& ip = obj["ip_adapter"];
    p.ip_adapter = IpAdapterUse{};
    if (ip.is_null()) return;
    if (!ip.is_object()) {
      add(ptr, "must be {\"model\": DIR, \"images\": [PNG, ...], \"scale\": 1} (or null for none)");
      return;
    }
    check_keys(ip, ptr, {"model", "images", "scale"});
    std::string rel;
    if (get_path(ip, ptr, "model", rel)) {
      p.ip_adapter.model = resolve(rel);
      folder_ok("ip_adapter", rel, p.ip_adapter.model, ptr + "/model");
    } else if (!ip.contains("model")) {
      add(ptr + "/model", "is missing (an IP-Adapter folder made by scripts/export_sdxl.py --ip-adapter)");
    }
    const json* images = ip.contains("images") ? &ip["images"] : nullptr;
    if (images && !images->is_array()) {
      add(ptr + "/images", "must be an array of reference images (PNG files)");
    } else if (images) {
      for (size_t k = 0; k < images->size(); ++k) {
        const std::string ip_k = ptr + "/images/" + std::to_string(k);
        if (!(*images)[k].is_string() || (*images)[k].get<std::string>().empty()) {
          add(ip_k, "must be a PNG file name");
          continue;
        }
        const std::string path = resolve((*images)[k].get<std::string>());
        int w = 0, h = 0;
        const bool inside = stays_inside(ip_k, (*images)[k].get<std::string>(), path);
        if (const std::string why = inside ? png_size(path, w, h) : ""; !why.empty())
          add(ip_k, "'" + path + "' " + why);
        p.ip_adapter.images.push_back(path);
      }
    }
    get_number(ip, ptr, "scale", 0.0, 10.0, p.ip_adapter.scale);
  }

  // "upscale": {"model": DIR | "Lanczos", "scale": S} or {"model": ..., "size": "WxH", "fit": FIT}; a
  // task's replaces the defaults'; null turns the defaults' off. The factor and the frame are checked
  // against the task's size (check_task_upscale).
  void read_upscale(const json& obj, const std::string& pointer, GenerationParams& p) {
    if (!obj.contains("upscale")) return;
    const std::string ptr = pointer + "/upscale";
    const json& u = obj["upscale"];
    p.upscale = UpscaleUse{};
    if (u.is_null()) return;
    if (!u.is_object()) {
      add(ptr, "must be {\"model\": DIR | \"Lanczos\", \"scale\": S} or {\"model\": ..., \"size\": \"WxH\", "
               "\"fit\": \"crop\" | \"pad\" | \"stretch\"} (or null for none)");
      return;
    }
    const size_t before = problems.size();
    check_keys(u, ptr, {"model", "scale", "size", "fit"});
    std::string rel;
    if (get_path(u, ptr, "model", rel)) {
      if (canonical_upscale_model(rel) == UpscaleUse::kLanczosUpscaler) {
        p.upscale.model = UpscaleUse::kLanczosUpscaler;
      } else {
        p.upscale.model = resolve(rel);
        if (folder_ok("upscaler", rel, p.upscale.model, ptr + "/model") && checks)
          p.upscale.weights_sha256 = checks->folder_weights_sha256("upscaler", p.upscale.model);
      }
    } else if (!u.contains("model")) {
      add(ptr + "/model", "is missing (an upscaler folder made by scripts/export_sdxl.py --upscaler, or \"Lanczos\")");
    }
    if (u.contains("scale")) {
      const json& v = u["scale"];
      if (!v.is_number() || !(v.get<double>() > 0) || v.get<double>() > kMaxUpscaleFactor)
        add(ptr + "/scale", "must be a number above 0 and at most " + format_number(kMaxUpscaleFactor));
      else
        p.upscale.scale = v.get<double>();
    }
    std::string size;
    if (get_string(u, ptr, "size", size) && !parse_frame_size(size, p.upscale.width, p.upscale.height))
      add(ptr + "/size", "'" + size + "' is not a frame size WxH (e.g. \"1080x1920\")");
    get_string(u, ptr, "fit", p.upscale.fit);
    if (u.contains("fit") && !u.contains("size")) add(ptr + "/fit", "needs \"size\" (a fit places the image in a frame)");
    if (problems.size() != before) bad_upscales.insert(ptr);
  }

  // The task's final upscale against its size (after its own settings and the defaults').
  void check_task_upscale(const json& t, const std::string& ptr, const GenerationParams& p) {
    if (!p.upscale.on() || bad_upscales.count(t.contains("upscale") ? ptr + "/upscale" : "/defaults/upscale")) return;
    const auto [w, h] = decoded_size(p);
    std::string key;
    const std::string why = upscale_problem(p.upscale, w, h, key);
    if (why.empty()) return;
    if (t.contains("upscale")) add(ptr + "/upscale/" + key, why);
    else add(ptr, "its \"upscale\" (from /defaults/upscale) \"" + key + "\" " + why);
  }

  // One unit of "detailer": a detector folder and ADetailer's settings (their defaults when absent).
  void read_detailer_unit(const json& d, const std::string& dp, DetailerUse& u) {
    check_keys(d, dp, {"detector", "prompt", "negative", "confidence", "dilate", "blur", "denoise", "padding", "max",
                       "steps"});
    std::string rel;
    if (get_path(d, dp, "detector", rel)) {
      u.detector = resolve(rel);
      if (folder_ok("detector", rel, u.detector, dp + "/detector") && checks)
        u.weights_sha256 = checks->folder_weights_sha256("detector", u.detector);
    } else if (!d.contains("detector")) {
      add(dp + "/detector", "is missing (a detector folder made by scripts/export_sdxl.py --detector)");
    }
    get_string(d, dp, "prompt", u.prompt);
    get_string(d, dp, "negative", u.negative);
    if (d.contains("confidence") && get_number(d, dp, "confidence", 0.0, 1.0, u.confidence) && !(u.confidence > 0))
      add(dp + "/confidence", "must be above 0 (a detection's score threshold, at most 1)");
    long long v = 0;
    if (get_int(d, dp, "dilate", -kMaxDetailerDilate, kMaxDetailerDilate, v)) u.dilate = static_cast<int>(v);
    if (get_int(d, dp, "blur", 0, kMaxMaskBlur, v)) u.blur = static_cast<int>(v);
    if (d.contains("denoise") && get_number(d, dp, "denoise", 0.0, 1.0, u.denoise) && !(u.denoise > 0))
      add(dp + "/denoise", "must be above 0 (the regions' denoising strength, at most 1)");
    if (get_int(d, dp, "padding", 0, kMaxInpaintPadding, v)) u.padding = static_cast<int>(v);
    if (get_int(d, dp, "max", 0, kMaxDetailerRegions, v)) u.max = static_cast<int>(v);
    if (d.contains("steps") && !d["steps"].is_null() && get_int(d, dp, "steps", 1, kMaxSteps, v))
      u.steps = static_cast<int>(v);
  }

  // "detailer": a list of units, applied in order; a task's replaces the defaults'; null or [] = none.
  void read_detailer(const json& obj, const std::string& pointer, GenerationParams& p) {
    if (!obj.contains("detailer")) return;
    const std::string ptr = pointer + "/detailer";
    const json& list = obj["detailer"];
    p.detailer.clear();
    if (list.is_null()) return;
    const size_t before = problems.size();
    const char* shape = "an array of {\"detector\": DIR, \"prompt\": \"\", \"confidence\": 0.3, \"dilate\": 4, "
                        "\"blur\": 4, \"denoise\": 0.4, \"padding\": 32, \"max\": 0, \"steps\": null}";
    if (!list.is_array()) add(ptr, std::string("must be ") + shape + " (or null for none)");
    for (size_t k = 0; list.is_array() && k < list.size(); ++k) {
      const std::string dp = ptr + "/" + std::to_string(k);
      if (!list[k].is_object()) {
        add(dp, std::string("must be an object; \"detailer\" is ") + shape);
        continue;
      }
      DetailerUse u;
      read_detailer_unit(list[k], dp, u);
      p.detailer.push_back(u);
    }
    if (!task_id.empty())
      for (size_t k = before; k < problems.size(); ++k) problems[k].message += " (task '" + task_id + "')";
  }

  // A plain key of the table (batch/task_keys.h): its type, range, step and values as the table says.
  void read_plain(const json& obj, const std::string& pointer, const TaskKey& k, GenerationParams& p) {
    const std::string name(k.name);
    std::visit(
        [&](auto member) {
          using M = decltype(member);
          if constexpr (std::is_same_v<M, int GenerationParams::*>) {
            long long v = 0;
            if (!get_int(obj, pointer, name.c_str(), static_cast<long long>(k.lo), static_cast<long long>(k.hi), v))
              return;
            p.*member = static_cast<int>(v);
            if (k.multiple_of > 0 && v % k.multiple_of)
              add(pointer + "/" + name, "must be a multiple of " + std::to_string(k.multiple_of));
          } else if constexpr (std::is_same_v<M, double GenerationParams::*>) {
            get_number(obj, pointer, name.c_str(), k.lo, k.hi, p.*member);
          } else if constexpr (std::is_same_v<M, std::string GenerationParams::*>) {
            std::string v;
            if (!get_string(obj, pointer, name.c_str(), v)) return;
            if (!k.choices.empty() && !is_choice(k.choices, v)) {
              add(pointer + "/" + name, "'" + v + "' is not one of: " + key_range_text(k));
              return;
            }
            p.*member = v;
          } else {
            throw std::logic_error("task key '" + name + "' has no reader for its field type");
          }
        },
        k.field);
  }

  // The readers of the settings keys that are not plain values; each returns false when the keys
  // after it are not read (a "hires" that is not an object).
  using SettingsReader = bool (*)(Checker&, const json&, const std::string&, GenerationParams&);
  template <void (Checker::*Read)(const json&, const std::string&, GenerationParams&)>
  static bool go_on(Checker& c, const json& obj, const std::string& pointer, GenerationParams& p) {
    (c.*Read)(obj, pointer, p);
    return true;
  }
  static SettingsReader settings_reader(std::string_view name) {
    static const std::map<std::string_view, SettingsReader> readers = {
        {"vae", &go_on<&Checker::read_vae>},
        {"detailer", &go_on<&Checker::read_detailer>},
        {"upscale", &go_on<&Checker::read_upscale>},
        {"controlnets", &go_on<&Checker::read_controlnets>},
        {"ip_adapter", &go_on<&Checker::read_ip_adapter>},
        {"mask", &go_on<&Checker::read_mask>},
        {"regions", &go_on<&Checker::read_regions>},
        {"timesteps", &go_on<&Checker::read_timesteps>},
        {"hires", [](Checker& c, const json& obj, const std::string& pointer, GenerationParams& p) {
           return !obj.contains("hires") || c.read_hires(obj["hires"], pointer + "/hires", p);
         }},
        {"loras", [](Checker& c, const json& obj, const std::string& pointer, GenerationParams& p) {
           if (obj.contains("loras")) c.read_loras(obj["loras"], pointer + "/loras", p.loras);
           return true;
         }}};
    const auto it = readers.find(name);
    return it == readers.end() ? nullptr : it->second;
  }

  // Every settings key of the table, in its order: a task's, or /defaults' (pointer "/defaults").
  void read_settings(const json& obj, const std::string& pointer, GenerationParams& p) {
    const bool defaults = pointer == "/defaults";
    for (const TaskKey& k : task_keys()) {
      if (k.part != KeyPart::kSettings || (defaults && !k.in_defaults())) continue;
      if (const SettingsReader r = settings_reader(k.name)) {
        if (!r(*this, obj, pointer, p)) return;
      } else if (k.plain()) {
        read_plain(obj, pointer, k, p);
      } else {
        throw std::logic_error("task key '" + std::string(k.name) + "' has no reader");
      }
    }
  }

  // "hires": {"scale": S, "upscaler": NAME | DIR, "steps": N, "denoise": D}; "scale" is required, the
  // other keys of a task's replace the defaults' one by one. False when it is not an object.
  bool read_hires(const json& h, const std::string& hp, GenerationParams& p) {
    if (!h.is_object()) {
      add(hp, "must be an object like {\"scale\": 2, \"upscaler\": \"Latent\", \"steps\": 10, \"denoise\": 0.5}");
      return false;
    }
    check_keys(h, hp, {"scale", "upscaler", "steps", "denoise"});
    if (!h.contains("scale")) add(hp + "/scale", "is missing (the upscale factor, e.g. 2)");
    get_number(h, hp, "scale", 0.0, 8.0, p.hires.scale);
    long long hs = 0;
    if (get_int(h, hp, "steps", 0, kMaxSteps, hs)) p.hires.steps = static_cast<int>(hs);
    get_number(h, hp, "denoise", 0.0, 1.0, p.hires.denoise);
    std::string up;
    if (get_path(h, hp, "upscaler", up)) read_hires_upscaler(up, hp + "/upscaler", p.hires);
    return true;
  }

  // A hires upscaler: one of A1111's names (any case), else an upscaler folder relative to the batch file.
  void read_hires_upscaler(const std::string& up, const std::string& ptr, GenerationParams::Hires& h) {
    h.weights_sha256.clear();
    if (std::string name = hires_upscaler_name_of(up); !name.empty()) {
      h.upscaler = name;
      return;
    }
    h.upscaler = resolve(up);
    const size_t before = problems.size();
    if (folder_ok("upscaler", up, h.upscaler, ptr)) {
      if (checks) h.weights_sha256 = checks->folder_weights_sha256("upscaler", h.upscaler);
      return;
    }
    if (problems.size() > before)
      problems.back().message = "'" + up + "' is not a hires upscaler name (" + hires_upscaler_name_list() +
                                ") nor an upscaler folder: " + problems.back().message;
  }

  // img2img input: relative to the batch file, a readable PNG; its size is the task's unless the task
  // or /defaults (defaults_width, defaults_height) sets width/height, which must then match.
  void read_init_image(const json& t, const std::string& ptr, const std::filesystem::path& origin,
                       bool defaults_width, bool defaults_height, GenerationParams& p) {
    std::string rel;
    if (!get_path(t, ptr, "init_image", rel)) return;
    std::filesystem::path path(rel);
    if (path.is_relative()) path = origin.parent_path() / path;
    if (!stays_inside(ptr + "/init_image", rel, path)) return;
    int w = 0, h = 0;
    const std::string why = png_size(path.string(), w, h);
    if (!why.empty()) {
      add(ptr + "/init_image", "'" + path.string() + "' " + why);
      return;
    }
    p.init_image = path.string();
    if (!checks) return;  // the image's size is unknown
    // A size the task or /defaults sets must be the image's; else the image's is the task's.
    const bool own_w = t.contains("width"), own_h = t.contains("height");
    if (!own_w && !defaults_width) p.width = w;
    if (!own_h && !defaults_height) p.height = h;
    const bool from_defaults = (!own_w && defaults_width) || (!own_h && defaults_height);
    if (const std::string size = init_size_problem(w, h, p.width, p.height); !size.empty())
      add(ptr + "/init_image", "'" + path.string() + "' " + size +
                                   (from_defaults ? " (a size from /defaults: give the task its own \"width\" and "
                                                    "\"height\", or leave the size out of /defaults)"
                                                  : ""));
  }

  // "timesteps": [999, 749, 499, 249]: integers, strictly decreasing, within SDXL's 1000 training
  // timesteps (the run checks the model's count again); the step count becomes their number, and a
  // "steps" beside them must equal it.
  void read_timesteps(const json& obj, const std::string& pointer, GenerationParams& p) {
    if (!obj.contains("timesteps")) return;
    const json& v = obj["timesteps"];
    const std::string tp = pointer + "/timesteps";
    std::vector<int> ts;
    for (size_t i = 0; v.is_array() && i < v.size(); ++i) {
      if (!v[i].is_number_integer() || v[i].get<long long>() < -1 || v[i].get<long long>() > 1000000) {
        add(tp + "/" + std::to_string(i), "must be an integer timestep (0..999)");
        return;
      }
      ts.push_back(v[i].get<int>());
    }
    if (!v.is_array()) {
      add(tp, "must be a list of integer timesteps, strictly decreasing, e.g. [999, 749, 499, 249]");
      return;
    }
    if (const std::string why = timestep_list_problem(ts, 1000); !why.empty()) {
      add(tp, why);
      return;
    }
    if (obj.contains("steps") && obj["steps"].is_number_integer() &&
        obj["steps"].get<long long>() != static_cast<long long>(ts.size()))
      add(pointer + "/steps", "is " + obj["steps"].dump() + " but \"timesteps\" holds " + std::to_string(ts.size()) +
                                  " (the step count follows from the list): give one of them");
    p.timesteps = std::move(ts);
    p.steps = static_cast<int>(p.timesteps.size());
  }

  // A task's timesteps (its own or the defaults') against its sampler and its steps.
  void check_timesteps(const json& t, const std::string& ptr, const GenerationParams& p) {
    if (p.timesteps.empty()) return;
    const bool own = t.contains("timesteps");
    const std::string from = own || ptr == "/defaults" ? "" : " (from /defaults)";
    if (p.steps != static_cast<int>(p.timesteps.size()))
      add(ptr + "/steps", "is " + std::to_string(p.steps) + " but the timesteps" + from + " hold " +
                              std::to_string(p.timesteps.size()) + " (the step count follows from the list): give one of them");
    if (!checks) return;
    if (const std::string why = checks->timesteps_problem(p); !why.empty())
      add(ptr + (own ? "/timesteps" : (t.contains("sampler") ? "/sampler" : "")), "timesteps" + from + ": " + why);
  }

  // Inpainting mask: relative to the batch file, confined like every input
  // file, a PNG that marks something to repaint; its sha256 recorded.
  // A character's "reference": {"image": PNG, "scale": 1}: a picture for the task's IP-Adapter.
  void read_reference(const json& ref, const std::string& rp, Character& ch) {
    if (!ref.is_object()) {
      add(rp, "must be {\"image\": PNG, \"scale\": 1} (a reference picture for the task's IP-Adapter)");
      return;
    }
    check_keys(ref, rp, {"image", "scale"});
    std::string rel;
    if (get_path(ref, rp, "image", rel)) {
      ch.reference = resolve(rel);
      int w = 0, h = 0;
      const bool inside = stays_inside(rp + "/image", rel, ch.reference);
      if (const std::string why = inside ? png_size(ch.reference, w, h) : ""; !why.empty())
        add(rp + "/image", "'" + ch.reference + "' " + why);
    } else if (!ref.contains("image")) {
      add(rp + "/image", "is missing (the character's reference picture, a PNG)");
    }
    get_number(ref, rp, "scale", 0.0, 10.0, ch.reference_scale);
  }

  // "regions": [{"box": [x0, y0, x1, y1] | "mask": PNG, "prompt", "negative", "weight", "character"}, ...];
  // a task's list replaces the defaults'; [] turns them off. A character's texts and reference join
  // when the story is applied (apply_story); the mask's aspect is checked against the task's size
  // (check_regions).
  void read_regions(const json& obj, const std::string& pointer, GenerationParams& p) {
    if (!obj.contains("regions")) return;
    const std::string ptr = pointer + "/regions";
    const json& list = obj["regions"];
    p.regions.clear();
    if (!list.is_array()) {
      add(ptr, "must be an array of {\"box\": [x0, y0, x1, y1] or \"mask\": PNG, \"prompt\": TEXT, \"weight\": 1, "
               "\"character\": NAME}");
      return;
    }
    if (list.size() > static_cast<size_t>(kMaxRegions))
      add(ptr, "has " + std::to_string(list.size()) + " regions; a panel may have at most " +
                   std::to_string(kMaxRegions));
    for (size_t k = 0; k < list.size() && k < static_cast<size_t>(kMaxRegions); ++k)
      read_region(list[k], ptr + "/" + std::to_string(k), p);
  }

  void read_region(const json& r, const std::string& rp, GenerationParams& p) {
    if (!r.is_object()) {
      add(rp, "must be an object with \"box\" or \"mask\", and \"prompt\"");
      return;
    }
    check_keys(r, rp, {"box", "mask", "prompt", "negative", "weight", "character"});
    RegionUse u;
    const bool box = r.contains("box"), mask = r.contains("mask");
    if (box == mask)
      add(rp, box ? "has both \"box\" and \"mask\": give one"
                  : "needs a \"box\" ([x0, y0, x1, y1] in fractions of the panel) or a \"mask\" (a PNG, white = inside)");
    if (box) read_region_box(r["box"], rp + "/box", u);
    std::string rel;
    if (mask && get_path(r, rp, "mask", rel)) {
      u.mask = resolve(rel);
      if (stays_inside(rp + "/mask", rel, u.mask)) {
        const std::string why = checks ? checks->region_mask_problem(u.mask) : std::string();
        if (!why.empty()) add(rp + "/mask", "'" + u.mask + "' " + why);
        else u.mask_sha256 = sha256_file_hex(u.mask).value_or("");
      }
    }
    if (!r.contains("prompt") && !r.contains("character"))
      add(rp + "/prompt", "is missing (the region's prompt, or a \"character\" whose prompt it takes)");
    get_string(r, rp, "prompt", u.prompt);
    get_string(r, rp, "negative", u.negative);
    if (get_number(r, rp, "weight", 0.0, 1000.0, u.weight) && !(u.weight > 0))
      add(rp + "/weight", "must be a positive number (the region's weight against the others where they overlap)");
    get_string(r, rp, "character", u.character);
    p.regions.push_back(u);
  }

  void read_region_box(const json& b, const std::string& bp, RegionUse& u) {
    const bool numbers = b.is_array() && b.size() == 4 &&
                         std::all_of(b.begin(), b.end(), [](const json& v) { return v.is_number(); });
    if (!numbers) {
      add(bp, "must be [x0, y0, x1, y1]: four numbers, fractions of the panel from 0 to 1");
      return;
    }
    u.x0 = b[0].get<double>(), u.y0 = b[1].get<double>(), u.x1 = b[2].get<double>(), u.y1 = b[3].get<double>();
    if (const std::string why = region_box_problem(u.x0, u.y0, u.x1, u.y1); !why.empty()) add(bp, why);
  }

  // A task's region masks (its own or the defaults') against its size: the panel's aspect ratio.
  void check_regions(const json& t, const std::string& ptr, const GenerationParams& p) {
    const std::string base = t.contains("regions") ? ptr + "/regions/" : "/defaults/regions/";
    for (size_t k = 0; k < p.regions.size(); ++k) {
      const RegionUse& r = p.regions[k];
      int mw = 0, mh = 0;
      if (r.mask.empty() || !png_size(r.mask, mw, mh).empty()) continue;  // reported by read_region
      const std::string why = region_mask_aspect_problem(mw, mh, p.width, p.height);
      if (!why.empty())
        add(base + std::to_string(k) + "/mask",
            "'" + r.mask + "' " + why + (t.contains("regions") ? "" : " (task " + ptr + ")"));
    }
  }

  void read_mask(const json& obj, const std::string& pointer, GenerationParams& p) {
    std::string rel;
    if (!get_path(obj, pointer, "mask", rel)) return;
    const std::filesystem::path path = base_dir / rel;
    if (!stays_inside(pointer + "/mask", rel, path)) return;
    const std::string why = checks ? checks->mask_problem(path.string()) : std::string();
    if (!why.empty()) {
      add(pointer + "/mask", "'" + path.string() + "' " + why);
      return;
    }
    p.mask = path.string();
    p.mask_sha256 = sha256_file_hex(path).value_or("");
  }

  // A task's mask (its own or the defaults') against the rest of the task (mask_settings_problem).
  void check_mask(const json& t, const std::string& ptr, const GenerationParams& p) {
    if (!p.inpaint()) return;
    int mw = 0, mh = 0;
    if (!png_size(p.mask, mw, mh).empty()) return;  // reported by read_mask
    const std::string why = mask_settings_problem(p, mw, mh);
    if (why.empty()) return;
    const std::string from = t.contains("mask") ? "" : " (from /defaults/mask)";
    add(ptr + (t.contains("mask") ? "/mask" : ""), "'" + p.mask + "'" + from + " " + why);
  }

  // Every denoising pass of a task (img2img, the hires fix's second pass, each detailer unit's regions)
  // leaves at least one sampler step (strength_steps_problem); the values may come from /defaults.
  void check_step_counts(const json& t, const std::string& ptr, const GenerationParams& p) {
    const auto check = [&](bool own, const std::string& where, int steps, double strength) {
      const std::string why = strength_steps_problem(steps, strength);
      if (!why.empty()) add(own ? ptr + where : ptr, (own ? "" : "its " + where.substr(1) + " (from /defaults) ") + why);
    };
    if (!p.init_image.empty()) check(t.contains("strength"), "/strength", p.steps, p.strength);
    if (p.hires_on()) check(t.contains("hires"), "/hires/denoise", p.hires_steps(), p.hires.denoise);
    for (size_t k = 0; k < p.detailer.size(); ++k)
      check(t.contains("detailer"), "/detailer/" + std::to_string(k) + "/denoise",
            p.detailer[k].steps > 0 ? p.detailer[k].steps : p.steps, p.detailer[k].denoise);
  }

  // Sampler and schedule are checked together (a task may set one, the defaults the other).
  void check_sampler(const json& obj, const std::string& pointer, GenerationParams& p) {
    if (!checks) return;
    try {
      checks->canonicalize_sampler(p);
    } catch (const UsageError& e) {
      const bool schedule_only = obj.contains("schedule") && !obj.contains("sampler");
      add(pointer + (schedule_only ? "/schedule" : "/sampler"), e.what());
      p.sampler = "Euler";
      p.schedule = "Automatic";
    }
  }

  // "timeout": seconds (a number) or a duration string ("90s", "5m").
  void read_timeout(const json& obj, const std::string& pointer, double& out) {
    if (!obj.contains("timeout")) return;
    const json& v = obj["timeout"];
    if (v.is_number()) {
      const double x = v.get<double>();
      if (!(x > 0 && x <= 7 * 86400.0)) add(pointer + "/timeout", "must be > 0 and at most 7 days (in seconds)");
      else out = x;
    } else if (v.is_string()) {
      try {
        const double x = parse_duration_s(v.get<std::string>());
        if (!(x > 0 && x <= 7 * 86400.0)) add(pointer + "/timeout", "must be > 0 and at most 7 days");
        else out = x;
      } catch (const UsageError& e) {
        add(pointer + "/timeout", e.what());
      }
    } else {
      add(pointer + "/timeout", "must be seconds (a number) or a duration like \"90s\" or \"5m\"");
    }
  }

  // Absolute and normalised, so the manifest compares the same file across runs
  // started from other folders.
  std::filesystem::path lora_path(const std::string& raw) const {
    const std::filesystem::path p(raw);
    return absolute_normal(p.is_absolute() ? p : base_dir / p);
  }
  bool check_file(const std::string& pointer, const std::string& raw, const std::filesystem::path& p) {
    if (!stays_inside(pointer, raw, p)) return false;
    const std::string why = input_file_problem(p, std::numeric_limits<std::uint64_t>::max());
    if (why.empty()) return true;
    add(pointer, "LoRA file '" + p.string() + "' " + why);
    return false;
  }

  // [{"name": N | "path": F, "weight": W}] -> resolved references.
  void read_loras(const json& arr, const std::string& pointer, std::vector<LoraRef>& out) {
    out.clear();
    if (!arr.is_array()) {
      add(pointer, "must be an array like [{\"name\": \"hero\", \"weight\": 0.8}]");
      return;
    }
    for (size_t k = 0; k < arr.size(); ++k) {
      const std::string ptr = pointer + "/" + std::to_string(k);
      const json& e = arr[k];
      if (!e.is_object()) {
        add(ptr, "must be an object with \"name\" (from the top-level \"loras\") or \"path\", and \"weight\"");
        continue;
      }
      check_keys(e, ptr, {"name", "path", "weight"});
      LoraRef r;
      get_number(e, ptr, "weight", -10.0, 10.0, r.weight);
      std::string name, path;
      const bool has_name = get_string(e, ptr, "name", name), has_path = get_string(e, ptr, "path", path);
      if (has_name == has_path) {
        add(ptr, "needs exactly one of \"name\" and \"path\"");
        continue;
      }
      if (has_name) {
        const auto it = registry ? registry->find(name) : LoraRegistry::const_iterator{};
        if (!registry || it == registry->end()) {
          std::string known;
          if (registry)
            for (const auto& [n, entry] : *registry) known += (known.empty() ? "" : ", ") + n;
          add(ptr + "/name", "unknown LoRA '" + name + "' (the top-level \"loras\" has: " +
                                 (known.empty() ? std::string("nothing") : known) + ")");
          continue;
        }
        r.name = name;
        r.path = it->second.path;
        r.pin = it->second.pin;
      } else {
        r.path = lora_path(path);
        r.name = r.path.stem().string();
        if (!check_file(ptr + "/path", path, r.path)) continue;
      }
      out.push_back(r);
    }
  }
};

}  // namespace

namespace {

// "loras": {"NAME": {"path": FILE, "pin": bool}}: the names tasks and prompt tags use.
void read_lora_registry(Checker& ck, const json& j, BatchFile& bf) {
  if (!j.contains("loras")) return;
  if (!j["loras"].is_object()) {
    ck.add("/loras", "must be an object like {\"hero\": {\"path\": \"loras/hero.safetensors\", \"pin\": true}}");
    return;
  }
  for (const auto& [name, e] : j["loras"].items()) {
    const std::string ptr = "/loras/" + name;
    if (!e.is_object()) {
      ck.add(ptr, "must be an object with \"path\" (and optionally \"pin\")");
      continue;
    }
    ck.check_keys(e, ptr, {"path", "pin"});
    LoraRegistryEntry entry;
    std::string path;
    if (!ck.get_string(e, ptr, "path", path)) {
      if (!e.contains("path")) ck.add(ptr + "/path", "is missing");
      continue;
    }
    entry.path = ck.lora_path(path);
    if (e.contains("pin")) {
      if (!e["pin"].is_boolean()) ck.add(ptr + "/pin", "must be true or false");
      else entry.pin = e["pin"].get<bool>();
    }
    ck.check_file(ptr + "/path", path, entry.path);  // reported; the name stays known for the tasks
    bf.lora_registry[name] = entry;
  }
}

// "version", "model" and "output": {"dir", "template"}.
// "pins": {"FOLDER": "SHA256"}: FOLDER relative to the batch file (confined as every folder key), the
// sha256 of its model.json as 64 hex digits.
void read_pins(Checker& ck, const json& j, BatchFile& bf) {
  if (!j.contains("pins")) return;
  if (!j["pins"].is_object()) {
    ck.add("/pins", "must be an object of folder -> the sha256 of its model.json (sha256sum FOLDER/model.json)");
    return;
  }
  for (const auto& [rel, v] : j["pins"].items()) {
    const std::string ptr = "/pins/" + escape_json_pointer(rel);
    std::string hex = v.is_string() ? v.get<std::string>() : "";
    std::transform(hex.begin(), hex.end(), hex.begin(), [](unsigned char c) { return std::tolower(c); });
    if (hex.size() != 64 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) {
      ck.add(ptr, "must be the 64 hex digits of sha256sum FOLDER/model.json");
      continue;
    }
    if (rel.empty()) {
      ck.add(ptr, "names no folder");
      continue;
    }
    const std::string folder = ck.resolve(rel);
    if (ck.stays_inside(ptr, rel, folder)) bf.pins.push_back({folder, hex, ptr});
  }
}

void read_header(Checker& ck, const json& j, BatchFile& bf) {
  long long version = 1;
  if (!j.contains("version")) ck.add("/version", "is missing (write \"version\": 1)");
  else if (ck.get_int(j, "", "version", 1, 1, version)) bf.version = static_cast<int>(version);
  ck.get_string(j, "", "model", bf.model);
  if (!j.contains("output")) return;
  if (!j["output"].is_object()) {
    ck.add("/output", "must be an object like {\"dir\": \"out\"}");
    return;
  }
  ck.check_keys(j["output"], "/output", {"dir", "template"});
  ck.get_string(j["output"], "/output", "dir", bf.output_dir);
  if (ck.get_string(j["output"], "/output", "template", bf.name_template)) {
    const std::string why = check_name_template(bf.name_template);
    if (!why.empty()) {
      ck.add("/output/template", why);
      bf.name_template = kDefaultNameTemplate;
    }
  }
}

// "characters": {NAME: {"prompt", "negative", "loras", "reference"}} and "styles": {NAME: {"prompt", "negative"}}.
StoryBook read_story_book(Checker& ck, const json& j) {
  StoryBook book;
  if (j.contains("characters")) {
    if (!j["characters"].is_object()) ck.add("/characters", "must be an object like {\"hero\": {\"prompt\": \"...\"}}");
    else
      for (const auto& [name, c] : j["characters"].items()) {
        const std::string ptr = "/characters/" + escape_json_pointer(name);
        if (!c.is_object()) {
          ck.add(ptr, "must be an object with \"prompt\" (and optionally \"negative\", \"loras\")");
          continue;
        }
        ck.check_keys(c, ptr, {"prompt", "negative", "loras", "reference"});
        Character ch;
        ck.get_string(c, ptr, "prompt", ch.prompt);
        ck.get_string(c, ptr, "negative", ch.negative);
        if (c.contains("loras")) ck.read_loras(c["loras"], ptr + "/loras", ch.loras);
        if (c.contains("reference")) ck.read_reference(c["reference"], ptr + "/reference", ch);
        book.characters[name] = ch;
      }
  }
  if (j.contains("styles")) {
    if (!j["styles"].is_object()) ck.add("/styles", "must be an object like {\"ink\": {\"prompt\": \"{prompt}, ink\"}}");
    else
      for (const auto& [name, st] : j["styles"].items()) {
        const std::string ptr = "/styles/" + escape_json_pointer(name);
        if (!st.is_object()) {
          ck.add(ptr, "must be an object with \"prompt\" (and optionally \"negative\")");
          continue;
        }
        ck.check_keys(st, ptr, {"prompt", "negative"});
        Style style;
        ck.get_string(st, ptr, "prompt", style.prompt);
        ck.get_string(st, ptr, "negative", style.negative);
        book.styles[name] = style;
      }
  }
  return book;
}

// A task's (or the defaults') story fields: characters, style, wildcard expansion.
struct StoryFields {
  std::vector<std::string> characters;
  std::string style;
  bool expand_all = false;
  long long max_images = 1000;
};

void read_story_fields(Checker& ck, const json& obj, const std::string& ptr, StoryFields& f) {
  if (obj.contains("characters")) {
    const json& c = obj["characters"];
    f.characters.clear();
    if (!c.is_array()) ck.add(ptr + "/characters", "must be an array of character names like [\"hero\", \"fox\"]");
    else
      for (size_t k = 0; k < c.size(); ++k) {
        if (c[k].is_string()) f.characters.push_back(c[k].get<std::string>());
        else ck.add(ptr + "/characters/" + std::to_string(k), "must be a character name (a string)");
      }
  }
  ck.get_string(obj, ptr, "style", f.style);
  std::string expand;
  if (ck.get_string(obj, ptr, "expand", expand)) {
    if (expand != "random" && expand != "all") ck.add(ptr + "/expand", "'" + expand + "' is not random or all");
    else f.expand_all = expand == "all";
  }
  ck.get_key_int(obj, ptr, "max_images", f.max_images);
}

// What every task starts from: the model's defaults, then the file's "defaults".
struct TaskDefaults {
  GenerationParams params;
  bool sets_width = false, sets_height = false;  // in /defaults: an init image must then match them
  std::string priority = "mid";
  double timeout_s = 0;
  StoryFields story;
};

TaskDefaults read_defaults(Checker& ck, const json& j, const GenerationParams& fallback) {
  TaskDefaults td;
  td.params = fallback;
  if (!j.contains("defaults")) return td;
  if (!j["defaults"].is_object()) {
    ck.add("/defaults", "must be an object");
    return td;
  }
  const json& d = j["defaults"];
  td.sets_width = d.contains("width");
  td.sets_height = d.contains("height");
  ck.check_keys(d, "/defaults", allowed_keys(true));
  ck.read_settings(d, "/defaults", td.params);
  ck.check_sampler(d, "/defaults", td.params);
  ck.check_timesteps(d, "/defaults", td.params);
  if (ck.get_string(d, "/defaults", "priority", td.priority) && !parse_priority(td.priority)) {
    ck.add("/defaults/priority", "'" + td.priority + "' is not a priority (high, mid, low)");
    td.priority = "mid";
  }
  ck.read_timeout(d, "/defaults", td.timeout_s);
  read_story_fields(ck, d, "/defaults", td.story);
  return td;
}

// The scheduling fields of a task: seed, count, priority, deadline, timeout.
void read_task_schedule(Checker& ck, const json& t, const std::string& ptr, const TaskDefaults& td, BatchTask& task) {
  long long v = 0;
  if (t.contains("seed")) {
    if (ck.get_key_int(t, ptr, "seed", v)) {
      task.seed_random = v == -1;
      task.params.seed = v == -1 ? 0 : v;
    }
  } else {
    task.seed_random = true;
  }
  if (ck.get_key_int(t, ptr, "count", v)) task.count = static_cast<int>(v);
  task.priority = td.priority;
  if (ck.get_string(t, ptr, "priority", task.priority) && !parse_priority(task.priority)) {
    ck.add(ptr + "/priority", "'" + task.priority + "' is not a priority (high, mid, low)");
    task.priority = "mid";
  }
  if (ck.get_string(t, ptr, "deadline", task.deadline)) {
    try {
      parse_deadline_unix(task.deadline, 0);
    } catch (const UsageError& e) {
      ck.add(ptr + "/deadline", e.what());
      task.deadline.clear();
    }
  }
  task.timeout_s = td.timeout_s;
  ck.read_timeout(t, ptr, task.timeout_s);
}

bool wildcards_ok(const std::string& text, const WildcardLibrary& lib) {
  try {
    check_template(text, lib);
    return true;
  } catch (const UsageError&) {
    return false;
  }
}

// Characters, style and wildcards of a task: the prompt it will expand, checked;
// with "expand": "all", its images are the combinations.
void apply_task_story(Checker& ck, const json& t, const std::string& ptr, const TaskDefaults& td,
                      const StoryBook& book, const WildcardLibrary& lib, BatchTask& task) {
  StoryFields f = td.story;
  read_story_fields(ck, t, ptr, f);
  task.source_prompt = task.params.prompt;
  task.characters = f.characters;
  task.style = f.style;
  std::vector<std::pair<std::string, std::string>> problems;
  apply_story(book, f.characters, f.style, task.params, problems);
  for (const auto& [where, msg] : problems) {
    const bool from_defaults = where.starts_with("/regions/") && !t.contains("regions");
    ck.add(from_defaults ? "/defaults" + where : ptr + where, msg + (from_defaults ? " (task " + ptr + ")" : ""));
  }
  const GenerationParams& p = task.params;
  for (size_t k = 0; k < p.regions.size(); ++k)
    if (!extract_lora_tags(p.regions[k].prompt).tags.empty())
      ck.add(ptr + "/regions/" + std::to_string(k) + "/prompt",
             "has a <lora:...> tag: a LoRA changes the weights of the whole panel, not one region (put the tag in "
             "the task's prompt)");
  if (p.ip_adapter.on() && p.ip_adapter.images.empty() && !p.region_references())
    ck.add(ptr + (t.contains("ip_adapter") ? "/ip_adapter/images" : "/ip_adapter"),
           "the IP-Adapter has no reference picture: give it \"images\", or name characters with a \"reference\" "
           "(in the task's \"characters\" or its regions)");
  if (!prompt_has_wildcards(task.params)) return;
  std::string failed;
  try {
    check_prompt_wildcards(task.params, lib, &failed);
  } catch (const UsageError& e) {
    // A negative the task does not set is the defaults' when that text alone fails: reported there, once.
    const bool in_defaults =
        failed == "negative" && !t.contains("negative") && !wildcards_ok(td.params.negative_prompt, lib);
    const auto said = [&](const BatchProblem& b) { return b.pointer == "/defaults/negative"; };
    if (!in_defaults) ck.add(ptr + "/" + failed, e.what());
    else if (std::none_of(ck.problems.begin(), ck.problems.end(), said)) ck.add("/defaults/negative", e.what());
    return;
  }
  if (!f.expand_all) return;
  if (t.contains("count")) ck.add(ptr + "/count", "cannot be combined with \"expand\": \"all\" (one image per combination)");
  const std::uint64_t n = prompt_combinations(task.params, lib, static_cast<std::uint64_t>(f.max_images));
  if (n > static_cast<std::uint64_t>(f.max_images)) {
    ck.add(ptr + "/expand", "\"all\" makes more than " + std::to_string(f.max_images) +
                                " images (\"max_images\"): use random expansion, or raise max_images");
    return;
  }
  task.expand_all = true;
  task.count = static_cast<int>(std::max<std::uint64_t>(1, n));
}

// A file name longer than a file system allows (255 bytes per component)
// would fail every image of the task at run time: refused here, with the
// longest seed the task can get.
void check_file_name_length(Checker& ck, const std::string& ptr, const BatchTask& task, const std::string& tmpl) {
  const std::int64_t seed = task.seed_random ? 4294967295LL : task.params.seed + task.count - 1;
  const std::string name = output_file_name(task, task.count - 1, seed, tmpl, "2026-12-31");
  size_t start = 0;
  while (start < name.size()) {
    const size_t slash = std::min(name.find('/', start), name.size());
    if (slash - start > 255) {
      ck.add(ptr + "/id", "its file name would be " + std::to_string(slash - start) +
                              " bytes long, more than the 255 a file system allows (shorten the id or the template)");
      return;
    }
    start = slash + 1;
  }
}

// One task; false when it is not an object (nothing to add).
bool read_task(Checker& ck, const json& t, const std::string& ptr, const TaskDefaults& td, const StoryBook& book,
               const WildcardLibrary& lib, const std::filesystem::path& origin, std::set<std::string>& ids,
               BatchTask& task) {
  if (!t.is_object()) {
    ck.add(ptr, "must be an object with at least \"id\" and \"prompt\"");
    return false;
  }
  ck.check_keys(t, ptr, allowed_keys(false));
  task.params = td.params;
  task.params.prompt.clear();
  if (!ck.get_string(t, ptr, "id", task.id) || task.id.empty()) {
    if (!t.contains("id")) ck.add(ptr + "/id", "is missing (each task needs a unique id)");
  } else if (!ids.insert(task.id).second) {
    ck.add(ptr + "/id", "'" + task.id + "' is used by an earlier task; ids must be unique");
  }
  if (!t.contains("prompt")) ck.add(ptr + "/prompt", "is missing");
  ck.task_id = task.id;
  ck.read_settings(t, ptr, task.params);
  ck.task_id.clear();
  if (t.contains("sampler") || t.contains("schedule")) ck.check_sampler(t, ptr, task.params);
  if (t.contains("timesteps") || t.contains("sampler") || t.contains("schedule") || t.contains("steps"))
    ck.check_timesteps(t, ptr, task.params);
  ck.read_init_image(t, ptr, origin, td.sets_width, td.sets_height, task.params);
  ck.check_mask(t, ptr, task.params);
  ck.check_regions(t, ptr, task.params);
  ck.check_step_counts(t, ptr, task.params);
  ck.check_task_upscale(t, ptr, task.params);
  read_task_schedule(ck, t, ptr, td, task);
  apply_task_story(ck, t, ptr, td, book, lib, task);
  return true;
}

}  // namespace

std::string strength_steps_problem(int steps, double strength) {
  if (!(strength > 0)) return "is " + format_number(strength) + ": a denoising pass needs a strength above 0 (at most 1)";
  if (strength_steps(steps, strength) >= 1) return "";
  return "leaves no step to run: int(steps * strength) = int(" + std::to_string(steps) + " * " +
         format_number(strength) + ") = 0 (raise it or the steps)";
}

std::string init_size_problem(int image_w, int image_h, int width, int height) {
  if (image_w == width && image_h == height) return "";
  return "is " + std::to_string(image_w) + "x" + std::to_string(image_h) + " but the task asks for " +
         std::to_string(width) + "x" + std::to_string(height) +
         " (drop width/height to take the image's size, or resize the image)";
}

std::string mask_settings_problem(const GenerationParams& p, int mask_w, int mask_h) {
  if (p.init_image.empty()) return "is a mask but the task has no init image (a mask marks what to repaint of one)";
  if (p.hires_on()) return "is a mask, which the hires fix cannot be combined with (its second pass would repaint all)";
  if (mask_w <= 0 || mask_h <= 0) return "";  // size unknown (no file checks)
  // Within a pixel along either side: the mask's width at the task's height, or its height at the task's width.
  const double w_at_task_height = static_cast<double>(mask_w) * p.height / mask_h;
  const double h_at_task_width = static_cast<double>(mask_h) * p.width / mask_w;
  if (std::abs(w_at_task_height - p.width) <= 1.0 || std::abs(h_at_task_width - p.height) <= 1.0) return "";
  return "is " + std::to_string(mask_w) + "x" + std::to_string(mask_h) + ", another aspect ratio than the task's " +
         std::to_string(p.width) + "x" + std::to_string(p.height) +
         " (a mask is resized to the task's size, never cropped or stretched: make it the init image's shape)";
}

std::string read_batch_text(const std::filesystem::path& path) {
  return read_input_file(path, "batch file", kMaxBatchFileBytes);
}

std::vector<DetailerUse> read_detailer_list(const nlohmann::json& list, const std::filesystem::path& base_dir,
                                            InputChecks* checks, std::vector<BatchProblem>& problems) {
  const json obj = {{"detailer", list}};
  check_batch_strings(obj, problems);
  Checker ck{{problems}, base_dir, checks};
  GenerationParams p;
  ck.read_detailer(obj, "", p);
  return p.detailer;
}

BatchFile parse_batch_text(const std::string& text, const std::filesystem::path& origin,
                           const GenerationParams& fallback, std::vector<BatchProblem>* problems_out,
                           const std::vector<std::filesystem::path>& wildcard_dirs, InputChecks* checks) {
  std::vector<BatchProblem> problems;
  Checker ck{{problems}, origin.parent_path(), checks};
  BatchFile bf;
  bf.path = origin;
  const JsonShape shape = check_json_shape(text);
  for (const auto& [ptr, msg] : shape.problems) problems.push_back({ptr, msg});
  if (shape.too_deep) {
    if (problems_out) *problems_out = problems;
    return bf;
  }
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers that overflow
    problems.push_back({"", std::string("not valid JSON: ") + e.what()});
    if (problems_out) *problems_out = problems;
    return bf;
  }
  check_batch_strings(j, problems);  // the text rule, before any value is used
  if (!j.is_object()) {
    ck.add("", "a batch file is a JSON object with \"version\" and \"tasks\"");
  } else {
    ck.check_keys(j, "", {"$schema", "version", "model", "output", "loras", "defaults", "tasks", "characters",
                          "styles", "wildcards_dir", "embeddings_dir", "pins", "video"});
    read_lora_registry(ck, j, bf);
    read_pins(ck, j, bf);
    ck.registry = &bf.lora_registry;
    read_header(ck, j, bf);
    bf.wildcard_dirs = wildcard_dirs;
    std::string wd;
    if (ck.get_string(j, "", "wildcards_dir", wd) && ck.stays_inside("/wildcards_dir", wd, ck.base_dir / wd))
      bf.wildcard_dirs.push_back(ck.base_dir / wd);
    std::string ed;
    if (ck.get_string(j, "", "embeddings_dir", ed) && ck.stays_inside("/embeddings_dir", ed, ck.base_dir / ed)) {
      std::error_code ec;
      if (std::filesystem::is_directory(ck.base_dir / ed, ec)) bf.embedding_dirs.push_back(ck.base_dir / ed);
      else ck.add("/embeddings_dir", "'" + (ck.base_dir / ed).string() + "' is not a folder");
    }
    const WildcardLibrary lib(bf.wildcard_dirs);
    const StoryBook book = read_story_book(ck, j);
    const TaskDefaults td = read_defaults(ck, j, fallback);
    if (!j.contains("tasks") || !j["tasks"].is_array() || j["tasks"].empty()) {
      ck.add("/tasks", "must be a non-empty array of tasks");
    } else {
      std::set<std::string> ids;
      std::vector<std::string> pointers;  // of bf.tasks
      for (size_t i = 0; i < j["tasks"].size(); ++i) {
        BatchTask task;
        if (read_task(ck, j["tasks"][i], "/tasks/" + std::to_string(i), td, book, lib, origin, ids, task)) {
          check_file_name_length(ck, "/tasks/" + std::to_string(i), task, bf.name_template);
          bf.tasks.push_back(task);
          pointers.push_back("/tasks/" + std::to_string(i));
        }
      }
      for (BatchProblem& p : output_name_collisions(bf.tasks, pointers, bf.name_template)) problems.push_back(p);
    }
    if (j.contains("video"))
      bf.video = std::make_shared<VideoSpec>(read_video_spec(j["video"], ck.base_dir, bf.tasks, checks, problems));
  }
  if (problems_out) *problems_out = problems;
  return bf;
}

namespace {

// Minimal JSON walker that only tracks where each value starts.
class LineScanner {
 public:
  explicit LineScanner(const std::string& t) : t_(t) {}
  std::map<std::string, int> run() {
    try {
      value("");
    } catch (const std::exception&) {
      // malformed: keep what was found
    }
    return lines_;
  }

 private:
  void ws() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\t' || t_[i_] == '\n' || t_[i_] == '\r')) {
      if (t_[i_] == '\n') ++line_;
      ++i_;
    }
  }
  char peek() {
    ws();
    if (i_ >= t_.size()) throw std::runtime_error("eof");
    return t_[i_];
  }
  std::string string_token() {
    std::string out;
    ++i_;  // opening quote
    while (i_ < t_.size() && t_[i_] != '"') {
      if (t_[i_] == '\\' && i_ + 1 < t_.size()) ++i_;
      if (t_[i_] == '\n') ++line_;
      out.push_back(t_[i_++]);
    }
    ++i_;
    return out;
  }
  void value(const std::string& ptr, int depth = 0) {
    if (depth > kMaxJsonDepth) throw std::runtime_error("too deep");  // check_json_shape reports it
    const char c = peek();
    lines_[ptr] = line_;
    if (c == '{') {
      ++i_;
      if (peek() == '}') { ++i_; return; }
      while (true) {
        if (peek() != '"') throw std::runtime_error("key");
        const std::string key = string_token();
        if (peek() != ':') throw std::runtime_error(":");
        ++i_;
        value(ptr + "/" + escape_json_pointer(key), depth + 1);
        const char d = peek();
        ++i_;
        if (d == '}') return;
        if (d != ',') throw std::runtime_error(",");
      }
    } else if (c == '[') {
      ++i_;
      if (peek() == ']') { ++i_; return; }
      for (int n = 0;; ++n) {
        value(ptr + "/" + std::to_string(n), depth + 1);
        const char d = peek();
        ++i_;
        if (d == ']') return;
        if (d != ',') throw std::runtime_error(",");
      }
    } else if (c == '"') {
      string_token();
    } else {
      while (i_ < t_.size() && std::string(",}] \t\r\n").find(t_[i_]) == std::string::npos) ++i_;
    }
  }

  const std::string& t_;
  size_t i_ = 0;
  int line_ = 1;
  std::map<std::string, int> lines_;
};

// Line of a pointer, or of its nearest ancestor that exists (a missing key).
int line_of(const std::map<std::string, int>& lines, std::string ptr) {
  while (true) {
    auto it = lines.find(ptr);
    if (it != lines.end()) return it->second;
    if (ptr.empty()) return 0;
    ptr = ptr.substr(0, ptr.rfind('/'));
  }
}


std::string describe(const std::filesystem::path& path, const std::vector<BatchProblem>& problems) {
  std::string msg = "batch file '" + path.string() + "' has " + std::to_string(problems.size()) + " problem(s):";
  for (const auto& p : problems) {
    msg += "\n  " + (p.pointer.empty() ? std::string("/") : p.pointer);
    if (p.line > 0) msg += " (line " + std::to_string(p.line) + ")";
    msg += ": " + p.message;
  }
  return msg;
}

}  // namespace

std::map<std::string, int> json_pointer_lines(const std::string& text) { return LineScanner(text).run(); }

void attach_lines(const std::string& text, std::vector<BatchProblem>& problems) {
  const auto lines = json_pointer_lines(text);
  for (auto& p : problems) p.line = line_of(lines, p.pointer);
}

std::string describe_problems(const std::filesystem::path& path, const std::vector<BatchProblem>& problems) {
  return describe(path, problems);
}

BatchFile parse_batch_file(const std::filesystem::path& path, const GenerationParams& fallback,
                           const std::vector<std::filesystem::path>& wildcard_dirs, InputChecks* checks) {
  const std::string text = read_batch_text(path);
  std::vector<BatchProblem> problems;
  BatchFile bf = parse_batch_text(text, path, fallback, &problems, wildcard_dirs, checks);
  if (!problems.empty()) {
    attach_lines(text, problems);
    throw UsageError(describe(path, problems));
  }
  return bf;
}

namespace {

const char* const kTemplateFields[] = {"id", "index", "seed", "date", "steps", "cfg", "width", "height"};

std::string safe_id(const std::string& raw) {
  std::string id;
  for (char c : raw) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                    c == '_' || c == '.';
    id.push_back(ok ? c : '_');
  }
  if (id.empty() || id[0] == '.') id.insert(0, "_");
  return id;
}

std::string format_cfg(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

std::string check_name_template(const std::string& tmpl) {
  if (tmpl.empty()) return "is empty";
  if (tmpl[0] == '/') return "must be relative to the output folder (no leading '/')";
  if (tmpl.size() < 5 || tmpl.compare(tmpl.size() - 4, 4, ".png") != 0) return "must end in .png";
  for (size_t i = 0; i < tmpl.size(); ++i)
    if (static_cast<unsigned char>(tmpl[i]) < 0x20 || tmpl[i] == 0x7f)
      return "has a control character (code " + std::to_string(static_cast<unsigned char>(tmpl[i])) +
             ") at character " + std::to_string(i + 1) + ": file names may not hold one";
  for (size_t i = 0; i < tmpl.size(); ++i) {
    if (tmpl[i] == '{') {
      const size_t end = tmpl.find('}', i);
      if (end == std::string::npos) return "has an unclosed '{'";
      const std::string name = tmpl.substr(i + 1, end - i - 1);
      bool known = false;
      for (const char* p : kTemplateFields) known |= name == p;
      if (!known) return "has unknown field {" + name + "} (known: {id} {index} {seed} {date} {steps} {cfg} {width} {height})";
      i = end;
    }
  }
  // Any path component ".." could leave the output folder.
  size_t start = 0;
  while (start <= tmpl.size()) {
    const size_t slash = tmpl.find('/', start);
    const std::string part = tmpl.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (part == "..") return "must not contain '..' (it could leave the output folder)";
    if (part.empty() && slash != std::string::npos) return "has an empty path component ('//')";
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  if (tmpl.find("{index}") == std::string::npos && tmpl.find("{seed}") == std::string::npos)
    return "must contain {index} or {seed} so the images of one task get different names";
  return "";
}

std::string output_file_name(const BatchTask& task, int index, std::int64_t seed, const std::string& tmpl,
                             const std::string& date) {
  std::string out;
  for (size_t i = 0; i < tmpl.size(); ++i) {
    if (tmpl[i] != '{') {
      out.push_back(tmpl[i]);
      continue;
    }
    const size_t end = tmpl.find('}', i);
    if (end == std::string::npos) {  // unclosed: literal (check_name_template rejects it)
      out += tmpl.substr(i);
      break;
    }
    const std::string name = tmpl.substr(i + 1, end - i - 1);
    if (name == "id") out += safe_id(task.id);
    else if (name == "index") out += std::to_string(index);
    else if (name == "seed") out += std::to_string(seed);
    else if (name == "date") out += date;
    else if (name == "steps") out += std::to_string(task.params.steps);
    else if (name == "cfg") out += format_cfg(task.params.cfg);
    else if (name == "width") out += std::to_string(task.params.width);
    else if (name == "height") out += std::to_string(task.params.height);
    i = end;
  }
  return out;
}

}  // namespace sdxl

namespace sdxl {

double parse_deadline_unix(const std::string& text, double now_unix) {
  const std::string hint = "deadline '" + text +
                           "': expected an RFC 3339 time like 2026-12-01T06:00:00Z (or with an offset such as "
                           "+01:00) or a local time of day HH:MM";
  int hh = 0, mm = 0;
  char tail = 0;
  if (text.size() == 5 && std::sscanf(text.c_str(), "%2d:%2d%c", &hh, &mm, &tail) == 2) {
    if (hh > 23 || mm > 59 || text[2] != ':') throw UsageError(hint);
    const std::time_t now = static_cast<std::time_t>(now_unix);
    std::tm tm{};
    localtime_r(&now, &tm);
    tm.tm_hour = hh;
    tm.tm_min = mm;
    tm.tm_sec = 0;
    tm.tm_isdst = -1;
    double t = static_cast<double>(std::mktime(&tm));
    if (t <= now_unix) {
      tm.tm_mday += 1;
      tm.tm_isdst = -1;
      t = static_cast<double>(std::mktime(&tm));
    }
    return t;
  }
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0, consumed = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &s, &consumed) != 6 ||
      consumed != 19 || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || s > 60)
    throw UsageError(hint);
  std::string rest = text.substr(19);
  if (!rest.empty() && rest[0] == '.') {  // fractional seconds: ignored
    size_t k = 1;
    while (k < rest.size() && std::isdigit(static_cast<unsigned char>(rest[k]))) ++k;
    if (k == 1) throw UsageError(hint);
    rest = rest.substr(k);
  }
  long offset_s = 0;
  if (rest == "Z" || rest == "z") {
    offset_s = 0;
  } else if (rest.size() == 6 && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':' &&
             std::isdigit(static_cast<unsigned char>(rest[1])) && std::isdigit(static_cast<unsigned char>(rest[2])) &&
             std::isdigit(static_cast<unsigned char>(rest[4])) && std::isdigit(static_cast<unsigned char>(rest[5]))) {
    const int oh = (rest[1] - '0') * 10 + (rest[2] - '0'), om = (rest[4] - '0') * 10 + (rest[5] - '0');
    if (oh > 23 || om > 59) throw UsageError(hint);
    offset_s = (oh * 3600L + om * 60L) * (rest[0] == '-' ? -1 : 1);
  } else {
    throw UsageError(hint + " (the time zone is missing: end with Z or an offset)");
  }
  std::tm tm{};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = s;
  return static_cast<double>(timegm(&tm)) - static_cast<double>(offset_s);
}

}  // namespace sdxl

namespace sdxl {

}  // namespace sdxl
