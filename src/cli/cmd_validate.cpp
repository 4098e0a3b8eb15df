// `sdxl-batch validate`: every problem of a batch file, with its JSON pointer,
// line and a hint; exit 2 when there is one. With --model, also the model's
// size limits; with --expand, the prompt of every image after characters,
// styles and wildcards. Loads no module.
#include <iostream>

#include "cli/commands.h"
#include "batch/batch_file.h"
#include "batch/story.h"
#include "check/batch_check.h"
#include "core/error.h"

namespace sdxl::cli {

struct ValidateArgs {
  std::string batch_file, model_dir;
  std::vector<std::string> wildcard_dirs, embedding_dirs;
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
  cmd->add_flag("--expand", args->expand,
                "Print every image's prompt and negative as the run will encode them (characters, style, wildcards)");
  return cmd;
}

namespace {

// One line per image: "ID #INDEX seed SEED: PROMPT", then its negative and the
// wildcard choices. Random seeds are drawn at run time, and so are the
// expansions that follow them: those tasks say so instead.
void print_expansions(const BatchFile& bf) {
  const WildcardLibrary lib(bf.wildcard_dirs);
  for (const BatchTask& task : bf.tasks) {
    const bool varies = prompt_has_wildcards(task.params);
    if (task.seed_random && varies && !task.expand_all) {
      std::cout << task.id << ": " << task.count << " image(s), random seed: each image's wildcards are drawn from "
                << "the seed the run draws (recorded in manifest.jsonl); template: " << task.params.prompt << "\n";
      continue;
    }
    for (int i = 0; i < task.count; ++i) {
      const std::int64_t seed = task.params.seed + i;
      const ImagePrompt ip = task_image_prompt(task, i, seed, lib);
      std::cout << task.id << " #" << i;
      if (!task.seed_random) std::cout << " seed " << seed;
      std::cout << ": " << ip.prompt << "\n";
      if (!ip.negative.empty()) std::cout << "    negative: " << ip.negative << "\n";
      if (!ip.choices.empty()) {
        std::cout << "    picked:";
        for (const auto& c : ip.choices) std::cout << " [" << c << "]";
        std::cout << "\n";
      }
    }
  }
}

}  // namespace

int run_validate(const ValidateArgs& a) {
  ModelConfig mc;
  const bool with_model = !a.model_dir.empty();
  if (with_model) mc = load_model_config(a.model_dir);
  const std::vector<std::filesystem::path> dirs(a.wildcard_dirs.begin(), a.wildcard_dirs.end());
  const std::vector<std::filesystem::path> emb(a.embedding_dirs.begin(), a.embedding_dirs.end());
  const BatchCheckInputs inputs{with_model ? defaults_of(mc) : GenerationParams{}, dirs, emb};
  const CheckedBatch checked = check_batch_file(a.batch_file, with_model ? &mc : nullptr, inputs);
  const std::vector<BatchProblem>& problems = checked.problems;
  if (problems.empty()) {
    if (a.expand) print_expansions(checked.file);
    std::cout << a.batch_file << ": valid\n";
    return 0;
  }
  std::cout << a.batch_file << ": " << problems.size() << " problem(s)\n";
  for (const auto& p : problems) {
    std::cout << "  " << a.batch_file << ":" << p.line << ": " << (p.pointer.empty() ? "/" : p.pointer) << ": "
              << p.message << "\n";
  }
  return static_cast<int>(ExitCode::kUsage);
}

}  // namespace sdxl::cli
