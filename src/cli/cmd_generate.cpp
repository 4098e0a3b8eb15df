// `sdxl-batch generate`: one prompt -> one PNG. A client of the public API
// alone: the flags become an ImageRequest for Session::generate.
#include <sdxl_batch/sdxl_batch.h>
#include <spdlog/spdlog.h>

#include <cctype>
#include <map>
#include <set>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "cli/model_flags.h"

namespace sdxl::cli {

struct GenerateArgs {
  ModelFlags model;
  std::string prompt, negative, out, save_latents, timings_json;
  std::string sampler = "Euler", schedule = "Automatic";
  double guidance_rescale = -1;  // -1: the model's default
  std::vector<int> timesteps;
  double eta = 0.3;
  int clip_skip = 0;
  std::string init_image;
  double strength = 0.75;
  std::string mask;
  int mask_blur = 4;
  std::string inpaint_area = "whole";
  int inpaint_padding = 32;
  double hires_scale = 0.0, hires_denoise = 0.7;
  int hires_steps = 0;
  std::string hires_upscaler = "Latent";
  UpscaleFlags frame;
  std::vector<std::string> loras;
  std::int64_t seed = -1;
  int steps = 0, width = 0, height = 0;
  double cfg = -1;
  // --controlnet and its --control-* flags, grouped by the order they came in (controlnet_flags).
  std::vector<std::string> cn_models, cn_images, cn_types;
  std::vector<double> cn_strengths, cn_starts, cn_ends;
  // --detailer and its --detailer-* flags, grouped by the order they came in (detailer_flags).
  std::vector<std::string> det_dirs, det_prompts, det_negatives;
  std::vector<double> det_confidences, det_denoises;
  std::vector<int> det_dilates, det_blurs, det_paddings, det_maxes, det_steps;
  std::string ip_adapter;
  std::vector<std::string> ip_images;
  double ip_scale = 1.0;
  std::vector<std::string> regions, region_masks;
  double region_base = 0.2;
  CLI::App* cmd = nullptr;
};

namespace {

// --controlnet DIR --control-image FILE [--control-type T] [--control-strength W]
// [--control-start S] [--control-end E], repeatable: each --controlnet starts a
// ControlNet and the --control-* flags after it set its fields. A further
// --control-image after the same --controlnet adds an image to its call (a Union
// ControlNet's several types in one step, diffusers' control_mode list); the
// --control-* flags after it are that image's (Session::generate checks them).
std::vector<sdxl_batch::ControlNet> controlnet_flags(const GenerateArgs& a) {
  std::vector<sdxl_batch::ControlNet> out;
  std::map<std::string, size_t> taken;  // values used so far per flag
  std::vector<std::set<std::string>> seen;  // flags given per ControlNet image
  for (const CLI::Option* o : a.cmd->parse_order()) {
    const std::string flag = o->get_name();
    static const std::set<std::string> kFlags = {"--controlnet", "--control-image", "--control-type",
                                                 "--control-strength", "--control-start", "--control-end"};
    if (!kFlags.count(flag)) continue;
    const size_t i = taken[flag]++;
    if (flag == "--controlnet") {
      out.push_back({a.cn_models.at(i), "", 1.0, 0.0, 1.0});
      seen.emplace_back();
      continue;
    }
    if (out.empty())
      throw sdxl_batch::UsageError(flag + " comes before any --controlnet DIR (it sets the ControlNet before it)");
    if (flag == "--control-image" && seen.back().count(flag)) {  // the next image of the same call
      out.push_back({out.back().model, "", 1.0, 0.0, 1.0, "", true});
      seen.emplace_back();
    }
    if (!seen.back().insert(flag).second)
      throw sdxl_batch::UsageError("ControlNet " + std::to_string(out.size() - 1) + " (" + out.back().model + ") has " +
                                   flag + " twice");
    sdxl_batch::ControlNet& c = out.back();
    if (flag == "--control-image") c.image = a.cn_images.at(i);
    else if (flag == "--control-type") c.type = a.cn_types.at(i);
    else if (flag == "--control-strength") c.strength = a.cn_strengths.at(i);
    else if (flag == "--control-start") c.start = a.cn_starts.at(i);
    else if (flag == "--control-end") c.end = a.cn_ends.at(i);
  }
  return out;
}

// --detailer DIR [--detailer-prompt P] [--detailer-confidence C] ..., repeatable: each --detailer starts
// a unit (ADetailer's defaults) and the --detailer-* flags after it set its fields; the values are
// checked by Session::generate with the batch file's rules (docs/detailer.md).
std::vector<sdxl_batch::Detailer> detailer_flags(const GenerateArgs& a) {
  std::vector<sdxl_batch::Detailer> out;
  std::map<std::string, size_t> taken;      // values used so far per flag
  std::vector<std::set<std::string>> seen;  // flags given per unit
  for (const CLI::Option* o : a.cmd->parse_order()) {
    const std::string flag = o->get_name();
    if (flag != "--detailer" && flag.rfind("--detailer-", 0) != 0) continue;
    const size_t i = taken[flag]++;
    if (flag == "--detailer") {
      out.push_back({});
      out.back().detector = a.det_dirs.at(i);
      seen.emplace_back();
      continue;
    }
    if (out.empty()) throw sdxl_batch::UsageError(flag + " comes before any --detailer DIR (it sets the unit before it)");
    if (!seen.back().insert(flag).second)
      throw sdxl_batch::UsageError("detailer " + std::to_string(out.size() - 1) + " (" + out.back().detector +
                                   ") has " + flag + " twice");
    sdxl_batch::Detailer& d = out.back();
    if (flag == "--detailer-prompt") d.prompt = a.det_prompts.at(i);
    else if (flag == "--detailer-negative") d.negative = a.det_negatives.at(i);
    else if (flag == "--detailer-confidence") d.confidence = a.det_confidences.at(i);
    else if (flag == "--detailer-dilate") d.dilate = a.det_dilates.at(i);
    else if (flag == "--detailer-blur") d.blur = a.det_blurs.at(i);
    else if (flag == "--detailer-denoise") d.denoise = a.det_denoises.at(i);
    else if (flag == "--detailer-padding") d.padding = a.det_paddings.at(i);
    else if (flag == "--detailer-max") d.max = a.det_maxes.at(i);
    else if (flag == "--detailer-steps") d.steps = a.det_steps.at(i);
  }
  return out;
}

void add_detailer_flags(CLI::App& cmd, GenerateArgs& a) {
  // One value per occurrence, so that the flags group by their order (detailer_flags).
  const auto one = [](CLI::Option* o) { o->allow_extra_args(false); };
  one(cmd.add_option("--detailer", a.det_dirs,
                     "Detailer (ADetailer): a detector folder (export_sdxl.py --detector) whose regions are redrawn "
                     "after the decode; repeatable, units in order, each followed by its --detailer-* flags"));
  one(cmd.add_option("--detailer-prompt", a.det_prompts,
                     "Prompt of the --detailer before it (default \"\": the image's; [PROMPT] stands for it)"));
  one(cmd.add_option("--detailer-negative", a.det_negatives,
                     "Negative prompt of the --detailer before it (default \"\": the image's; [PROMPT] stands for it)"));
  one(cmd.add_option("--detailer-confidence", a.det_confidences,
                     "Detections scoring above it, in (0, 1], of the --detailer before it (default 0.3)"));
  one(cmd.add_option("--detailer-dilate", a.det_dilates,
                     "Px of dilation (negative: erosion) of each mask, -128..128, of the --detailer before it (default 4)"));
  one(cmd.add_option("--detailer-blur", a.det_blurs, "Mask blur, 0..64, of the --detailer before it (default 4)"));
  one(cmd.add_option("--detailer-denoise", a.det_denoises,
                     "Denoising strength, in (0, 1], of the --detailer before it (default 0.4)"));
  one(cmd.add_option("--detailer-padding", a.det_paddings,
                     "\"Only masked\" padding, 0..256, of the --detailer before it (default 32)"));
  one(cmd.add_option("--detailer-max", a.det_maxes,
                     "Only the k largest regions (0 = all) of the --detailer before it (default 0)"));
  one(cmd.add_option("--detailer-steps", a.det_steps,
                     "Steps of the regions, 1..200, of the --detailer before it (default: the image's)"));
}

}  // namespace

// The flag of task key `key` as the library's table gives it (sdxl_batch::task_keys): its name, its
// help with the default, and its range or values.
template <typename T>
CLI::Option* key_flag(CLI::App& cmd, const std::string& key, T& value) {
  const sdxl_batch::TaskKeyInfo k = sdxl_batch::task_key(key);
  std::string help = k.summary;
  if (!help.empty()) help[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(help[0])));
  if (!k.default_text.empty() && k.default_text != "(required)") help += " (default: " + k.default_text + ")";
  CLI::Option* o = cmd.add_option(k.generate_flag, value, help);
  if (k.type == "integer") o->check(CLI::Range(k.lo, k.hi));
  else if (k.type == "number") o->check(finite_range(k.lo, k.hi));
  if (!k.choices.empty()) o->check(CLI::IsMember(k.choices));
  return o;
}

