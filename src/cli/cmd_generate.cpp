// `sdxl-batch generate`: one prompt -> one PNG.
#include <spdlog/spdlog.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "api/options.h"
#include "check/model_files.h"
#include "cli/cli_common.h"
#include "cli/model_flags.h"
#include "cli/commands.h"
#include "check/batch_check.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/input_text.h"
#include "core/npy.h"
#include "image/png_reader.h"
#include "image/png_writer.h"
#include "batch/lora_ref.h"

namespace sdxl::cli {

struct GenerateArgs {
  ModelFlags model;
  std::string prompt, negative, out, save_latents, timings_json;
  std::string sampler = "Euler", schedule = "Automatic";
  double guidance_rescale = 0.0;
  int clip_skip = 0;
  std::string init_image;
  double strength = 0.75;
  double hires_scale = 0.0, hires_denoise = 0.7;
  int hires_steps = 0;
  std::string hires_upscaler = "Latent";
  std::vector<std::string> loras;
  std::int64_t seed = -1;
  int steps = 0, width = 0, height = 0;
  double cfg = -1;
  // --controlnet and its --control-* flags, grouped by the order they came in (controlnet_flags).
  std::vector<std::string> cn_models, cn_images;
  std::vector<double> cn_strengths, cn_starts, cn_ends;
  std::string ip_adapter;
  std::vector<std::string> ip_images;
  double ip_scale = 1.0;
  CLI::App* cmd = nullptr;
};

namespace {

// --controlnet DIR --control-image FILE [--control-strength W] [--control-start S]
// [--control-end E], repeatable: each --controlnet starts a ControlNet and the
// --control-* flags after it set its fields. Throws UsageError.
std::vector<ControlNetUse> controlnet_flags(const GenerateArgs& a) {
  std::vector<ControlNetUse> out;
  std::map<std::string, size_t> taken;  // values used so far per flag
  std::vector<std::set<std::string>> seen;  // flags given per ControlNet
  for (const CLI::Option* o : a.cmd->parse_order()) {
    const std::string flag = o->get_name();
    static const std::set<std::string> kFlags = {"--controlnet", "--control-image", "--control-strength",
                                                 "--control-start", "--control-end"};
    if (!kFlags.count(flag)) continue;
    const size_t i = taken[flag]++;
    if (flag == "--controlnet") {
      out.push_back({std::filesystem::absolute(a.cn_models.at(i)).lexically_normal().string(), "", 1.0, 0.0, 1.0});
      seen.emplace_back();
      continue;
    }
    if (out.empty()) throw UsageError(flag + " comes before any --controlnet DIR (it sets the ControlNet before it)");
    if (!seen.back().insert(flag).second)
      throw UsageError("ControlNet " + std::to_string(out.size() - 1) + " (" + out.back().model + ") has " + flag + " twice");
    ControlNetUse& c = out.back();
    if (flag == "--control-image") c.image = a.cn_images.at(i);
    else if (flag == "--control-strength") c.strength = a.cn_strengths.at(i);
    else if (flag == "--control-start") c.start = a.cn_starts.at(i);
    else if (flag == "--control-end") c.end = a.cn_ends.at(i);
  }
  for (size_t k = 0; k < out.size(); ++k) {
    if (out[k].image.empty())
      throw UsageError("ControlNet " + std::to_string(k) + " (" + out[k].model + ") has no --control-image FILE after it");
    if (out[k].start >= out[k].end)
      throw UsageError("ControlNet " + std::to_string(k) + ": --control-start must be below --control-end");
    int w = 0, h = 0;
    if (const std::string why = png_size(out[k].image, w, h); !why.empty())
      throw UsageError("--control-image '" + out[k].image + "' " + why);
  }
  return out;
}

}  // namespace

CLI::App* add_generate(CLI::App& app, std::shared_ptr<GenerateArgs>& args) {
  args = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "Generate one image from a prompt");
  add_model_options(*cmd, args->model, /*model_required=*/true);
  cmd->add_option("--prompt,-p", args->prompt, "Prompt text")->required();
  cmd->add_option("--negative,-n", args->negative, "Negative prompt (empty: SDXL's zero negative conditioning)");
  cmd->add_option("--seed", args->seed, "Noise seed; -1 draws a random one (recorded in the PNG)")
      ->check(CLI::Range(std::int64_t{-1}, std::int64_t{1} << 53));
  cmd->add_option("--steps", args->steps, "Sampling steps (default: the model's)")->check(CLI::Range(1, 1000));
  cmd->add_option("--cfg", args->cfg, "Classifier-free guidance scale (default: the model's)")->check(finite_range(0.0, 100.0));
  cmd->add_option("--sampler", args->sampler,
                  "A1111 sampler: Euler, Euler a, Heun, DPM++ 2M, DPM++ 2M SDE, DPM++ SDE, DDIM, UniPC, LCM; "
                  "a schedule may follow (\"DPM++ 2M Karras\")")
      ->capture_default_str();
  cmd->add_option("--schedule", args->schedule, "A1111 schedule type: Automatic, Karras, Exponential, SGM Uniform")
      ->capture_default_str();
  cmd->add_option("--guidance-rescale", args->guidance_rescale, "diffusers' guidance_rescale (0 = off)")
      ->check(finite_range(0.0, 1.0));
  cmd->add_option("--clip-skip", args->clip_skip,
                  "Clip skip, counted from the end as A1111 does: 1 or 2 = SDXL's default (penultimate layer), "
                  "N >= 3 = hidden_states[-N] of both text encoders (at most the model's hidden states)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--init-image", args->init_image,
                  "img2img: start from this PNG (its size unless --width/--height are given, which must then match)");
  cmd->add_option("--strength", args->strength, "img2img denoising strength")->check(finite_range(0.0, 1.0))->capture_default_str();
  cmd->add_option("--hires-scale", args->hires_scale, "Hires fix: upscale factor of the second pass (0 = off)")
      ->check(finite_range(0.0, 8.0));
  cmd->add_option("--hires-upscaler", args->hires_upscaler,
                  "Hires fix upscaler: Latent, Latent (antialiased), Latent (bicubic), Latent (bicubic antialiased), "
                  "Latent (nearest), Latent (nearest-exact), Nearest (pixel space)")
      ->capture_default_str();
  cmd->add_option("--hires-steps", args->hires_steps, "Hires fix: steps of the second pass (0 = --steps)")
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--hires-denoise", args->hires_denoise, "Hires fix: denoising strength of the second pass")
      ->check(finite_range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--width", args->width, "Width in pixels (default: the model's)")->check(CLI::Range(8, 16384));
  cmd->add_option("--height", args->height, "Height in pixels (default: the model's)")->check(CLI::Range(8, 16384));
  cmd->add_option("--lora", args->loras, "LoRA file with an optional weight, FILE[:WEIGHT] (repeatable; weight 1.0)");
  cmd->add_option("--controlnet", args->cn_models,
                  "ControlNet folder (scripts/export_sdxl.py --controlnet); repeatable, each followed by its "
                  "--control-image and optional --control-strength/--control-start/--control-end");
  cmd->add_option("--control-image", args->cn_images,
                  "The control image (PNG: pose, edges, depth...) of the --controlnet before it; resized to the "
                  "image's size as diffusers does");
  cmd->add_option("--control-strength", args->cn_strengths,
                  "Strength of the --controlnet before it (diffusers' controlnet_conditioning_scale; default 1)")
      ->check(finite_range(0.0, 10.0));
  cmd->add_option("--control-start", args->cn_starts,
                  "Fraction of the steps where the --controlnet before it starts acting (default 0)")
      ->check(finite_range(0.0, 1.0));
  cmd->add_option("--control-end", args->cn_ends,
                  "Fraction of the steps where the --controlnet before it stops acting (default 1)")
      ->check(finite_range(0.0, 1.0));
  cmd->add_option("--ip-adapter", args->ip_adapter,
                  "IP-Adapter folder (scripts/export_sdxl.py --ip-adapter): steer the image toward --ip-image")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--ip-image", args->ip_images,
                  "Reference image (PNG) of the --ip-adapter; repeatable (their tokens join, in order)");
  cmd->add_option("--ip-scale", args->ip_scale, "Scale of the --ip-adapter (diffusers' set_ip_adapter_scale)")
      ->check(finite_range(0.0, 10.0))
      ->capture_default_str();
  cmd->add_option("--out,-o", args->out, "Output PNG (default: sdxl-<seed>.png)");
  cmd->add_option("--save-latents", args->save_latents, "Also write the final latents as float32 .npy (parity checks)");
  cmd->add_option("--timings-json", args->timings_json, "Write stage timings and peak memory as JSON to this file");
  args->cmd = cmd;
  return cmd;
}

namespace {

// --ip-adapter DIR --ip-image FILE... [--ip-scale S], checked before the model
// loads: the folder fits the model (ModelError, exit 3), each image is a PNG (UsageError).
IpAdapterUse ip_adapter_flags(const GenerateArgs& a, const ModelConfig& config) {
  IpAdapterUse ip;
  if (a.ip_adapter.empty()) {
    if (!a.ip_images.empty()) throw UsageError("--ip-image needs --ip-adapter DIR (the adapter it steers through)");
    return ip;
  }
  if (a.ip_images.empty()) throw UsageError("--ip-adapter needs at least one --ip-image FILE (a reference PNG)");
  ip.model = std::filesystem::absolute(a.ip_adapter).lexically_normal().string();
  check_ip_adapter_fits(load_ip_adapter_config(ip.model), config);
  for (const std::string& f : a.ip_images) {
    int w = 0, h = 0;
    if (const std::string why = png_size(f, w, h); !why.empty()) throw UsageError("--ip-image '" + f + "' " + why);
    ip.images.push_back(std::filesystem::absolute(f).lexically_normal().string());
  }
  ip.scale = a.ip_scale;
  return ip;
}

}  // namespace

int run_generate(const GenerateArgs& args) {
  using Clock = std::chrono::steady_clock;
  const GenerateArgs& a = args;
  const sdxl_batch::ModelOptions mo = a.model.resolved();
  const RuntimeOptions runtime = api::runtime_options(mo);
  std::vector<LoraRef> loras;
  for (const auto& l : a.loras) loras.push_back(parse_lora_arg(l));
  // The text rule of core/input_text.h, as for batch files: prompts may span lines.
  if (const std::string why = text_problem(a.prompt, TextKind::kMultiline); !why.empty())
    throw UsageError("--prompt " + why);
  if (const std::string why = text_problem(a.negative, TextKind::kMultiline); !why.empty())
    throw UsageError("--negative " + why);
  // Also before the model loads: a prompt tag naming an unknown LoRA, or one of
  // the --lora files at another weight, fails fast.
  (void)merge_lora_tags(loras, extract_lora_tags(a.prompt).tags, {}, runtime.lora_dirs);
  GenerationParams p;
  p.sampler = a.sampler;
  p.schedule = a.schedule;
  p.guidance_rescale = a.guidance_rescale;
  p.clip_skip = a.clip_skip;
  canonicalize_sampler(p);  // UsageError (exit 2) listing the valid names, before the model loads
  int image_w = 0, image_h = 0;
  if (!a.init_image.empty()) {
    const std::string why = png_size(a.init_image, image_w, image_h);
    if (!why.empty()) throw UsageError("--init-image '" + a.init_image + "' " + why);
    p.init_image = a.init_image;
    p.strength = a.strength;
  }
  if (a.hires_scale > 0) {
    p.hires.scale = a.hires_scale;
    p.hires.upscaler = canonical_hires_upscaler(a.hires_upscaler);
    p.hires.steps = a.hires_steps;
    p.hires.denoise = a.hires_denoise;
  }
  const ModelConfig config = load_model_config(mo.model_dir);
  if (p.clip_skip != 0) check_clip_skip(config, p.clip_skip);  // UsageError before the model loads
  if (!mo.vae_dir.empty()) {  // ModelError (exit 3) naming the folder, before the model loads
    p.vae = std::filesystem::absolute(mo.vae_dir).lexically_normal().string();
    check_vae_fits(load_vae_config(p.vae), config);
  }
  p.controlnets = controlnet_flags(a);
  for (const ControlNetUse& c : p.controlnets)  // ModelError (exit 3) naming the folder, before the model loads
    check_controlnet_fits(load_controlnet_config(c.model), config);
  p.ip_adapter = ip_adapter_flags(a, config);
  if (mo.verify) {
    verify_model_folder(config);
    verify_task_folders({&p});
  }
  Generator gen(mo.model_dir, runtime);
  const ModelConfig& mc = gen.model();
  p.prompt = a.prompt;
  p.negative_prompt = a.negative;
  p.seed = a.seed < 0 ? random_seed() : a.seed;
  p.steps = a.steps > 0 ? a.steps : mc.defaults.steps;
  p.cfg = a.cfg >= 0 ? a.cfg : mc.defaults.cfg;
  p.width = a.width > 0 ? a.width : (image_w > 0 ? image_w : mc.defaults.width);
  p.height = a.height > 0 ? a.height : (image_h > 0 ? image_h : mc.defaults.height);
  p.loras = loras;
  const std::string out = a.out.empty() ? "sdxl-" + std::to_string(p.seed) + ".png" : a.out;

  const auto t0 = Clock::now();
  GeneratedImage img = gen.generate(p);
  const auto t1 = Clock::now();
  ImageSources sources = model_sources(mc);
  add_image_sources(sources, p, img);
  write_png(out, img.width, img.height, 3, img.rgb.data(), {{"parameters", a1111_parameters(p, sources)}});
  const double write_s = std::chrono::duration<double>(Clock::now() - t1).count();
  const double total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!a.save_latents.empty()) write_npy_f32(a.save_latents, img.latent_shape, img.latents);

