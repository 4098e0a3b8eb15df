// Session::generate: one image outside a run (`sdxl-batch generate`), checked
// before the weights load, made by the pipeline's Generator on this thread.
#include <sdxl_batch/sdxl_batch.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "api/boundary.h"
#include "api/options.h"
#include "api/session_impl.h"
#include "batch/batch_file.h"
#include "batch/lora_ref.h"
#include "batch/regions.h"
#include "check/batch_check.h"
#include "check/model_files.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/input_text.h"
#include "core/npy.h"
#include "core/sha256.h"
#include "core/units.h"
#include "image/png_reader.h"
#include "image/png_writer.h"
#include "model/model_config.h"
#include "scheduler/detailer_flow.h"
#include "scheduler/image_finish.h"
#include "scheduler/generator_lane.h"

namespace sdxl::api {
namespace {

using Clock = std::chrono::steady_clock;

// A PNG a flag names, or UsageError "FLAG 'FILE' why".
void check_png(const std::string& flag, const std::string& file, int& w, int& h) {
  if (const std::string why = png_size(file, w, h); !why.empty()) throw UsageError(flag + " '" + file + "' " + why);
}

// A folder or file a flag names, absolute and normal; UsageError "FLAG must not be empty" for "".
std::string flag_path(const std::string& flag, const std::string& path) {
  if (path.empty()) throw UsageError(flag + " must not be empty (a file or folder)");
  return absolute_normal(path).string();
}

std::vector<ControlNetUse> controlnets_of(const sdxl_batch::ImageRequest& r, const ModelConfig& config) {
  std::vector<ControlNetUse> out;
  for (const sdxl_batch::ControlNet& c : r.controlnets) {
    out.push_back({flag_path("--controlnet", c.model), c.image, c.strength, c.start, c.end, c.type, c.same_call});
    const size_t k = out.size() - 1;
    if (c.image.empty())
      throw UsageError("ControlNet " + std::to_string(k) + " (" + out[k].model + ") has no --control-image FILE after it");
    if (c.start >= c.end)
      throw UsageError("ControlNet " + std::to_string(k) + ": --control-start must be below --control-end");
    if (c.same_call && (k == 0 || out[k - 1].model != out[k].model))
      throw UsageError("ControlNet " + std::to_string(k) + ": an image of the same call follows no image of " +
                       out[k].model);
    int w = 0, h = 0;
    check_png("--control-image", c.image, w, h);
  }
  for (size_t k = 0; k < out.size(); ++k) {  // ModelError naming the folder, before the model loads
    const ControlNetConfig cn = load_controlnet_config(out[k].model);
    check_controlnet_fits(cn, config);
    if (const std::string why = control_type_problem(cn, out[k].type); !why.empty())
      throw UsageError("ControlNet " + std::to_string(k) + ": --control-type " + why);
    if (out[k].same_call && !cn.is_union())
      throw UsageError("ControlNet " + std::to_string(k) + " (" + out[k].model +
                       ") has several --control-image: only a Union ControlNet takes several images in one call");
  }
  return out;
}

// The IP-Adapter folder fits the model (ModelError), each image is a PNG (UsageError).
IpAdapterUse ip_adapter_of(const sdxl_batch::IpAdapter& a, const ModelConfig& config) {
  IpAdapterUse ip;
  if (a.model.empty()) {
    if (!a.images.empty()) throw UsageError("--ip-image needs --ip-adapter DIR (the adapter it steers through)");
    return ip;
  }
  if (a.images.empty()) throw UsageError("--ip-adapter needs at least one --ip-image FILE (a reference PNG)");
  ip.model = flag_path("--ip-adapter", a.model);
  check_ip_adapter_fits(load_ip_adapter_config(ip.model), config);
  for (const std::string& f : a.images) {
    int w = 0, h = 0;
    check_png("--ip-image", f, w, h);
    ip.images.push_back(flag_path("--ip-image", f));
  }
  ip.scale = a.scale;
  return ip;
}

// The request's final upscale: an upscaler folder (checked as a batch file's) or "Lanczos"; its factor
// and frame are checked once the image's size is known (check_upscale).
UpscaleUse upscale_of(const sdxl_batch::Upscale& u) {
  UpscaleUse out;
  if (u.model.empty()) {
    if (u.scale != 0 || u.width != 0 || u.height != 0)
      throw UsageError("--upscale / --upscale-size need --upscale-model DIR|Lanczos");
    return out;
  }
  out.scale = u.scale;
  out.width = u.width;
  out.height = u.height;
  out.fit = u.fit;
  if (canonical_upscale_model(u.model) == UpscaleUse::kLanczosUpscaler) {
    out.model = UpscaleUse::kLanczosUpscaler;
    return out;
  }
  out.model = flag_path("--upscale-model", u.model);
  FileInputChecks files;
  if (const std::string why = files.folder_problem("upscaler", out.model); !why.empty())
    throw UsageError("--upscale-model: " + why);
  out.weights_sha256 = files.folder_weights_sha256("upscaler", out.model);
  return out;
}

// --hires-upscaler: one of A1111's names (any case), else an upscaler folder (checked as a batch file's).
void hires_upscaler_of(const std::string& upscaler, GenerationParams::Hires& h) {
  if (std::string name = hires_upscaler_name_of(upscaler); !name.empty()) {
    h.upscaler = name;
    return;
  }
  h.upscaler = flag_path("--hires-upscaler", upscaler);
  FileInputChecks files;
  if (const std::string why = files.folder_problem("upscaler", h.upscaler); !why.empty())
    throw UsageError("--hires-upscaler '" + upscaler + "': not a hires upscaler name (" +
                     hires_upscaler_name_list() + ") nor an upscaler folder: " + why);
  h.weights_sha256 = files.folder_weights_sha256("upscaler", h.upscaler);
}

// Every denoising pass (img2img, the hires fix's second pass, each detailer unit's regions) takes
// at least one sampler step (the image's steps now known), before the model loads, as a batch
// file's check does.
void check_step_counts(const GenerationParams& p) {
  if (!p.init_image.empty())
    if (const std::string why = strength_steps_problem(p.steps, p.strength); !why.empty())
      throw UsageError("--strength " + why);
  if (p.hires_on())
    if (const std::string why = strength_steps_problem(p.hires_steps(), p.hires.denoise); !why.empty())
      throw UsageError("--hires-denoise " + why);
  for (size_t k = 0; k < p.detailer.size(); ++k) {
    const DetailerUse& u = p.detailer[k];
    if (const std::string why = strength_steps_problem(u.steps > 0 ? u.steps : p.steps, u.denoise); !why.empty())
      throw UsageError("--detailer-denoise of detailer " + std::to_string(k) + " (" + u.detector + ") " + why);
  }
}

void check_upscale(const GenerationParams& p) {
  if (!p.upscale.on()) return;
  const auto [w, h] = decoded_size(p);
  std::string key;
  const std::string why = upscale_problem(p.upscale, w, h, key);
  const std::string flag = key == "scale" ? "--upscale" : key == "fit" ? "--upscale-fit" : "--upscale-size";
  if (!why.empty()) throw UsageError(flag + " " + why);
}

// A detailer problem of read_detailer_list ("/detailer/K/KEY") with the flag that set the value.
std::string detailer_flag_problem(const BatchProblem& pr, const std::vector<sdxl_batch::Detailer>& units) {
  const std::string prefix = "/detailer/";
  size_t k = 0;
  std::string key;
  if (pr.pointer.rfind(prefix, 0) == 0) {
    const std::string rest = pr.pointer.substr(prefix.size());
    const size_t slash = rest.find('/');
    k = static_cast<size_t>(std::strtoul(rest.substr(0, slash).c_str(), nullptr, 10));
    if (slash != std::string::npos) key = rest.substr(slash + 1);
  }
  const std::string flag = key.empty() || key == "detector" ? "--detailer" : "--detailer-" + key;
  const std::string dir = k < units.size() ? units[k].detector : "";
  return flag + " of detailer " + std::to_string(k) + " (" + dir + "): " + pr.message;
}

// The detailer units (--detailer and its flags) checked by the batch file's own rules and messages
// (read_detailer_list), relative folders from the current one; UsageError naming each bad flag.
std::vector<DetailerUse> detailer_of(const std::vector<sdxl_batch::Detailer>& units) {
  nlohmann::json list = nlohmann::json::array();
  for (const sdxl_batch::Detailer& d : units) {
    nlohmann::json u = {{"detector", d.detector}, {"prompt", d.prompt},   {"negative", d.negative},
                        {"confidence", d.confidence}, {"dilate", d.dilate}, {"blur", d.blur},
                        {"denoise", d.denoise},   {"padding", d.padding}, {"max", d.max}};
    if (d.steps) u["steps"] = *d.steps;
    list.push_back(std::move(u));
  }
  FileInputChecks files;
  std::vector<BatchProblem> problems;
  std::error_code ec;
  const std::filesystem::path cwd = std::filesystem::current_path(ec);
  std::vector<DetailerUse> out = read_detailer_list(list, cwd, &files, problems);
  if (problems.empty()) return out;
  std::string msg;
  for (const BatchProblem& pr : problems) msg += (msg.empty() ? "" : "; ") + detailer_flag_problem(pr, units);
  throw UsageError(msg);
}

// The request's regions, checked as a batch file's are (the mask's aspect against the image's size
// comes later, when the model's defaults have filled it in).
std::vector<RegionUse> regions_of(const sdxl_batch::ImageRequest& r) {
  std::vector<RegionUse> out;
  if (r.regions.size() > static_cast<size_t>(kMaxRegions))
    throw UsageError(std::to_string(r.regions.size()) + " regions: a panel may have at most " +
                     std::to_string(kMaxRegions));
  if (!(r.region_base >= 0 && r.region_base <= 1))
    throw UsageError("--region-base " + format_number(r.region_base) + " must be from 0 to 1");
  FileInputChecks files;
  for (size_t k = 0; k < r.regions.size(); ++k) {
    const sdxl_batch::Region& g = r.regions[k];
    const std::string name = "region " + std::to_string(k + 1);
    RegionUse u;
    if (g.mask.empty() == g.box.empty())
      throw UsageError(name + " needs a box (--region) or a mask (--region-mask), not both");
    if (!g.box.empty()) {
      if (g.box.size() != 4) throw UsageError(name + "'s box must have 4 values (x0, y0, x1, y1)");
      u.x0 = g.box[0], u.y0 = g.box[1], u.x1 = g.box[2], u.y1 = g.box[3];
      if (const std::string why = region_box_problem(u.x0, u.y0, u.x1, u.y1); !why.empty())
        throw UsageError(name + "'s box " + why);
    } else {
      if (const std::string why = files.region_mask_problem(g.mask); !why.empty())
        throw UsageError("--region-mask '" + g.mask + "' " + why);
      u.mask = flag_path("--region-mask", g.mask);
      u.mask_sha256 = sha256_file_hex(u.mask).value_or("");
    }
    if (const std::string why = text_problem(g.prompt, TextKind::kMultiline); !why.empty())
      throw UsageError(name + "'s prompt " + why);
    if (!extract_lora_tags(g.prompt).tags.empty())
      throw UsageError(name + "'s prompt has a <lora:...> tag: a LoRA changes the whole panel (put it in --prompt)");
    u.prompt = g.prompt;
    u.negative = g.negative;
    if (!(g.weight > 0) || !std::isfinite(g.weight)) throw UsageError(name + "'s weight must be a positive number");
    u.weight = g.weight;
    out.push_back(u);
  }
  return out;
}

// Everything of the request checked that can be before the model loads; the
// sizes the model's defaults fill in come later. `image_w/h`: the init image's.
GenerationParams checked_params(const sdxl_batch::Session::Impl& s, const sdxl_batch::ImageRequest& r,
                                const RuntimeOptions& runtime, int& image_w, int& image_h) {
  const sdxl_batch::Task& t = r.task;
  GenerationParams p;
  for (const sdxl_batch::Lora& l : t.loras) p.loras.push_back({std::filesystem::path(l.path).stem().string(), l.path, l.weight});
  // The text rule of core/input_text.h, as for batch files: prompts may span lines.
  if (const std::string why = text_problem(t.prompt, TextKind::kMultiline); !why.empty())
    throw UsageError("--prompt " + why);
  if (const std::string why = text_problem(t.negative, TextKind::kMultiline); !why.empty())
    throw UsageError("--negative " + why);
  // A prompt tag naming an unknown LoRA, or one of the --lora files at another weight, fails fast.
  (void)merge_lora_tags(p.loras, extract_lora_tags(t.prompt).tags, {}, runtime.lora_dirs);
  p.sampler = t.sampler;
  p.schedule = t.schedule;
  p.guidance_rescale = r.guidance_rescale.value_or(s.config.defaults.guidance_rescale);
  p.clip_skip = r.clip_skip;
  canonicalize_sampler(p);  // UsageError listing the valid names
  p.eta = r.eta;
  if (!r.timesteps.empty()) {
    p.timesteps = r.timesteps;
    std::string why = timestep_list_problem(p.timesteps, s.config.scheduler.num_train_timesteps);
    if (why.empty()) why = FileInputChecks().timesteps_problem(p);
    if (!why.empty()) throw UsageError("--timesteps " + why);
    if (r.task.steps && *r.task.steps != static_cast<int>(p.timesteps.size()))
      throw UsageError("--steps " + std::to_string(*r.task.steps) + " but --timesteps holds " +
                       std::to_string(p.timesteps.size()) + " (the step count follows from the list): give one of them");
  }
  if (!r.init_image.empty()) {
    check_png("--init-image", r.init_image, image_w, image_h);
    p.init_image = r.init_image;
    p.strength = r.strength;
  }
  int mw = 0, mh = 0;
  if (!r.mask.empty()) {
    check_png("--mask", r.mask, mw, mh);
    FileInputChecks files;
    if (const std::string why = files.mask_problem(r.mask); !why.empty())
      throw UsageError("--mask '" + r.mask + "' " + why);
    if (r.inpaint_area != "whole" && r.inpaint_area != "masked")
      throw UsageError("--inpaint-area '" + r.inpaint_area + "' is not an inpaint area (whole or masked)");
    p.mask = flag_path("--mask", r.mask);
    p.mask_sha256 = sha256_file_hex(p.mask).value_or("");
    p.mask_blur = r.mask_blur;
    p.inpaint_area = r.inpaint_area;
    p.inpaint_padding = r.inpaint_padding;
  }
  if (r.hires.scale > 0) {
    p.hires.scale = r.hires.scale;
    hires_upscaler_of(r.hires.upscaler, p.hires);
    p.hires.steps = r.hires.steps;
    p.hires.denoise = r.hires.denoise;
  }
  if (p.inpaint()) {  // the init image's size is the task's
    GenerationParams sized = p;
    sized.width = image_w;
    sized.height = image_h;
    if (const std::string why = mask_settings_problem(sized, mw, mh); !why.empty())
      throw UsageError("--mask '" + r.mask + "' " + why);
  }
  const ModelConfig& config = s.config;
  if (config.inpainting_unet() && !p.inpaint())
    throw UsageError("no --init-image and --mask: " + unmasked_task_on_inpainting_unet(config));
  if (p.clip_skip != 0) check_clip_skip(config, p.clip_skip);
  if (!s.options.vae_dir.empty()) {  // ModelError naming the folder
    p.vae = flag_path("--vae", s.options.vae_dir);
    check_vae_fits(load_vae_config(p.vae), config);
  }
  p.controlnets = controlnets_of(r, config);
  p.ip_adapter = ip_adapter_of(r.ip_adapter, config);
  p.regions = regions_of(r);
  p.region_base = r.region_base;
  if (const std::string why = regions_problem(config, p); !why.empty()) throw UsageError("--region: " + why);
  p.upscale = upscale_of(r.upscale);
  p.detailer = detailer_of(r.detailer);
  if (s.options.verify) verify_task_folders({&p});
  return p;
}

void write_timings(const std::string& path, Generator& gen, const GenerationParams& p, const GeneratedImage& img,
                   double write_s, double total_s) {
  const ModelConfig& mc = gen.model();
  nlohmann::json j = {{"device", gen.device_name()}, {"model", mc.name}, {"width", p.width}, {"height", p.height},
                      {"steps", p.steps}, {"load_s", gen.load_seconds()}, {"text_s", img.seconds.text},
                      {"sample_s", img.seconds.sample}, {"decode_s", img.seconds.decode}, {"write_s", write_s},
                      {"total_s", total_s}, {"peak_bytes", gen.peak_memory_bytes()}};
  if (!p.loras.empty() || !img.lora_hashes.empty()) {
    const LoraStats st = gen.lora_stats();
    j["lora"] = {{"switch_s", img.lora_s}, {"load_s", st.load_s}, {"merge_s", st.merge_s}, {"hits", st.hits},
                 {"misses", st.misses}, {"evictions", st.evictions}, {"bytes_held", st.bytes_held},
                 {"budget_bytes", st.budget_bytes}};
  }
  write_file_atomic(path, j.dump(2) + "\n");
}

}  // namespace

sdxl_batch::ImageResult generate_image(sdxl_batch::Session::Impl& s, const sdxl_batch::ImageRequest& r) {
  const RuntimeOptions runtime = runtime_options(s.options);
  int image_w = 0, image_h = 0;
  GenerationParams p = checked_params(s, r, runtime, image_w, image_h);
  // The model's defaults (model.json, read by the session) fill in, and what depends on them is
  // checked, before the weights load.
  const auto& defaults = s.config.defaults;
  const sdxl_batch::Task& t = r.task;
  p.prompt = t.prompt;
  p.negative_prompt = t.negative;
  p.seed = t.seed < 0 ? random_seed() : t.seed;
  p.steps = p.timesteps.empty() ? t.steps.value_or(defaults.steps) : static_cast<int>(p.timesteps.size());
  p.cfg = t.cfg.value_or(defaults.cfg);
  p.width = t.width.value_or(image_w > 0 ? image_w : defaults.width);
  p.height = t.height.value_or(image_h > 0 ? image_h : defaults.height);
  check_generation_size(s.config, p.width, p.height, 1);
  if (image_w > 0)
    if (const std::string why = init_size_problem(image_w, image_h, p.width, p.height); !why.empty())
      throw UsageError("--init-image '" + r.init_image + "' " + why);
  check_upscale(p);
  check_step_counts(p);
  for (const RegionUse& g : p.regions) {
    int mw = 0, mh = 0;
    if (g.mask.empty() || !png_size(g.mask, mw, mh).empty()) continue;
    if (const std::string why = region_mask_aspect_problem(mw, mh, p.width, p.height); !why.empty())
      throw UsageError("--region-mask '" + g.mask + "' " + why);
  }
  GeneratorLane lane(s.options.model_dir, runtime, {}, 0);  // a lane, so the detailer takes a run's steps
  lane.start();
  Generator& gen = lane.generator();
  const ModelConfig& mc = gen.model();
  const std::string out = r.out_path.empty() ? "sdxl-" + std::to_string(p.seed) + ".png" : r.out_path;

  const auto t0 = Clock::now();
  GeneratedImage img = gen.generate(p);
  // The regions' passes and then the frame, as a run makes them (stage times and latents: the image's own).
  if (!p.detailer.empty()) img = detail_image(lane, p, std::move(img));
  else finish_image(lane, p, img);
  const auto t1 = Clock::now();
  ImageSources sources = model_sources(mc);
  add_image_sources(sources, p, img);
  write_png(out, img.width, img.height, 3, img.rgb.data(), {{"parameters", a1111_parameters(p, sources)}});
  const double write_s = std::chrono::duration<double>(Clock::now() - t1).count();
  const double total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!r.latents_path.empty()) write_npy_f32(r.latents_path, img.latent_shape, img.latents);
  if (!r.timings_path.empty()) write_timings(r.timings_path, gen, p, img, write_s, total_s);
  return {out,     p.seed,          img.width,       img.height, p.steps,
          img.seconds.text, img.seconds.sample, img.seconds.decode, write_s, total_s, gen.peak_memory_bytes()};
}

}  // namespace sdxl::api

namespace sdxl_batch {

ImageResult Session::generate(const ImageRequest& request) {
  return sdxl::api::guarded([&] { return sdxl::api::generate_image(*impl_, request); });
}

namespace {

Region region_of(const sdxl::RegionUse& u) {
  Region r;
  if (u.mask.empty()) r.box = {u.x0, u.y0, u.x1, u.y1};
  r.mask = u.mask;
  r.prompt = u.prompt;
  return r;
}

}  // namespace

Region parse_region(const std::string& text) {
  return sdxl::api::guarded([&] { return region_of(sdxl::parse_region_flag(text)); });
}

Region parse_region_mask(const std::string& text) {
  return sdxl::api::guarded([&] { return region_of(sdxl::parse_region_mask_flag(text)); });
}

Lora parse_lora(const std::string& text) {
  return sdxl::api::guarded([&] {
    const sdxl::LoraRef r = sdxl::parse_lora_arg(text);
    return Lora{r.path.string(), r.weight};
  });
}

}  // namespace sdxl_batch
