// Session: opening the model folder, tokens, checks and submitting tasks.
// The run is in run.cpp.
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "api/boundary.h"
#include "api/session_impl.h"
#include "check/model_files.h"
#include "core/input_file.h"
#include "lora/embedding_files.h"
#include "text/clip_tokenizer.h"
#include "text/prompt_chunks.h"
#include "text/prompt_schedule.h"

namespace sdxl_batch {

using sdxl::api::guarded;

namespace {

TokenChunk public_chunk(const sdxl::ClipTokenizer& tok, const sdxl::TokenizedPrompt& tp, size_t c) {
  const sdxl::PromptChunk& ch = tp.chunks[c];
  TokenChunk out;
  out.tokens_used = tp.tokens_used[c];
  for (size_t k = 1; k <= tp.tokens_used[c]; ++k)  // skip bos; padding after the used tokens
    out.tokens.push_back({ch.ids[k], tok.token_text(static_cast<std::int32_t>(ch.ids[k])), ch.multipliers[k]});
  out.ids = ch.ids;
  return out;
}

}  // namespace

Session::Session(ModelOptions options) : impl_(std::make_unique<Impl>()) {
  guarded([&] {
    if (options.model_dir.empty()) throw sdxl::UsageError("no model folder given (ModelOptions::model_dir, --model)");
    impl_->config =
        sdxl::with_unet_precision(sdxl::load_model_config(options.model_dir), options.precision, options.dtype);
    if (options.verify) sdxl::verify_model_folder(impl_->config);
    impl_->options = std::move(options);
  });
}

Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

const ModelOptions& Session::options() const { return impl_->options; }

ModelInfo Session::model() const {
  const sdxl::ModelConfig& mc = impl_->config;
  ModelInfo m;
  m.dir = mc.dir.string();
  m.name = mc.name;
  m.dtype = mc.dtype;
  m.unet_precision = mc.unet_precision;
  m.default_steps = mc.defaults.steps;
  m.default_cfg = mc.defaults.cfg;
  m.default_width = mc.defaults.width;
  m.default_height = mc.defaults.height;
  m.batch_max = mc.limits.batch_max;
  m.context_chunks_max = mc.limits.context_chunks_max;
  return m;
}

namespace {

// The steps each text of the prompt's schedule holds for, runs of one text joined.
std::vector<PromptScheduleSpan> schedule_spans(const sdxl::PassSchedules& ps, int steps) {
  std::vector<PromptScheduleSpan> out;
  for (int k = 0; k < steps; ++k) {
    const std::string& text = ps.texts[ps.text_at(0, k)];
    if (!out.empty() && out.back().text == text)
      out.back().last_step = k + 1;
    else
      out.push_back({k + 1, k + 1, text});
  }
  return out;
}

}  // namespace

TokenReport Session::tokens(const std::string& prompt, const std::vector<std::string>& embedding_dirs,
                            int steps) const {
  return guarded([&] {
    const sdxl::ModelConfig& mc = impl_->config;
    const int schedule_steps = steps > 0 ? steps : std::max(mc.defaults.steps, 1);
    const sdxl::PassSchedules ps = sdxl::pass_schedules(prompt, schedule_steps, 0);
    const std::string& text = ps.texts.front();
    std::vector<std::filesystem::path> dirs(impl_->options.embedding_dirs.begin(), impl_->options.embedding_dirs.end());
    dirs.insert(dirs.end(), embedding_dirs.begin(), embedding_dirs.end());
    const std::vector<sdxl::EmbeddingFile> embeddings = sdxl::scan_embedding_files(dirs);
    TokenReport r;
    std::vector<sdxl::PromptWarning> warnings;
    for (size_t i = 0; i < mc.text_encoders.size(); ++i) {
      const auto& te = mc.text_encoders[i];
      sdxl::ClipTokenizer tok = sdxl::ClipTokenizer::from_dir(mc.path_of(te.tokenizer), te.pad_token);
      sdxl::add_embedding_tokens(tok, embeddings, static_cast<std::int32_t>(tok.vocab_size()));
      const sdxl::TokenizedPrompt tp = sdxl::tokenize_prompt_counted(tok, text, i == 0 ? &warnings : nullptr);
      EncoderTokens e{te.file, te.tokenizer, tp.token_count, {}};
      for (size_t c = 0; c < tp.chunks.size(); ++c) e.chunks.push_back(public_chunk(tok, tp, c));
      r.encoders.push_back(std::move(e));
    }
    for (const auto& w : warnings) r.warnings.push_back({w.position, w.message});
    r.context_chunks_max = mc.limits.context_chunks_max;
    r.schedule_steps = schedule_steps;
    if (ps.texts.size() > 1) r.schedule = schedule_spans(ps, schedule_steps);
    return r;
  });
}

CheckReport Session::check_batch_file(const std::string& path, const CheckOptions& o) const {
  return guarded([&] {
    std::vector<std::string> emb = impl_->options.embedding_dirs;
    emb.insert(emb.end(), o.embedding_dirs.begin(), o.embedding_dirs.end());
    std::vector<std::string> loras = impl_->options.lora_dirs;
    loras.insert(loras.end(), o.lora_dirs.begin(), o.lora_dirs.end());
    const std::string vae = o.vae_dir.empty() ? impl_->options.vae_dir : o.vae_dir;
    const sdxl::BatchCheckInputs in =
        sdxl::api::check_inputs(&impl_->config, o.wildcard_dirs, emb, o.clip_skip, vae, loras);
    return sdxl::api::public_report(sdxl::check_batch_file(path, &impl_->config, in), o.expand);
  });
}

void Session::submit_batch_file(const std::string& path) {
  if (!impl_->batch_file.empty() || !impl_->tasks.empty())
    throw UsageError("submit_batch_file('" + path + "'): tasks are submitted already (clear() first)");
  impl_->batch_file = path;
}

void Session::submit(const Task& task) {
  guarded([&] {
    if (!impl_->batch_file.empty())
      throw sdxl::UsageError("task '" + task.id + "': batch file '" + impl_->batch_file +
                             "' is submitted already (clear() first)");
    for (const Task& t : impl_->tasks)
      if (t.id == task.id) throw sdxl::UsageError("task '" + task.id + "' is submitted already (ids name the files)");
    const sdxl::BatchCheckInputs in =
        sdxl::api::check_inputs(&impl_->config, {}, impl_->options.embedding_dirs, 0, impl_->options.vae_dir,
                                impl_->options.lora_dirs);
    sdxl::CheckedBatch checked =
        sdxl::check_batch_text(sdxl::api::tasks_document({task}), sdxl::api::kTasksOrigin, &impl_->config, in);
    if (!checked.problems.empty()) {
      const std::string at = "/tasks/" + std::to_string(impl_->tasks.size());
      for (sdxl::BatchProblem& p : checked.problems) {
        if (p.pointer.rfind("/tasks/0", 0) == 0) p.pointer = at + p.pointer.substr(8);
        p.line = 0;  // of a text the caller never sees
      }
      sdxl::api::throw_invalid(sdxl::api::kTasksOrigin, checked.problems);
    }
    impl_->tasks.push_back(task);
  });
}

void Session::clear() {
  impl_->batch_file.clear();
  impl_->tasks.clear();
}

}  // namespace sdxl_batch

namespace sdxl::api {

std::string tasks_document(const std::vector<sdxl_batch::Task>& tasks) {
  nlohmann::json arr = nlohmann::json::array();
  for (const sdxl_batch::Task& t : tasks) {
    nlohmann::json j = {{"id", t.id},       {"prompt", t.prompt},   {"negative", t.negative}, {"seed", t.seed},
                        {"count", t.count}, {"sampler", t.sampler}, {"schedule", t.schedule}, {"priority", t.priority}};
    if (t.steps) j["steps"] = *t.steps;
    if (t.cfg) j["cfg"] = *t.cfg;
    if (t.width) j["width"] = *t.width;
    if (t.height) j["height"] = *t.height;
    for (const sdxl_batch::Lora& l : t.loras)
      j["loras"].push_back(
          {{"path", absolute_normal(l.path).string()}, {"weight", l.weight}});
    arr.push_back(std::move(j));
  }
  return nlohmann::json{{"version", 1}, {"tasks", std::move(arr)}}.dump(1);
}

}  // namespace sdxl::api
