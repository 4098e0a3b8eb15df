// `sdxl-batch validate`: every problem of a batch file, with its JSON pointer,
// line and a hint; exit 2 when there is one. With --model, also the model's
// size limits. Loads no module.
#include <iostream>

#include "cli/commands.h"
#include "batch/batch_file.h"
#include "core/error.h"

namespace sdxl::cli {

struct ValidateArgs {
  std::string batch_file, model_dir;
};

CLI::App* add_validate(CLI::App& app, std::shared_ptr<ValidateArgs>& args) {
  args = std::make_shared<ValidateArgs>();
  auto* cmd = app.add_subcommand("validate", "Check a batch file and list every problem (exit 2 if any)");
  cmd->add_option("batch", args->batch_file, "Batch file (JSON)")->required();
  cmd->add_option("--model", args->model_dir, "Also check sizes against this model's limits");
  return cmd;
}

int run_validate(const ValidateArgs& a) {
  ModelConfig mc;
  const bool with_model = !a.model_dir.empty();
  if (with_model) mc = load_model_config(a.model_dir);
  const auto problems = validate_batch_file(a.batch_file, with_model ? &mc : nullptr);
  if (problems.empty()) {
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
