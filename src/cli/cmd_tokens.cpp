// `sdxl-batch tokens`: show how both SDXL tokenizers split a prompt, so a user
// can check token counts (77 per chunk) before a night's run.
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "sdxl/clip_tokenizer.h"
#include "sdxl/model_config.h"

namespace sdxl::cli {

struct TokensArgs {
  std::string model_dir, text;
  bool json = false;
};

CLI::App* add_tokens(CLI::App& app, std::shared_ptr<TokensArgs>& args) {
  args = std::make_shared<TokensArgs>();
  auto* cmd = app.add_subcommand("tokens", "Print the token ids both text encoders get for a prompt");
  cmd->add_option("--model", args->model_dir, "Model directory")->required();
  cmd->add_flag("--json", args->json, "Machine-readable output");
  cmd->add_option("text", args->text, "Prompt text")->required();
  return cmd;
}

int run_tokens(const TokensArgs& a) {
  const ModelConfig mc = load_model_config(a.model_dir);
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < mc.text_encoders.size(); ++i) {
    const auto& te = mc.text_encoders[i];
    const ClipTokenizer tok = ClipTokenizer::from_dir(mc.path_of(te.tokenizer), te.pad_token);
    const std::vector<int32_t> ids = tok.encode(a.text);
    nlohmann::json toks = nlohmann::json::array();
    for (int32_t id : ids) toks.push_back(tok.token_text(id));
    const int kept = std::min<int>(static_cast<int>(ids.size()), ClipTokenizer::kMaxLength - 2);
    out.push_back({{"encoder", te.file}, {"tokenizer", te.tokenizer}, {"count", ids.size()},
                   {"truncated", ids.size() > static_cast<size_t>(kept)}, {"ids", ids}, {"tokens", toks},
                   {"padded_ids", tok.encode_padded(a.text)}});
  }
  if (a.json) {
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  for (const auto& e : out) {
    std::cout << e["tokenizer"].get<std::string>() << ": " << e["count"].get<size_t>() << " tokens"
              << (e["truncated"].get<bool>() ? " (over 75: the rest is cut off)" : "") << "\n  ";
    for (size_t k = 0; k < e["ids"].size(); ++k)
      std::cout << e["ids"][k].get<int>() << ":" << e["tokens"][k].get<std::string>() << " ";
    std::cout << "\n";
  }
  return 0;
}

}  // namespace sdxl::cli
