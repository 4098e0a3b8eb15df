#include "check/batch_check.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "batch/lora_ref.h"
#include "check/folder_pins.h"
#include "batch/story.h"
#include "batch/wildcards.h"
#include "core/error.h"
#include "core/subprocess.h"
#include "image/mask.h"
#include "image/png_reader.h"
#include "lora/embedding_files.h"
#include "lora/safetensors.h"
#include "model/detector_config.h"
#include "model/upscaler_config.h"
#include "sampling/sampler_plan.h"
#include "text/clip_tokenizer.h"
#include "text/prompt_chunks.h"
#include "text/prompt_schedule.h"

namespace sdxl {

GenerationParams defaults_of(const ModelConfig& mc) {
  GenerationParams p;
  p.steps = mc.defaults.steps;
  p.cfg = mc.defaults.cfg;
  p.guidance_rescale = mc.defaults.guidance_rescale;
  p.width = mc.defaults.width;
  p.height = mc.defaults.height;
  return p;
}

void canonicalize_sampler(GenerationParams& p) {
  const SamplerChoice c = parse_sampler_choice(p.sampler, p.schedule);
  p.sampler = c.sampler_name;
  p.schedule = c.schedule_name;
}

std::string FileInputChecks::folder_problem(const std::string& kind, const std::string& dir) {
  try {
    if (kind == "vae") (void)load_vae_config(dir);
    else if (kind == "controlnet") (void)load_controlnet_config(dir);
    else if (kind == "ip_adapter") (void)load_ip_adapter_config(dir);
    else if (kind == "upscaler") (void)load_upscaler_config(dir);
    else if (kind == "detector") (void)load_detector_config(dir);
    else return "unknown folder kind '" + kind + "'";
  } catch (const ModelError& e) {
    return e.what();
  }
  return "";
}

std::string FileInputChecks::folder_weights_sha256(const std::string& kind, const std::string& dir) {
  if (kind != "upscaler" && kind != "detector") return "";
  try {
    const auto sha = [](const auto& c) {
      const auto it = c.file_sha256.find(c.file);
      return it == c.file_sha256.end() ? std::string() : it->second;
    };
    return kind == "upscaler" ? sha(load_upscaler_config(dir)) : sha(load_detector_config(dir));
  } catch (const ModelError&) {
    return "";  // folder_problem said why
  }
}

std::string FileInputChecks::png_size(const std::string& path, int& width, int& height) {
  auto [it, fresh] = pngs_.try_emplace(path);
  if (fresh) it->second.why = png_decode_problem(path, it->second.width, it->second.height);
  width = it->second.width;
  height = it->second.height;
  return it->second.why;
}

void FileInputChecks::canonicalize_sampler(GenerationParams& p) { sdxl::canonicalize_sampler(p); }

std::string FileInputChecks::timesteps_problem(const GenerationParams& p) {
  try {
    return sdxl::timesteps_problem(parse_sampler_choice(p.sampler, p.schedule), p.timesteps, 1000);
  } catch (const UsageError&) {
    return "";  // the sampler's own problem, reported at /sampler
  }
}

// An empty mask is refused (validate and run): the task would only re-encode
// its init image, which is not what a user who drew a mask asked for.
std::string FileInputChecks::audio_problem(const std::string& path) {
  if (!program_on_path("ffmpeg")) return "cannot be checked: the ffmpeg program is not installed (scripts/setup.sh)";
  const ProgramResult r = run_program({"ffmpeg", "-nostdin", "-hide_banner", "-v", "error", "-i", path, "-map", "0:a:0",
                                       "-t", "3", "-f", "null", "-"});
  if (r.status == 0) return "";
  std::string why = r.err.substr(0, 300);
  while (!why.empty() && (why.back() == '\n' || why.back() == '\r')) why.pop_back();
  return "cannot be decoded as audio by FFmpeg" + (why.empty() ? std::string() : ": " + why);
}

std::string FileInputChecks::mask_problem(const std::string& path) {
  int w = 0, h = 0;
  if (std::string why = png_size(path, w, h); !why.empty()) return why;
  try {
    if (!mask_marks_anything(read_png_rgb(path, "mask")))
      return "is an empty mask (no pixel at 0.5 grey or above: nothing to repaint; white marks what to repaint)";
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// A region mask all black would weigh nothing: its region could never act.
std::string FileInputChecks::region_mask_problem(const std::string& path) {
  int w = 0, h = 0;
  if (std::string why = png_size(path, w, h); !why.empty()) return why;
  try {
    const RgbImage mask = read_png_rgb(path, "region mask");
    const std::vector<std::uint8_t> grey = grey_of_rgb8(mask.rgb.data(), mask.width, mask.height);
    if (std::all_of(grey.begin(), grey.end(), [](std::uint8_t v) { return v == 0; }))
      return "is all black: a region mask weighs each place by its grey level (white = inside), so this region "
             "would act nowhere";
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

namespace {

// The model's tokenizers with the embeddings the run will load (counted as
// their vectors), each file checked as load_embeddings checks it (dtype, the
// encoders' widths, finite values). A problem is /embeddings_dir's; returns
// false then.
bool embedding_tokenizers(const ModelConfig& mc, const std::vector<std::filesystem::path>& dirs,
                          std::vector<ClipTokenizer>& toks, std::vector<BatchProblem>& problems) {
  for (const auto& te : mc.text_encoders) toks.push_back(ClipTokenizer::from_dir(mc.path_of(te.tokenizer), te.pad_token));
  try {
    const std::vector<EmbeddingFile> files = scan_embedding_files(dirs);
    const auto width = [&](size_t k) { return k < mc.text_encoders.size() ? mc.text_encoders[k].hidden_dim : 0; };
    for (const EmbeddingFile& e : files) check_embedding_vectors(SafetensorsFile::open(e.path), width(0), width(1));
    for (auto& t : toks) add_embedding_tokens(t, files, static_cast<std::int32_t>(t.vocab_size()));
  } catch (const UsageError& e) {
    problems.push_back({"/embeddings_dir", e.what(), 0});
    return false;
  }
  return true;
}

// Each detailer unit's prompt of image `k` (its "[PROMPT]" the image's) with its <lora:NAME:W> tags
// resolved as the region passes will resolve them: an unknown name would fail the whole image after
// its panel and first units were made.
void check_detailer_loras(const BatchTask& task, const std::string& image_prompt, const std::string& at,
                          const BatchFile& bf, const BatchCheckInputs& inputs, int k,
                          std::vector<BatchProblem>& problems) {
  for (size_t u = 0; u < task.params.detailer.size(); ++u) {
    const std::string text = detailer_prompt(task.params.detailer[u].prompt, image_prompt);
    try {
      (void)merge_lora_tags(task.params.loras, extract_lora_tags(text).tags, bf.lora_registry, inputs.lora_dirs);
    } catch (const UsageError& e) {
      problems.push_back({at + "/detailer/" + std::to_string(u) + "/prompt",
                          "image " + std::to_string(k) + "'s detailer prompt: " + e.what(), 0});
    }
  }
}

// A prompt's edits read as the run reads them (text/prompt_schedule.h: a `when`
// that is no number or beyond any step): false after adding the problem at `at`.
bool prompt_schedule_ok(const std::string& text, const GenerationParams& p, const std::string& at, int k,
                             std::vector<BatchProblem>& problems) {
  try {
    const PassSchedules s = pass_schedules(text, std::max(p.steps, 1), p.hires_on() ? std::max(p.hires_steps(), 1) : 0);
    if (p.has_regions() && s.texts.size() > 1) {
      problems.push_back({at, "image " + std::to_string(k) + ": prompt editing ([from:to:when], [a|b]) cannot be "
                                  "combined with \"regions\" (each region's prompt is one text for all steps)", 0});
      return false;
    }
    return true;
  } catch (const UsageError& e) {
    problems.push_back({at, "image " + std::to_string(k) + ": " + e.what(), 0});
    return false;
  }
}

// Every image whose prompt is known now (random-seed tasks with wildcards draw
// theirs at run time), checked as the run will use it: its <lora:NAME:W> tags
// resolved with the task's LoRAs (merge_lora_tags, as the run does: an unknown
// name or a LoRA at two weights fails the task there), and, with a model, its
// 75-token chunks against the number the model was checked for.
void check_image_prompts(const ModelConfig* mc, const BatchFile& bf, const BatchCheckInputs& inputs,
                         std::vector<BatchProblem>& problems) {
  std::vector<ClipTokenizer> toks;
  std::vector<std::filesystem::path> emb_dirs = inputs.embedding_dirs;
  emb_dirs.insert(emb_dirs.end(), bf.embedding_dirs.begin(), bf.embedding_dirs.end());
  if (mc && !embedding_tokenizers(*mc, emb_dirs, toks, problems)) mc = nullptr;
  // The most chunks of any text the prompt's edits schedule (all are padded to it).
  auto chunks = [&](const std::string& text, const GenerationParams& p) {
    size_t n = 0;
    const int hires = p.hires_on() ? std::max(p.hires_steps(), 1) : 0;
    for (const std::string& s : pass_schedules(extract_lora_tags(text).text, std::max(p.steps, 1), hires).texts)
      for (const auto& t : toks) n = std::max(n, tokenize_prompt(t, s, nullptr).size());
    return n;
  };
  const WildcardLibrary lib(bf.wildcard_dirs);
  std::set<std::string> reported;  // a task whose prompt already has a problem is not expanded again
  for (const auto& p : problems) reported.insert(p.pointer);
  for (size_t i = 0; i < bf.tasks.size(); ++i) {
    const BatchTask& task = bf.tasks[i];
    if (task.seed_random && prompt_has_wildcards(task.params) && !task.expand_all) continue;
    const std::string at = "/tasks/" + std::to_string(i);
    if (reported.count(at + "/prompt") || reported.count(at + "/negative")) continue;
    std::set<std::string> seen;
    for (int k = 0; k < task.count; ++k) {
      try {
        const ImagePrompt ip = task_image_prompt(task, k, task.params.seed + k, lib);
        if (!seen.insert(ip.prompt + '\x1e' + ip.negative).second) continue;
        (void)merge_lora_tags(task.params.loras, extract_lora_tags(ip.prompt).tags, bf.lora_registry, inputs.lora_dirs);
        check_detailer_loras(task, ip.prompt, at, bf, inputs, k, problems);
        const std::string prompt = extract_lora_tags(ip.prompt).text;
        if (!prompt_schedule_ok(prompt, task.params, at + "/prompt", k, problems)) break;
        const bool negative_used = task.params.cfg > 1.0;  // the run encodes no negative without CFG
        if (negative_used && !prompt_schedule_ok(ip.negative, task.params, at + "/negative", k, problems)) break;
        if (!mc) continue;
        size_t n = chunks(prompt, task.params);
        if (task.params.cfg > 1.0 && !ip.negative.empty()) n = std::max(n, chunks(ip.negative, task.params));
        for (const auto& [rp, rn] : ip.regions)
          n = std::max({n, chunks(rp, task.params), task.params.cfg > 1.0 ? chunks(rn, task.params) : size_t{0}});
        if (n <= static_cast<size_t>(mc->limits.context_chunks_max)) continue;
        problems.push_back({at + "/prompt", "image " + std::to_string(k) + "'s prompt needs " + std::to_string(n) +
                                                " chunks of 75 tokens; model '" + mc->name + "' was checked for at most " +
                                                std::to_string(mc->limits.context_chunks_max) +
                                                " (shorten it; `sdxl-batch tokens` shows the chunks)", 0});
      } catch (const UsageError& e) {
        problems.push_back({at + "/prompt", "image " + std::to_string(k) + ": " + e.what(), 0});
      }
      break;  // one problem per task is enough
    }
  }
}

// A mask that its blur fades below 0.5 everywhere on the latent grid leaves
// nothing to repaint (the run would refuse it). An unreadable mask is reported
// where the batch file names it.
void check_mask_blur(const ModelConfig& model, const std::string& at, const GenerationParams& p, CheckedBatch& out) {
  RgbImage mask;
  try {
    mask = read_png_rgb(p.mask, "mask");
  } catch (const UsageError&) {
    return;
  }
  if (!mask_marks_anything(mask)) return;  // an empty mask, reported where the batch file names it
  if (!mask_survives_blur(mask, p.mask_blur, p.inpaint_masked(), p.inpaint_padding, p.width, p.height,
                          model.vae_downsample))
    out.problems.push_back({at + "/mask", "'" + p.mask + "' marks nothing to repaint after its blur of " +
                                              std::to_string(p.mask_blur) +
                                              " and the resize to the latent grid (widen it, or lower mask_blur)", 0});
}

// The JSON pointer (below the task's) of flattened ControlNet entry `k`: a
// Union ControlNet's "images" (2 or more, batch_file.cpp) are entries marked
// same_call after their first.
std::string controlnet_pointer(const std::vector<ControlNetUse>& cns, size_t k) {
  size_t entry = 0, first = 0;
  for (size_t i = 1; i <= k; ++i)
    if (!cns[i].same_call) ++entry, first = i;
  const bool joint = k > first || (k + 1 < cns.size() && cns[k + 1].same_call);
  const std::string base = "/controlnets/" + std::to_string(entry);
  return joint ? base + "/images/" + std::to_string(k - first) : base;
}

// The model's limits for task `i`: sizes (and the hires pass), clip skip, and
// whether its VAE, ControlNet and IP-Adapter folders fit the model.
void check_task_against_model(const ModelConfig& model, TaskFolderFits& fits, size_t i, const GenerationParams& p,
                              CheckedBatch& out) {
  const std::string at = "/tasks/" + std::to_string(i);
  if (model.inpainting_unet() && !p.inpaint()) out.problems.push_back({at, unmasked_task_on_inpainting_unet(model), 0});
  if (p.inpaint()) check_mask_blur(model, at, p, out);
  try {
    const std::string note = check_task_size(model, p);
    if (!note.empty()) out.notes.push_back(at + ": " + note);
  } catch (const UsageError& e) {
    out.problems.push_back({at, e.what(), 0});
  }
  if (const std::string why = regions_problem(model, p); !why.empty())
    out.problems.push_back({at + "/regions", why, 0});
  try {
    if (p.clip_skip != 0) check_clip_skip(model, p.clip_skip);
  } catch (const UsageError& e) {
    out.problems.push_back({at + "/clip_skip", e.what(), 0});
  }
  try {
    if (!p.vae.empty()) fits.vae(p.vae);
  } catch (const ModelError& e) {
    out.problems.push_back({at, e.what(), 0});
  }
  for (size_t k = 0; k < p.controlnets.size(); ++k) {
    const std::string cp = at + controlnet_pointer(p.controlnets, k);
    try {
      const std::string why = fits.control_type(p.controlnets[k].model, p.controlnets[k].type);
      if (!why.empty()) out.problems.push_back({cp + "/type", why, 0});
    } catch (const ModelError& e) {
      out.problems.push_back({cp, e.what(), 0});
    }
  }
  try {
    if (p.ip_adapter.on()) fits.ip_adapter(p.ip_adapter.model);
  } catch (const ModelError& e) {
    out.problems.push_back({at + "/ip_adapter/model", e.what(), 0});
  }
}

}  // namespace

CheckedBatch check_batch_file(const std::filesystem::path& path, const ModelConfig* model,
                              const BatchCheckInputs& inputs) {
  return check_batch_text(read_batch_text(path), path, model, inputs);
}

CheckedBatch check_batch_text(const std::string& text, const std::filesystem::path& path, const ModelConfig* model,
                              const BatchCheckInputs& inputs) {
  CheckedBatch out;
  FileInputChecks files;
  out.file = parse_batch_text(text, path, inputs.fallback, &out.problems, inputs.wildcard_dirs, &files);
  check_folder_pins(out.file, out.problems);
  if (model) {
    TaskFolderFits fits(*model);
    for (size_t i = 0; i < out.file.tasks.size(); ++i) check_task_against_model(*model, fits, i, out.file.tasks[i].params, out);
  }
  check_image_prompts(model, out.file, inputs, out.problems);
  attach_lines(text, out.problems);
  return out;
}

BatchFile keep_valid_tasks(CheckedBatch checked, std::vector<std::pair<std::string, std::string>>& invalid) {
  std::map<size_t, std::string> bad;  // task position -> errors
  std::vector<BatchProblem> fatal;
  for (const auto& p : checked.problems) {
    size_t pos = 0;
    if (std::sscanf(p.pointer.c_str(), "/tasks/%zu", &pos) == 1)
      bad[pos] += (bad[pos].empty() ? "" : "; ") + p.pointer + ": " + p.message;
    else
      fatal.push_back(p);
  }
  BatchFile& bf = checked.file;
  if (!fatal.empty()) {
    std::string msg = bf.path.string() + " cannot run even with --skip-invalid:";
    for (const auto& p : fatal)
      msg += "\n  " + (p.pointer.empty() ? std::string("/") : p.pointer) + " (line " + std::to_string(p.line) +
             "): " + p.message;
    throw UsageError(msg);
  }
  std::vector<BatchTask> kept;
  for (size_t i = 0; i < bf.tasks.size(); ++i) {
    const auto it = bad.find(i);
    if (it == bad.end()) {
      kept.push_back(bf.tasks[i]);
      continue;
    }
    const std::string id = bf.tasks[i].id.empty() ? "/tasks/" + std::to_string(i) : bf.tasks[i].id;
    spdlog::warn("skipping invalid task {}: {}", id, it->second);
    invalid.emplace_back(id, it->second);
  }
  bf.tasks = std::move(kept);
  return std::move(bf);
}

std::vector<BatchProblem> validate_batch_file(const std::filesystem::path& path, const ModelConfig* model,
                                              const std::vector<std::filesystem::path>& wildcard_dirs,
                                              const std::vector<std::filesystem::path>& embedding_dirs) {
  const BatchCheckInputs inputs{model ? defaults_of(*model) : GenerationParams{}, wildcard_dirs, embedding_dirs, {}};
  return check_batch_file(path, model, inputs).problems;
}

}  // namespace sdxl