CLI::App* add_generate(CLI::App& app, std::shared_ptr<GenerateArgs>& args) {
  args = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "Generate one image from a prompt");
  add_model_options(*cmd, args->model, /*model_required=*/true);
  key_flag(*cmd, "prompt", args->prompt)->required();
  key_flag(*cmd, "negative", args->negative);
  key_flag(*cmd, "seed", args->seed);
  key_flag(*cmd, "steps", args->steps);
  key_flag(*cmd, "cfg", args->cfg);
  key_flag(*cmd, "sampler", args->sampler)->capture_default_str();
  key_flag(*cmd, "schedule", args->schedule)->capture_default_str();
  key_flag(*cmd, "guidance_rescale", args->guidance_rescale);
  key_flag(*cmd, "timesteps", args->timesteps)->delimiter(',');
  key_flag(*cmd, "eta", args->eta);
  key_flag(*cmd, "clip_skip", args->clip_skip);
  key_flag(*cmd, "init_image", args->init_image);
  key_flag(*cmd, "strength", args->strength)->capture_default_str();
  key_flag(*cmd, "mask", args->mask);
  key_flag(*cmd, "mask_blur", args->mask_blur)->capture_default_str();
  key_flag(*cmd, "inpaint_area", args->inpaint_area)->capture_default_str();
  key_flag(*cmd, "inpaint_padding", args->inpaint_padding)->capture_default_str();
  cmd->add_option("--hires-scale", args->hires_scale, "Hires fix: upscale factor of the second pass (0 = off)")
      ->check(finite_range(0.0, 8.0));
  cmd->add_option("--hires-upscaler", args->hires_upscaler,
                  "Hires fix upscaler: Latent, Latent (antialiased), Latent (bicubic), Latent (bicubic antialiased), "
                  "Latent (nearest), Latent (nearest-exact), Nearest, Lanczos (pixel space), or an upscaler folder "
                  "DIR (export_sdxl.py --upscaler: the model's passes, then LANCZOS)")
      ->capture_default_str();
  cmd->add_option("--hires-steps", args->hires_steps, "Hires fix: steps of the second pass (0 = --steps)")
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--hires-denoise", args->hires_denoise, "Hires fix: denoising strength of the second pass")
      ->check(finite_range(0.0, 1.0))
      ->capture_default_str();
  add_upscale_flags(*cmd, args->frame, /*model_required=*/false);
  key_flag(*cmd, "width", args->width);
  key_flag(*cmd, "height", args->height);
  cmd->add_option("--lora", args->loras, "LoRA file with an optional weight, FILE[:WEIGHT] (repeatable; weight 1.0)");
  cmd->add_option("--controlnet", args->cn_models,
                  "ControlNet folder (scripts/export_sdxl.py --controlnet); repeatable, each followed by its "
                  "--control-image and optional --control-strength/--control-start/--control-end");
  cmd->add_option("--control-image", args->cn_images,
                  "The control image (PNG: pose, edges, depth...) of the --controlnet before it; resized to the "
                  "image's size as diffusers does");
  cmd->add_option("--control-type", args->cn_types,
                  "The control type of the --control-image before it, for a Union ControlNet (openpose, depth, canny, "
                  "tile, repaint...: the names its model.json lists); a further --control-image after the same "
                  "--controlnet adds another image and type to the same call");
  cmd->add_option("--control-strength", args->cn_strengths,
                  "Strength of the --controlnet before it (diffusers' controlnet_conditioning_scale; default 1)")
      ->check(finite_range(0.0, 10.0));
  cmd->add_option("--control-start", args->cn_starts,
                  "Fraction of the steps where the --controlnet before it starts acting (default 0)")
      ->check(finite_range(0.0, 1.0));
  cmd->add_option("--control-end", args->cn_ends,
                  "Fraction of the steps where the --controlnet before it stops acting (default 1)")
      ->check(finite_range(0.0, 1.0));
  add_detailer_flags(*cmd, *args);
  cmd->add_option("--ip-adapter", args->ip_adapter,
                  "IP-Adapter folder (scripts/export_sdxl.py --ip-adapter): steer the image toward --ip-image")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--ip-image", args->ip_images,
                  "Reference image (PNG) of the --ip-adapter; repeatable (their tokens join, in order)");
  cmd->add_option("--ip-scale", args->ip_scale, "Scale of the --ip-adapter (diffusers' set_ip_adapter_scale)")
      ->check(finite_range(0.0, 10.0))
      ->capture_default_str();
  key_flag(*cmd, "regions", args->regions)->description(
      "A region \"x0,y0,x1,y1:PROMPT\" (a box in fractions of the panel) with its own prompt; repeatable");
  cmd->add_option("--region-mask", args->region_masks,
                  "A region \"FILE:PROMPT\" (a mask PNG, white = inside, the panel's shape); repeatable");
  key_flag(*cmd, "region_base", args->region_base);
  cmd->add_option("--out,-o", args->out, "Output PNG (default: sdxl-<seed>.png)");
  cmd->add_option("--save-latents", args->save_latents, "Also write the final latents as float32 .npy (parity checks)");
  cmd->add_option("--timings-json", args->timings_json, "Write stage timings and peak memory as JSON to this file");
  args->cmd = cmd;
  return cmd;
}

