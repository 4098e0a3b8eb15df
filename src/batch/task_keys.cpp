#include "batch/task_keys.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "batch/regions.h"

namespace sdxl {
namespace {

using nlohmann::json;
using GP = GenerationParams;

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// The value at `pointer` ("/mask/blur") under `params`, or null when a part is missing or not an object.
const json* at_pointer(const json& params, std::string_view pointer) {
  const json* cur = &params;
  size_t pos = 1;
  while (pos <= pointer.size()) {
    const size_t slash = std::min(pointer.find('/', pos), pointer.size());
    const std::string part(pointer.substr(pos, slash - pos));
    if (!cur->is_object() || !cur->contains(part)) return nullptr;
    cur = &(*cur)[part];
    pos = slash + 1;
  }
  return cur;
}

bool img2img(const GP& p) { return !p.init_image.empty(); }
bool tcd(const GP& p) { return p.sampler == "TCD"; }
bool inpaint(const GP& p) { return p.inpaint(); }
bool inpaint_masked(const GP& p) { return p.inpaint_masked(); }
bool has_regions(const GP& p) { return p.has_regions(); }

// --- the structured keys' hooks ---------------------------------------------------------------------

const KeyHooks kMaskHooks{
    [](const GP& a, const GP& b) { return a.mask == b.mask && a.mask_sha256 == b.mask_sha256; },
    [](const GP& p, json& j) {
      if (!p.inpaint()) return;
      j["mask"]["file"] = p.mask;
      j["mask"]["sha256"] = p.mask_sha256;
    },
    [](const json& j, GP& p) {
      if (const json* m = at_pointer(j, "/mask"); m && m->is_object()) {
        p.mask = m->value("file", "");
        p.mask_sha256 = m->value("sha256", "");
      }
    },
    [](const GP& p, std::string& key) {
      if (p.inpaint()) key += "|inpaint";  // each row brings its own mask and blur
    }};

const KeyHooks kHiresHooks{
    [](const GP& a, const GP& b) {
      return a.hires.scale == b.hires.scale &&
             (!a.hires_on() || (a.hires.upscaler == b.hires.upscaler && a.hires.steps == b.hires.steps &&
                                a.hires.denoise == b.hires.denoise && a.hires.weights_sha256 == b.hires.weights_sha256));
    },
    [](const GP& p, json& j) {
      if (!p.hires_on()) return;
      j["hires"] = {{"scale", p.hires.scale}, {"upscaler", p.hires.upscaler}, {"steps", p.hires.steps},
                    {"denoise", p.hires.denoise}};
      if (p.hires_uses_model()) j["hires"]["weights_sha256"] = p.hires.weights_sha256;
    },
    [](const json& j, GP& p) {
      const json* h = at_pointer(j, "/hires");
      if (!h || !h->is_object()) return;
      p.hires.scale = h->value("scale", 0.0);
      p.hires.upscaler = h->value("upscaler", GP{}.hires.upscaler);
      p.hires.steps = h->value("steps", 0);
      p.hires.denoise = h->value("denoise", GP{}.hires.denoise);
      p.hires.weights_sha256 = h->value("weights_sha256", "");
    },
    [](const GP& p, std::string& key) {
      if (p.hires_on())
        key += "|hires" + num(p.hires.scale) + ":" + p.hires.upscaler + ":" + std::to_string(p.hires.steps) + ":" +
               num(p.hires.denoise);
    }};

const KeyHooks kTimestepsHooks{
    [](const GP& a, const GP& b) { return a.timesteps == b.timesteps; },
    [](const GP& p, json& j) {
      if (!p.timesteps.empty()) j["timesteps"] = p.timesteps;
    },
    [](const json& j, GP& p) {
      if (const json* t = at_pointer(j, "/timesteps"); t && t->is_array()) p.timesteps = t->get<std::vector<int>>();
    },
    [](const GP& p, std::string& key) {
      if (p.timesteps.empty()) return;
      key += "|timesteps";
      for (int t : p.timesteps) key += ":" + std::to_string(t);
    }};

const KeyHooks kLoraHooks{
    [](const GP& a, const GP& b) { return a.loras == b.loras; },
    [](const GP& p, json& j) {
      // Prompt tags are in the prompt; a rerun with other LoRAs must not skip the image.
      for (const auto& r : p.loras)
        j["loras"].push_back({{"name", r.name}, {"path", r.path.string()}, {"weight", r.weight}});
    },
    [](const json& j, GP& p) {
      const json* l = at_pointer(j, "/loras");
      if (!l || !l->is_array()) return;
      for (const auto& e : *l) {
        LoraRef r;
        r.name = e.value("name", "");
        r.path = e.value("path", "");
        r.weight = e.value("weight", 1.0);
        p.loras.push_back(r);
      }
    },
    [](const GP& p, std::string& key) {
      if (const std::string loras = lora_set_key(p); !loras.empty()) key += "|loras:" + loras;
    }};

const KeyHooks kControlNetHooks{
    [](const GP& a, const GP& b) { return a.controlnets == b.controlnets; },
    [](const GP& p, json& j) {
      for (const auto& c : p.controlnets) {
        json e = {{"model", c.model}, {"image", c.image}, {"strength", c.strength}, {"start", c.start}, {"end", c.end}};
        if (!c.type.empty()) e["type"] = c.type;  // a plain ControlNet's record stays as it was
        if (c.same_call) e["same_call"] = true;
        j["controlnets"].push_back(e);
      }
    },
    [](const json& j, GP& p) {
      const json* list = at_pointer(j, "/controlnets");
      if (!list || !list->is_array()) return;
      for (const auto& c : *list) {
        ControlNetUse u;
        u.model = c.value("model", "");
        u.image = c.value("image", "");
        u.strength = c.value("strength", 1.0);
        u.start = c.value("start", 0.0);
        u.end = c.value("end", 1.0);
        u.type = c.value("type", "");
        u.same_call = c.value("same_call", false);
        p.controlnets.push_back(u);
      }
    },
    [](const GP& p, std::string& key) {
      // The same models, strengths and windows (each image brings its own control image).
      for (const auto& c : p.controlnets)
        key += "|cn:" + c.model + ":" + num(c.strength) + ":" + num(c.start) + ":" + num(c.end) + ":" + c.type +
               (c.same_call ? ":+" : "");
    }};

const KeyHooks kIpAdapterHooks{
    [](const GP& a, const GP& b) { return a.ip_adapter == b.ip_adapter; },
    [](const GP& p, json& j) {
      if (p.ip_adapter.on())
        j["ip_adapter"] = {{"model", p.ip_adapter.model}, {"images", p.ip_adapter.images}, {"scale", p.ip_adapter.scale}};
    },
    [](const json& j, GP& p) {
      const json* ip = at_pointer(j, "/ip_adapter");
      if (!ip || !ip->is_object()) return;
      p.ip_adapter.model = ip->value("model", "");
      p.ip_adapter.scale = ip->value("scale", 1.0);
      if (const json* f = at_pointer(*ip, "/images"); f && f->is_array())
        for (const auto& name : *f)
          if (name.is_string()) p.ip_adapter.images.push_back(name.get<std::string>());
    },
    [](const GP& p, std::string& key) {
      // The same folder and reference count (one token row length); images and scale are each image's own.
      if (p.ip_adapter.on()) key += "|ip:" + p.ip_adapter.model + ":" + std::to_string(p.ip_adapter.images.size());
    }};

const KeyHooks kRegionHooks{
    [](const GP& a, const GP& b) { return a.regions == b.regions; },
    [](const GP& p, json& j) { record_regions(p, j); },
    [](const json& j, GP& p) { restore_regions(j, p); },
    [](const GP& p, std::string& key) {
      // Rows with and without regions share calls (each row carries its own prompts and weights); a
      // panel with regions and an IP-Adapter gives each reference its own masked group, so it does
      // not share with a panel whose references join one row.
      if (p.has_regions() && p.ip_adapter.on()) key += "|regions-ip";
    }};

const KeyHooks kUpscaleHooks{
    [](const GP& a, const GP& b) { return a.upscale == b.upscale; },
    [](const GP& p, json& j) {
      if (p.upscale.on())
        j["upscale"] = {{"model", p.upscale.model}, {"scale", p.upscale.scale}, {"width", p.upscale.width},
                        {"height", p.upscale.height}, {"fit", p.upscale.fit},
                        {"weights_sha256", p.upscale.weights_sha256}};
    },
    [](const json& j, GP& p) {
      const json* u = at_pointer(j, "/upscale");
      if (!u || !u->is_object()) return;
      p.upscale.model = u->value("model", "");
      p.upscale.scale = u->value("scale", 0.0);
      p.upscale.width = u->value("width", 0);
      p.upscale.height = u->value("height", 0);
      p.upscale.fit = u->value("fit", UpscaleUse{}.fit);
      p.upscale.weights_sha256 = u->value("weights_sha256", "");
    },
    [](const GP& p, std::string& key) {
      // A frame made by an upscaler model: a batch's memory estimate counts its tiles.
      if (p.upscale.uses_model()) key += "|upscaler";
    }};

const KeyHooks kDetailerHooks{
    [](const GP& a, const GP& b) { return a.detailer == b.detailer; },
    [](const GP& p, json& j) {
      for (const auto& d : p.detailer)
        j["detailer"].push_back({{"detector", d.detector}, {"prompt", d.prompt}, {"negative", d.negative},
                                 {"confidence", d.confidence}, {"dilate", d.dilate}, {"blur", d.blur},
                                 {"denoise", d.denoise}, {"padding", d.padding}, {"max", d.max},
                                 {"steps", d.steps}, {"weights_sha256", d.weights_sha256}});
    },
    [](const json& j, GP& p) {
      const json* list = at_pointer(j, "/detailer");
      if (!list || !list->is_array()) return;
      for (const auto& d : *list) {
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
        p.detailer.push_back(u);
      }
    },
    nullptr};  // region passes are work items of their own

}  // namespace

namespace {

// Shorthands of the tables below.
using enum KeyType;
using enum KeySplit;
constexpr KeyScope kBoth = KeyScope::kTaskAndDefaults, kTaskOnly = KeyScope::kTask;
constexpr KeyPart kSettings = KeyPart::kSettings, kTask = KeyPart::kTask, kStory = KeyPart::kStory;

// The task itself: read by the task's own code.
std::vector<TaskKey> task_own_keys() {
  return {
      {.name = "id", .type = kString, .scope = kTaskOnly, .part = kTask, .default_text = "(required)",
       .summary = "unique id of the task; names its files"},
      {.name = "seed", .type = kInteger, .scope = kTaskOnly, .part = kTask, .lo = -1, .hi = 9007199254740992.0,
       .default_text = "-1", .a1111 = "Seed", .generate_flag = "--seed",
       .summary = "noise seed of the first image (image i: seed + i); -1 draws one and records it",
       .field = &GP::seed},
      {.name = "count", .type = kInteger, .scope = kTaskOnly, .part = kTask, .lo = 1, .hi = kMaxCount,
       .default_text = "1", .summary = "images of the task"},
      {.name = "priority", .type = kString, .scope = kBoth, .part = kTask, .choices = "high|mid|low|medium|normal",
       .default_text = "mid", .summary = "queue class: high before mid before low (medium and normal are mid)"},
      {.name = "deadline", .type = kString, .scope = kTaskOnly, .part = kTask,
       .summary = "finish by this time (RFC 3339, or a local HH:MM): earliest deadline first within a class"},
      {.name = "timeout", .type = kDuration, .scope = kBoth, .part = kTask, .lo = 0, .hi = 7 * 86400.0,
       .default_text = "run --timeout", .summary = "per image: seconds or a duration (\"90s\", \"5m\")"},
      {.name = "init_image", .type = kPath, .scope = kTaskOnly, .part = kTask, .a1111 = "Init image",
       .manifest = "/init_image", .split = kPresence, .generate_flag = "--init-image",
       .summary = "img2img: a PNG to start from, at the task's size", .field = &GP::init_image},
  };
}

// The image's settings, in the order the parser reads them (task and /defaults alike): first the
// folders and modules it uses.
std::vector<TaskKey> module_keys() {
  return {
      {.name = "vae", .type = kPath, .scope = kBoth, .part = kSettings, .default_text = "the model's", .a1111 = "VAE",
       .manifest = "/vae", .generate_flag = "--vae", .summary = "a VAE folder (export_sdxl.py --vae-only)",
       .field = &GP::vae},
      {.name = "detailer", .type = kArray, .scope = kBoth, .part = kSettings, .default_text = "none",
       .a1111 = "ADetailer model", .manifest = "/detailer", .split = kNo, .generate_flag = "--detailer",
       .summary = "units that redraw what a detector finds (ADetailer)", .hooks = &kDetailerHooks},
      {.name = "upscale", .type = kObject, .scope = kBoth, .part = kSettings, .default_text = "none",
       .a1111 = "Postprocess upscale by", .manifest = "/upscale", .split = kParts, .generate_flag = "--upscale-model",
       .summary = "the frame the PNG is written as: an upscaler folder or Lanczos, by a factor or to a size",
       .hooks = &kUpscaleHooks},
      {.name = "controlnets", .type = kArray, .scope = kBoth, .part = kSettings, .default_text = "none",
       .a1111 = "ControlNet 0", .manifest = "/controlnets", .split = kParts, .generate_flag = "--controlnet",
       .summary = "ControlNet folders with their control images, strengths and windows (a Union ControlNet: "
                  "each image's \"type\", several in one call as \"images\")",
       .hooks = &kControlNetHooks},
      {.name = "ip_adapter", .type = kObject, .scope = kBoth, .part = kSettings, .default_text = "none",
       .a1111 = "IP-Adapter", .manifest = "/ip_adapter", .split = kParts, .generate_flag = "--ip-adapter",
       .summary = "an IP-Adapter folder, its reference images and scale", .hooks = &kIpAdapterHooks},
  };
}

// The image's text and sampling settings, read after the folders (task and /defaults alike).
std::vector<TaskKey> settings_keys() {
  return {
      {.name = "prompt", .type = kString, .scope = kTaskOnly, .part = kSettings, .default_text = "(required)",
       .a1111 = "(the first line)", .manifest = "/prompt", .generate_flag = "--prompt,-p",
       .summary = "the prompt (A1111 syntax: emphasis, BREAK, <lora:NAME:W>, embeddings, wildcards)",
       .field = &GP::prompt, .recorded_always = true},
      {.name = "negative", .type = kString, .scope = kBoth, .part = kSettings, .default_text = "\"\"",
       .a1111 = "Negative prompt", .manifest = "/negative", .generate_flag = "--negative,-n",
       .summary = "negative prompt (empty: SDXL's zero negative conditioning)", .field = &GP::negative_prompt,
       .recorded_always = true},
      {.name = "steps", .type = kInteger, .scope = kBoth, .part = kSettings, .lo = 1, .hi = kMaxSteps,
       .default_text = "the model's (28)", .a1111 = "Steps", .manifest = "/steps", .split = kValue,
       .generate_flag = "--steps", .summary = "sampling steps", .field = &GP::steps, .recorded_always = true},
      {.name = "width", .type = kInteger, .scope = kBoth, .part = kSettings, .lo = 8, .hi = 16384, .multiple_of = 8,
       .default_text = "the model's (1024)", .a1111 = "Size", .manifest = "/width", .split = kValue,
       .generate_flag = "--width", .summary = "width in pixels", .field = &GP::width, .recorded_always = true},
      {.name = "height", .type = kInteger, .scope = kBoth, .part = kSettings, .lo = 8, .hi = 16384, .multiple_of = 8,
       .default_text = "the model's (1024)", .a1111 = "Size", .manifest = "/height", .split = kValue,
       .generate_flag = "--height", .summary = "height in pixels", .field = &GP::height, .recorded_always = true},
      {.name = "cfg", .type = kNumber, .scope = kBoth, .part = kSettings, .lo = 0, .hi = 100,
       .default_text = "the model's (7)", .a1111 = "CFG scale", .manifest = "/cfg", .split = kValue,
       .generate_flag = "--cfg", .summary = "classifier-free guidance scale", .field = &GP::cfg,
       .recorded_always = true},
      {.name = "sampler", .type = kString, .scope = kBoth, .part = kSettings, .default_text = "the model's (Euler)",
       .a1111 = "Sampler", .manifest = "/sampler", .split = kValue, .generate_flag = "--sampler",
       .summary = "A1111 sampler name; a schedule may follow (\"DPM++ 2M Karras\")", .field = &GP::sampler,
       .recorded_always = true},
      {.name = "schedule", .type = kString, .scope = kBoth, .part = kSettings, .default_text = "Automatic",
       .a1111 = "Schedule type", .manifest = "/schedule", .split = kValue, .generate_flag = "--schedule",
       .summary = "A1111 schedule type: Automatic, Karras, Exponential, SGM Uniform", .field = &GP::schedule,
       .recorded_always = true},
      {.name = "guidance_rescale", .type = kNumber, .scope = kBoth, .part = kSettings, .lo = 0, .hi = 1,
       .default_text = "the model's (0)", .a1111 = "Guidance rescale", .manifest = "/guidance_rescale", .split = kValue,
       .generate_flag = "--guidance-rescale", .summary = "diffusers' guidance_rescale (0 = off)",
       .field = &GP::guidance_rescale},
      {.name = "timesteps", .type = kArray, .scope = kBoth, .part = kSettings,
       .default_text = "none (the sampler's spacing of steps)", .a1111 = "Timesteps", .manifest = "/timesteps",
       .split = kParts, .generate_flag = "--timesteps",
       .summary = "the UNet's timesteps, strictly decreasing (diffusers' timesteps=); steps = their count",
       .hooks = &kTimestepsHooks},
      {.name = "eta", .type = kNumber, .scope = kBoth, .part = kSettings, .lo = 0, .hi = 1, .default_text = "0.3",
       .a1111 = "Eta", .manifest = "/eta", .split = kValue, .generate_flag = "--eta",
       .summary = "TCD: its eta (gamma), 0 = deterministic", .field = &GP::eta, .matters = tcd},
      {.name = "clip_skip", .type = kInteger, .scope = kBoth, .part = kSettings, .lo = 1, .hi = kMaxClipSkip,
       .default_text = "not set (SDXL's penultimate layer)", .a1111 = "Clip skip", .manifest = "/clip_skip",
       .generate_flag = "--clip-skip",
       .summary = "counted from the end as A1111 does: 1 or 2 = SDXL's default, N >= 3 = hidden_states[-N]",
       .field = &GP::clip_skip},
      {.name = "strength", .type = kNumber, .scope = kBoth, .part = kSettings, .lo = 0, .hi = 1, .default_text = "0.75",
       .a1111 = "Denoising strength", .manifest = "/strength", .split = kValue, .generate_flag = "--strength",
       .summary = "img2img and inpainting: denoising strength", .field = &GP::strength, .matters = img2img},
      {.name = "mask_blur", .type = kInteger, .scope = kBoth, .part = kSettings, .lo = 0, .hi = kMaxMaskBlur,
       .default_text = "4", .a1111 = "Mask blur", .manifest = "/mask/blur", .generate_flag = "--mask-blur",
       .summary = "inpainting: Gaussian blur radius of the mask (0 = none)", .field = &GP::mask_blur,
       .matters = inpaint},
      {.name = "inpaint_padding", .type = kInteger, .scope = kBoth, .part = kSettings, .lo = 0,
       .hi = kMaxInpaintPadding, .default_text = "32", .a1111 = "Masked area padding", .manifest = "/mask/padding",
       .generate_flag = "--inpaint-padding", .summary = "inpainting, \"inpaint_area\": \"masked\": padding in pixels",
       .field = &GP::inpaint_padding, .matters = inpaint_masked},
      {.name = "inpaint_area", .type = kString, .scope = kBoth, .part = kSettings, .choices = "whole|masked",
       .default_text = "whole", .a1111 = "Inpaint area", .manifest = "/mask/area", .generate_flag = "--inpaint-area",
       .summary = "inpainting: the whole image, or only the padded box around the mask, pasted back",
       .field = &GP::inpaint_area, .matters = inpaint},
      {.name = "mask", .type = kPath, .scope = kBoth, .part = kSettings, .default_text = "none",
       .manifest = "/mask/file", .split = kPresence, .generate_flag = "--mask",
       .summary = "inpainting: a PNG beside the init image, white = repaint, black = keep", .hooks = &kMaskHooks},
      {.name = "hires", .type = kObject, .scope = kBoth, .part = kSettings, .default_text = "off",
       .a1111 = "Hires upscale", .manifest = "/hires", .split = kParts, .generate_flag = "--hires-scale",
       .summary = "A1111's hires fix: {\"scale\", \"upscaler\", \"steps\", \"denoise\"}", .hooks = &kHiresHooks},
      {.name = "loras", .type = kArray, .scope = kBoth, .part = kSettings, .default_text = "none",
       .a1111 = "Lora hashes", .manifest = "/loras", .split = kParts, .generate_flag = "--lora",
       .summary = "LoRAs by name (the top-level \"loras\") or path, with weights", .hooks = &kLoraHooks},
      {.name = "regions", .type = kArray, .scope = kBoth, .part = kSettings, .default_text = "none",
       .a1111 = "RP Active", .manifest = "/regions", .split = kParts, .generate_flag = "--region",
       .summary = "parts of the panel with their own prompt, weight and character (attention couple)",
       .hooks = &kRegionHooks},
      {.name = "region_base", .type = kNumber, .scope = kBoth, .part = kSettings, .lo = 0, .hi = 1,
       .default_text = "0.2", .a1111 = "RP Base Ratios", .manifest = "/region_base", .generate_flag = "--region-base",
       .summary = "regions: the weight of the task's own prompt inside a region", .field = &GP::region_base,
       .matters = has_regions},
      {.name = "notes", .type = kString, .scope = kBoth, .part = kSettings, .manifest = "/notes",
       .summary = "free text carried into the manifest (changes no pixel: a new note remakes nothing)",
       .field = &GP::notes, .compared = false},
  };
}

// The story tools.
std::vector<TaskKey> story_keys() {
  return {
      {.name = "characters", .type = kArray, .scope = kBoth, .part = kStory, .default_text = "none",
       .summary = "names of the top-level \"characters\" whose prompts, negatives and LoRAs join the task's"},
      {.name = "style", .type = kString, .scope = kBoth, .part = kStory, .default_text = "none",
       .summary = "a name of the top-level \"styles\" whose text wraps the prompt"},
      {.name = "expand", .type = kString, .scope = kBoth, .part = kStory, .choices = "random|all",
       .default_text = "random", .summary = "wildcards: drawn from each image's seed, or one image per combination"},
      {.name = "max_images", .type = kInteger, .scope = kBoth, .part = kStory, .lo = 1, .hi = 10000,
       .default_text = "1000", .summary = "\"expand\": \"all\": the most images a task may make"},
  };
}

}  // namespace

const std::vector<TaskKey>& task_keys() {
  static const std::vector<TaskKey> keys = [] {
    std::vector<TaskKey> all = task_own_keys();
    for (auto part : {module_keys(), settings_keys(), story_keys()}) all.insert(all.end(), part.begin(), part.end());
    return all;
  }();
  return keys;
}

const TaskKey* find_task_key(std::string_view name) {
  for (const TaskKey& k : task_keys())
    if (k.name == name) return &k;
  return nullptr;
}

std::vector<std::string> task_key_names(bool defaults) {
  std::vector<std::string> out;
  for (const TaskKey& k : task_keys())
    if (!defaults || k.in_defaults()) out.emplace_back(k.name);
  return out;
}

namespace {

bool key_matters(const TaskKey& k, const GP& p) { return !k.matters || k.matters(p); }

// Whether a and b hold the same value of the plain key k (numbers within 1e-9: they round-trip
// through the manifest's JSON).
bool same_value(const TaskKey& k, const GP& a, const GP& b) {
  return std::visit(
      [&](auto member) -> bool {
        using M = decltype(member);
        if constexpr (std::is_same_v<M, std::monostate>) {
          return true;
        } else if constexpr (std::is_same_v<M, double GP::*>) {
          return a.*member == b.*member || std::abs(a.*member - b.*member) < 1e-9;
        } else {
          return a.*member == b.*member;
        }
      },
      k.field);
}

// The plain key's value as JSON, and whether it is its default.
json value_json(const TaskKey& k, const GP& p, bool& is_default) {
  static const GP defaults{};
  return std::visit(
      [&](auto member) -> json {
        if constexpr (std::is_same_v<decltype(member), std::monostate>) {
          is_default = true;
          return nullptr;
        } else {
          is_default = p.*member == defaults.*member;
          return p.*member;
        }
      },
      k.field);
}

std::string value_text(const TaskKey& k, const GP& p) {
  return std::visit(
      [&](auto member) -> std::string {
        using M = decltype(member);
        if constexpr (std::is_same_v<M, std::monostate>) return "";
        else if constexpr (std::is_same_v<M, std::string GP::*>) return p.*member;
        else if constexpr (std::is_same_v<M, double GP::*>) return num(p.*member);
        else return std::to_string(p.*member);
      },
      k.field);
}

void read_value(const TaskKey& k, const json& v, GP& p) {
  std::visit(
      [&](auto member) {
        using M = decltype(member);
        if constexpr (!std::is_same_v<M, std::monostate>) p.*member = v.get<std::remove_reference_t<decltype(p.*member)>>();
      },
      k.field);
}

}  // namespace

bool same_settings(const GP& a, const GP& b) {
  for (const TaskKey& k : task_keys()) {
    if (!k.compared) continue;
    if (k.hooks) {
      if (!k.hooks->same(a, b)) return false;
    } else if (k.plain() && key_matters(k, a) && !same_value(k, a, b)) {
      return false;
    }
  }
  return true;
}

std::string batch_group_key(const GP& p) {
  std::string key;
  for (const TaskKey& k : task_keys()) {
    if (k.split == KeySplit::kNo) continue;
    if (k.hooks) {
      if (k.hooks->group) k.hooks->group(p, key);
    } else if (k.plain() && key_matters(k, p)) {
      bool is_default = false;
      value_json(k, p, is_default);
      if (k.split == KeySplit::kValue) key += "|" + std::string(k.name) + "=" + value_text(k, p);
      else if (!is_default) key += "|" + std::string(k.name);
    }
  }
  return key;
}

std::string lora_set_key(const GP& p) {
  std::string key;
  for (const auto& l : p.loras) key += l.path.string() + ":" + num(l.weight) + ";";
  for (const auto& t : extract_lora_tags(p.prompt).tags) key += "<" + t.name + ":" + num(t.weight) + ">;";
  return key;
}

json params_to_manifest(const GP& p) {
  json j = json::object();
  for (const TaskKey& k : task_keys()) {
    if (k.manifest.empty()) continue;
    if (k.hooks) {
      k.hooks->record(p, j);
      continue;
    }
    bool is_default = false;
    json v = value_json(k, p, is_default);
    const bool write = k.recorded_always || (k.matters ? k.matters(p) : !is_default);
    if (write) j[json::json_pointer(std::string(k.manifest))] = std::move(v);
  }
  return j;
}

void params_from_manifest(const json& params, GP& p) {
  for (const TaskKey& k : task_keys()) {
    if (k.manifest.empty()) continue;
    if (k.hooks) {
      k.hooks->restore(params, p);
    } else if (const json* v = at_pointer(params, k.manifest)) {
      read_value(k, *v, p);
    }
  }
}

std::string_view key_type_name(KeyType t) {
  switch (t) {
    case KeyType::kString: return "string";
    case KeyType::kPath: return "path";
    case KeyType::kInteger: return "integer";
    case KeyType::kNumber: return "number";
    case KeyType::kObject: return "object";
    case KeyType::kArray: return "array";
    case KeyType::kDuration: return "duration";
  }
  return "";
}

std::string key_range_text(const TaskKey& k) {
  if (!k.choices.empty()) {
    std::string s(k.choices);
    for (size_t pos = 0; (pos = s.find('|', pos)) != std::string::npos; pos += 3) s.replace(pos, 1, " | ");
    return s;
  }
  if (k.type != KeyType::kInteger && k.type != KeyType::kNumber && k.type != KeyType::kDuration) return "";
  const auto text = [](double v) {
    return v == std::floor(v) && std::abs(v) < 1e17 ? std::to_string(static_cast<long long>(v)) : format_number(v);
  };
  std::string s = text(k.lo) + ".." + text(k.hi);
  if (k.multiple_of > 0) s += ", a multiple of " + std::to_string(k.multiple_of);
  return s;
}

}  // namespace sdxl
