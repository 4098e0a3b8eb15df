// `sdxl-batch validate`: every problem of a batch file, with its JSON pointer,
// line and a hint; exit 2 when there is one. With --model, also the model's
// size limits; with --expand, the prompt of every image after characters,
// styles and wildcards. Loads no module. A client of the public API alone.
#include <sdxl_batch/sdxl_batch.h>

#include <iostream>

#include "cli/commands.h"

namespace sdxl::cli {

struct ValidateArgs {
  std::string batch_file, model_dir;
  std::vector<std::string> wildcard_dirs, embedding_dirs, lora_dirs;
  bool expand = false;
};

CLI::App* add_validate(CLI::App& app, std::shared_ptr<ValidateArgs>& args) {
  args = std::make_shared<ValidateArgs>();
  auto* cmd = app.add_subcommand("validate", "Check a batch file and list every problem (exit 2 if any)");
  cmd->add_option("batch", args->batch_file, "Batch file (JSON)")->required();
  cmd->add_option("--model", args->model_dir, "Also check sizes against this model's limits");
  cmd->add_option("--wildcards-dir", args->wildcard_dirs,
                  "Folder of __name__ wildcard files, searched before the batch's wildcards_dir (repeatable)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--embedding-dir,--embeddings-dir", args->embedding_dirs,
                  "Embeddings the run will load (as run --embedding-dir): with --model, their vectors count in the "
                  "prompt-length check (repeatable)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--lora-dir", args->lora_dirs,
                  "Where the run finds the LoRAs of prompt tags <lora:NAME:W> (as run --lora-dir): an unknown name "
                  "is a problem (repeatable)")
      ->check(CLI::ExistingDirectory);
  cmd->add_flag("--expand", args->expand,
                "Print every image's prompt and negative as the run will encode them (characters, style, wildcards)");
  return cmd;
}

namespace {

// One line per image: "ID #INDEX seed SEED: PROMPT", then its negative and the
// wildcard choices. Tasks whose prompts are drawn at run time say so instead.
void print_expansions(const std::vector<sdxl_batch::TaskExpansion>& tasks) {
  for (const sdxl_batch::TaskExpansion& task : tasks) {
    if (task.drawn_at_run_time) {
      std::cout << task.task_id << ": " << task.count << " image(s), random seed: each image's wildcards are drawn "
                << "from the seed the run draws (recorded in manifest.jsonl); template: " << task.prompt_template
                << "\n";
      continue;
    }
    for (const sdxl_batch::ImagePrompt& ip : task.images) {
      std::cout << task.task_id << " #" << ip.index;
      if (ip.seed) std::cout << " seed " << *ip.seed;
      std::cout << ": " << ip.prompt << "\n";
      if (!ip.negative.empty()) std::cout << "    negative: " << ip.negative << "\n";
      if (!ip.picked.empty()) {
        std::cout << "    picked:";
        for (const auto& c : ip.picked) std::cout << " [" << c << "]";
        std::cout << "\n";
      }
    }
  }
}

}  // namespace

int run_validate(const ValidateArgs& a) {
  sdxl_batch::CheckOptions options;
  options.wildcard_dirs = a.wildcard_dirs;
  options.embedding_dirs = a.embedding_dirs;
  options.lora_dirs = a.lora_dirs;
  options.expand = a.expand;
  const sdxl_batch::CheckReport report =
      a.model_dir.empty() ? sdxl_batch::check_batch_file(a.batch_file, options)
                          : sdxl_batch::Session({.model_dir = a.model_dir}).check_batch_file(a.batch_file, options);
  if (report.ok()) {
    print_expansions(report.expansions);
    std::cout << a.batch_file << ": valid\n";
    return 0;
  }
  std::cout << a.batch_file << ": " << report.problems.size() << " problem(s)\n";
  for (const auto& p : report.problems) {
    std::cout << "  " << a.batch_file << ":" << p.line << ": " << (p.pointer.empty() ? "/" : p.pointer) << ": "
              << p.message << "\n";
  }
  return static_cast<int>(sdxl_batch::ExitCode::kUsage);
}

}  // namespace sdxl::cli