int run_generate(const GenerateArgs& a) {
  sdxl_batch::Session session(a.model.resolved());
  sdxl_batch::ImageRequest r;
  sdxl_batch::Task& t = r.task;
  t.prompt = a.prompt;
  t.negative = a.negative;
  t.seed = a.seed;
  if (a.steps > 0) t.steps = a.steps;
  if (a.cfg >= 0) t.cfg = a.cfg;
  if (a.width > 0) t.width = a.width;
  if (a.height > 0) t.height = a.height;
  t.sampler = a.sampler;
  t.schedule = a.schedule;
  for (const std::string& l : a.loras) t.loras.push_back(sdxl_batch::parse_lora(l));
  if (a.guidance_rescale >= 0) r.guidance_rescale = a.guidance_rescale;
  r.timesteps = a.timesteps;
  r.eta = a.eta;
  r.clip_skip = a.clip_skip;
  r.init_image = a.init_image;
  r.strength = a.strength;
  r.mask = a.mask;
  r.mask_blur = a.mask_blur;
  r.inpaint_area = a.inpaint_area;
  r.inpaint_padding = a.inpaint_padding;
  if (a.hires_scale > 0) r.hires = {a.hires_scale, a.hires_upscaler, a.hires_steps, a.hires_denoise};
  r.controlnets = controlnet_flags(a);
  r.ip_adapter = {a.ip_adapter, a.ip_images, a.ip_scale};
  for (const std::string& g : a.regions) r.regions.push_back(sdxl_batch::parse_region(g));
  for (const std::string& g : a.region_masks) r.regions.push_back(sdxl_batch::parse_region_mask(g));
  r.region_base = a.region_base;
  r.detailer = detailer_flags(a);
  r.upscale = upscale_of_flags(a.frame);
  r.out_path = a.out;
  r.latents_path = a.save_latents;
  r.timings_path = a.timings_json;
  const sdxl_batch::ImageResult img = session.generate(r);
  spdlog::info("wrote {} ({}x{}, seed {}, {} steps) in {:.2f} s: text {:.3f} s, sample {:.3f} s, decode {:.3f} s, write {:.3f} s; peak memory {}",
               img.path, img.width, img.height, img.seed, img.steps, img.total_s, img.text_s, img.sample_s,
               img.decode_s, img.write_s, format_bytes(img.peak_bytes));
  return 0;
}

}  // namespace sdxl::cli