  spdlog::info("wrote {} ({}x{}, seed {}, {} steps) in {:.2f} s: text {:.3f} s, sample {:.3f} s, decode {:.3f} s, write {:.3f} s; peak memory {}",
               out, p.width, p.height, p.seed, p.steps, total_s, img.seconds.text, img.seconds.sample,
               img.seconds.decode, write_s, format_bytes(gen.peak_memory_bytes()));
  if (!a.timings_json.empty()) {
    nlohmann::json j = {{"device", gen.device_name()}, {"model", mc.name}, {"width", p.width}, {"height", p.height},
                        {"steps", p.steps}, {"load_s", gen.load_seconds()}, {"text_s", img.seconds.text},
                        {"sample_s", img.seconds.sample}, {"decode_s", img.seconds.decode}, {"write_s", write_s},
                        {"total_s", total_s}, {"peak_bytes", gen.peak_memory_bytes()}};
    if (!loras.empty() || !img.lora_hashes.empty()) {
      const LoraStats st = gen.lora_stats();
      j["lora"] = {{"switch_s", img.lora_s}, {"load_s", st.load_s}, {"merge_s", st.merge_s}, {"hits", st.hits},
                   {"misses", st.misses}, {"evictions", st.evictions}, {"bytes_held", st.bytes_held},
                   {"budget_bytes", st.budget_bytes}};
    }
    write_file_atomic(a.timings_json, j.dump(2) + "\n");
  }
  return 0;
}

}  // namespace sdxl::cli
