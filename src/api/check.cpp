// check_batch_file (with and without a model), expansions, and the free
// helpers of the public API.
#include <sdxl_batch/sdxl_batch.h>

#include <cstdlib>

#include "api/boundary.h"
#include "api/session_impl.h"
#include "batch/generation_params.h"
#include "batch/story.h"
#include "core/input_file.h"
#include "core/units.h"

namespace sdxl::api {

BatchCheckInputs check_inputs(const ModelConfig* model, const std::vector<std::string>& wildcard_dirs,
                              const std::vector<std::string>& embedding_dirs, int clip_skip,
                              const std::string& vae_dir, const std::vector<std::string>& lora_dirs) {
  BatchCheckInputs in;
  if (model) in.fallback = defaults_of(*model);
  in.fallback.clip_skip = clip_skip;
  if (!vae_dir.empty()) in.fallback.vae = absolute_normal(vae_dir).string();
  in.wildcard_dirs.assign(wildcard_dirs.begin(), wildcard_dirs.end());
  in.embedding_dirs.assign(embedding_dirs.begin(), embedding_dirs.end());
  in.lora_dirs.assign(lora_dirs.begin(), lora_dirs.end());
  return in;
}

namespace {

// Every image's prompt after characters, styles and wildcards. A random-seed
// task with wildcards draws its prompts from the seed the run draws.
sdxl_batch::TaskExpansion expand_task(const BatchTask& task, const WildcardLibrary& lib) {
  sdxl_batch::TaskExpansion t;
  t.task_id = task.id;
  t.count = task.count;
  t.prompt_template = task.params.prompt;
  t.drawn_at_run_time = task.seed_random && prompt_has_wildcards(task.params) && !task.expand_all;
  if (t.drawn_at_run_time) return t;
  for (int i = 0; i < task.count; ++i) {
    const std::int64_t seed = task.params.seed + i;
    const ImagePrompt ip = task_image_prompt(task, i, seed, lib);
    sdxl_batch::ImagePrompt img;
    img.index = i;
    if (!task.seed_random) img.seed = seed;
    img.prompt = ip.prompt;
    img.negative = ip.negative;
    img.picked = ip.choices;
    t.images.push_back(std::move(img));
  }
  return t;
}

}  // namespace

sdxl_batch::CheckReport public_report(const CheckedBatch& checked, bool expand) {
  sdxl_batch::CheckReport r;
  r.problems = public_problems(checked.file.path.string(), checked.problems);
  r.notes = checked.notes;
  if (expand && r.problems.empty()) {
    const WildcardLibrary lib(checked.file.wildcard_dirs);
    for (const BatchTask& task : checked.file.tasks) r.expansions.push_back(expand_task(task, lib));
  }
  return r;
}

}  // namespace sdxl::api

namespace sdxl_batch {

using sdxl::api::guarded;

CheckReport check_batch_file(const std::string& path, const CheckOptions& o) {
  return guarded([&] {
    const sdxl::BatchCheckInputs in =
        sdxl::api::check_inputs(nullptr, o.wildcard_dirs, o.embedding_dirs, o.clip_skip, o.vae_dir, o.lora_dirs);
    return sdxl::api::public_report(sdxl::check_batch_file(path, nullptr, in), o.expand);
  });
}

std::string batch_file_model_dir(const std::string& path) {
  return guarded([&] {
    const std::filesystem::path p(path);
    std::vector<sdxl::BatchProblem> ignored;  // the run's check reports them
    const sdxl::BatchFile bf = sdxl::parse_batch_text(sdxl::read_batch_text(p), p, sdxl::GenerationParams{}, &ignored);
    if (bf.model.empty()) return std::string();
    const std::filesystem::path m(bf.model);
    return (m.is_absolute() ? m : p.parent_path() / m).string();
  });
}

double parse_duration_seconds(const std::string& text) {
  return guarded([&] { return sdxl::parse_duration_s(text); });
}

std::uint64_t parse_size_bytes(const std::string& text) {
  return guarded([&] { return sdxl::parse_size_bytes(text); });
}

std::pair<int, int> parse_frame_size(const std::string& text) {
  return guarded([&] {
    int w = 0, h = 0;
    if (!sdxl::parse_frame_size(text, w, h)) throw sdxl::UsageError("'" + text + "': expected WxH, e.g. 1080x1920");
    return std::pair{w, h};
  });
}

std::pair<int, int> parse_shard(const std::string& text) {
  const sdxl::EnvLookup env = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  return guarded([&] { return sdxl::parse_shard(text, env); });
}

std::string program_name() { return sdxl::kProgramName; }
std::string version() { return sdxl::kProgramVersion; }

}  // namespace sdxl_batch
