// `sdxl-batch tokens`: how both SDXL tokenizers read a prompt under A1111's
// rules — token count, 75-token chunks, ids and emphasis weights, syntax
// warnings, and for A1111 prompt editing ([from:to:when], [a|b]) which text
// applies to which sampler steps, each text's tokens after — so a user can
// check a prompt before a night's run. A client of the public API alone.
#include <sdxl_batch/sdxl_batch.h>

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"

namespace sdxl::cli {

struct TokensArgs {
  std::string model_dir, text;
  std::vector<std::string> embedding_dirs;
  bool json = false;
  int steps = 0;
};

CLI::App* add_tokens(CLI::App& app, std::shared_ptr<TokensArgs>& args) {
  args = std::make_shared<TokensArgs>();
  auto* cmd = app.add_subcommand("tokens", "Show the tokens, 75-token chunks and weights both text encoders get");
  cmd->add_option("--model", args->model_dir, "Model directory")->required();
  cmd->add_flag("--json", args->json, "Machine-readable output");
  cmd->add_option("--steps", args->steps, "Sampler steps of the prompt-editing schedule (default: the model's)")
      ->check(CLI::Range(1, 10000));
  cmd->add_option(
         "--embedding-dir,--embeddings-dir", args->embedding_dirs,
         "Textual-inversion embeddings, as generate/run load them: each name shows as its vectors (repeatable)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("text", args->text, "Prompt text (A1111 syntax: (x:1.2), [x], BREAK, long prompts)")->required();
  return cmd;
}

namespace {

nlohmann::json report_json(const std::string& prompt, const sdxl_batch::TokenReport& r) {
  nlohmann::json out = {{"prompt", prompt}, {"encoders", nlohmann::json::array()}};
  for (const sdxl_batch::EncoderTokens& e : r.encoders) {
    nlohmann::json chunks = nlohmann::json::array();
    for (const sdxl_batch::TokenChunk& ch : e.chunks) {
      nlohmann::json tokens = nlohmann::json::array();
      for (const sdxl_batch::Token& t : ch.tokens)
        tokens.push_back({{"id", t.id}, {"text", t.text}, {"weight", t.weight}});
      chunks.push_back({{"tokens_used", ch.tokens_used}, {"tokens", tokens}, {"ids", ch.ids}});
    }
    out["encoders"].push_back({{"encoder", e.encoder},
                               {"tokenizer", e.tokenizer},
                               {"token_count", e.token_count},
                               {"chunk_count", e.chunks.size()},
                               {"chunks", chunks}});
  }
  nlohmann::json warn = nlohmann::json::array();
  for (const auto& w : r.warnings) warn.push_back({{"position", w.position}, {"message", w.message}});
  out["warnings"] = warn;
  out["context_chunks_max"] = r.context_chunks_max;
  return out;
}

nlohmann::json schedule_json(const sdxl_batch::TokenReport& r) {
  nlohmann::json spans = nlohmann::json::array();
  for (const sdxl_batch::PromptScheduleSpan& s : r.schedule)
    spans.push_back({{"first_step", s.first_step}, {"last_step", s.last_step}, {"text", s.text}});
  return {{"steps", r.schedule_steps}, {"spans", spans}};
}

// The distinct texts of a schedule, in order of first use.
std::vector<std::string> schedule_texts(const sdxl_batch::TokenReport& r) {
  std::vector<std::string> texts;
  for (const sdxl_batch::PromptScheduleSpan& s : r.schedule)
    if (std::find(texts.begin(), texts.end(), s.text) == texts.end()) texts.push_back(s.text);
  return texts;
}

void print_schedule(const sdxl_batch::TokenReport& r) {
  std::cout << "prompt editing over " << r.schedule_steps << " steps:\n";
  for (const sdxl_batch::PromptScheduleSpan& s : r.schedule) {
    std::cout << "  step" << (s.first_step == s.last_step ? " " + std::to_string(s.first_step)
                                                            : "s " + std::to_string(s.first_step) + "-" +
                                                                  std::to_string(s.last_step))
              << ": " << nlohmann::json(s.text).dump() << "\n";
  }
}

void print_text(const sdxl_batch::TokenReport& r) {
  for (const sdxl_batch::EncoderTokens& e : r.encoders) {
    std::cout << e.tokenizer << ": " << e.token_count << " tokens in " << e.chunks.size() << " chunk(s) of 75\n";
    int c = 0;
    for (const sdxl_batch::TokenChunk& ch : e.chunks) {
      std::cout << "  chunk " << c++ << " (" << ch.tokens_used << " tokens): ";
      for (const sdxl_batch::Token& t : ch.tokens) {
        std::cout << t.text;
        if (t.weight != 1.0) {
          std::ostringstream ws;
          ws << std::setprecision(3) << t.weight;
          std::cout << "(" << ws.str() << ")";
        }
        std::cout << " ";
      }
      std::cout << "\n";
    }
  }
  for (const auto& w : r.warnings) std::cout << "warning: character " << w.position << ": " << w.message << "\n";
  if (!r.encoders.empty() && static_cast<int>(r.encoders[0].chunks.size()) > r.context_chunks_max)
    std::cout << "warning: more chunks than the model's limit of " << r.context_chunks_max << "\n";
}

}  // namespace

int run_tokens(const TokensArgs& a) {
  const sdxl_batch::Session session({.model_dir = a.model_dir});
  const sdxl_batch::TokenReport r = session.tokens(a.text, a.embedding_dirs, a.steps);
  if (r.schedule.empty()) {
    if (a.json)
      std::cout << report_json(a.text, r).dump(2) << "\n";
    else
      print_text(r);
    return 0;
  }
  // An edited prompt: the schedule, then each text as an ordinary prompt.
  nlohmann::json out = {{"prompt", a.text}, {"schedule", schedule_json(r)}, {"texts", nlohmann::json::array()}};
  if (!a.json) print_schedule(r);
  for (const std::string& text : schedule_texts(r)) {
    const sdxl_batch::TokenReport t = session.tokens(text, a.embedding_dirs, a.steps);
    if (a.json) {
      out["texts"].push_back(report_json(text, t));
      continue;
    }
    std::cout << "\n" << nlohmann::json(text).dump() << ":\n";
    print_text(t);
  }
  if (a.json) std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace sdxl::cli
