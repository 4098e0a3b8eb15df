// `sdxl-batch tokens`: how both SDXL tokenizers read a prompt under A1111's
// rules — token count, 75-token chunks, ids and emphasis weights, syntax
// warnings — so a user can check a prompt before a night's run.
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "lora/embedding_files.h"
#include "text/clip_tokenizer.h"
#include "model/model_config.h"
#include "text/prompt_chunks.h"

namespace sdxl::cli {

struct TokensArgs {
  std::string model_dir, text;
  std::vector<std::string> embedding_dirs;
  bool json = false;
};

CLI::App* add_tokens(CLI::App& app, std::shared_ptr<TokensArgs>& args) {
  args = std::make_shared<TokensArgs>();
  auto* cmd = app.add_subcommand("tokens", "Show the tokens, 75-token chunks and weights both text encoders get");
  cmd->add_option("--model", args->model_dir, "Model directory")->required();
  cmd->add_flag("--json", args->json, "Machine-readable output");
  cmd->add_option("--embedding-dir,--embeddings-dir", args->embedding_dirs,
                  "Textual-inversion embeddings, as generate/run load them: each name shows as its vectors (repeatable)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("text", args->text, "Prompt text (A1111 syntax: (x:1.2), [x], BREAK, long prompts)")->required();
  return cmd;
}

int run_tokens(const TokensArgs& a) {
  const ModelConfig mc = load_model_config(a.model_dir);
  nlohmann::json out = {{"prompt", a.text}, {"encoders", nlohmann::json::array()}};
  std::vector<PromptWarning> warnings;
  const std::vector<EmbeddingFile> embeddings =
      scan_embedding_files(std::vector<std::filesystem::path>(a.embedding_dirs.begin(), a.embedding_dirs.end()));
  for (size_t i = 0; i < mc.text_encoders.size(); ++i) {
    const auto& te = mc.text_encoders[i];
    ClipTokenizer tok = ClipTokenizer::from_dir(mc.path_of(te.tokenizer), te.pad_token);
    add_embedding_tokens(tok, embeddings, static_cast<std::int32_t>(tok.vocab_size()));
    const TokenizedPrompt tp = tokenize_prompt_counted(tok, a.text, i == 0 ? &warnings : nullptr);
    nlohmann::json chunks = nlohmann::json::array();
    for (size_t c = 0; c < tp.chunks.size(); ++c) {
      const PromptChunk& ch = tp.chunks[c];
      nlohmann::json tokens = nlohmann::json::array();
      for (size_t k = 1; k <= tp.tokens_used[c]; ++k)  // skip bos; padding after the used tokens
        tokens.push_back({{"id", ch.ids[k]}, {"text", tok.token_text(static_cast<int32_t>(ch.ids[k]))},
                          {"weight", ch.multipliers[k]}});
      chunks.push_back({{"tokens_used", tp.tokens_used[c]}, {"tokens", tokens}, {"ids", ch.ids}});
    }
    out["encoders"].push_back({{"encoder", te.file}, {"tokenizer", te.tokenizer}, {"token_count", tp.token_count},
                               {"chunk_count", tp.chunks.size()}, {"chunks", chunks}});
  }
  nlohmann::json warn = nlohmann::json::array();
  for (const auto& w : warnings) warn.push_back({{"position", w.position}, {"message", w.message}});
  out["warnings"] = warn;
  out["context_chunks_max"] = mc.limits.context_chunks_max;
  if (a.json) {
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  for (const auto& e : out["encoders"]) {
    std::cout << e["tokenizer"].get<std::string>() << ": " << e["token_count"].get<size_t>() << " tokens in "
              << e["chunk_count"].get<size_t>() << " chunk(s) of 75\n";
    int c = 0;
    for (const auto& ch : e["chunks"]) {
      std::cout << "  chunk " << c++ << " (" << ch["tokens_used"].get<size_t>() << " tokens): ";
      for (const auto& t : ch["tokens"]) {
        std::cout << t["text"].get<std::string>();
        const double w = t["weight"].get<double>();
        if (w != 1.0) {
          std::ostringstream ws;
          ws << std::setprecision(3) << w;
          std::cout << "(" << ws.str() << ")";
        }
        std::cout << " ";
      }
      std::cout << "\n";
    }
  }
  for (const auto& w : out["warnings"])
    std::cout << "warning: character " << w["position"].get<size_t>() << ": " << w["message"].get<std::string>() << "\n";
  if (out["encoders"][0]["chunk_count"].get<int>() > mc.limits.context_chunks_max)
    std::cout << "warning: more chunks than the model's limit of " << mc.limits.context_chunks_max << "\n";
  return 0;
}

}  // namespace sdxl::cli
