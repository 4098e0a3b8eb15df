// The checks of a batch file that need the model folder or read other files:
// what `validate` and `run` both check before any image is made, so that a
// file `validate` passes does not fail in `run` on its inputs. batch/ checks
// the schema; this layer answers batch's InputChecks (folders of a kind, PNG
// headers, sampler names) and adds the model's limits: sizes, clip skip,
// folders that fit the model, and prompts against the model's token chunks
// (textual-inversion embeddings counted as their vectors). torch-free.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "batch/batch_file.h"
#include "model/model_config.h"
#include "model/task_size.h"

namespace sdxl {

// The model's generation defaults as the fallback of a batch file.
GenerationParams defaults_of(const ModelConfig& mc);

// Validates sampler + schedule (throws UsageError listing the valid names) and
// rewrites them to their canonical A1111 spelling: "dpm++ 2m karras" ->
// sampler "DPM++ 2M", schedule "Karras".
void canonicalize_sampler(GenerationParams& p);

// batch's InputChecks answered from the files: a folder's model.json read as
// its kind, a PNG read and decoded whole by the run's reader (a truncated or
// corrupt image is refused now, not when its task runs; each file decoded once
// per check), the sampler names of sampling/.
class FileInputChecks final : public InputChecks {
 public:
  std::string folder_problem(const std::string& kind, const std::string& dir) override;
  std::string png_size(const std::string& path, int& width, int& height) override;
  void canonicalize_sampler(GenerationParams& p) override;
  std::string timesteps_problem(const GenerationParams& p) override;
  std::string mask_problem(const std::string& path) override;
  std::string region_mask_problem(const std::string& path) override;
  std::string folder_weights_sha256(const std::string& kind, const std::string& dir) override;
  // FFmpeg (the `ffmpeg` program) decodes the file's first audio stream for a few seconds.
  std::string audio_problem(const std::string& path) override;

 private:
  struct PngResult {
    std::string why;
    int width = 0, height = 0;
  };
  std::map<std::string, PngResult> pngs_;  // path -> what decoding it said
};

struct BatchCheckInputs {
  GenerationParams fallback;                         // values the file does not set
  std::vector<std::filesystem::path> wildcard_dirs;  // --wildcards-dir, before the file's "wildcards_dir"
  std::vector<std::filesystem::path> embedding_dirs; // --embedding-dir, before the file's "embeddings_dir"
  std::vector<std::filesystem::path> lora_dirs;      // --lora-dir: where prompt tags <lora:NAME:W> find NAME
};

struct CheckedBatch {
  BatchFile file;
  std::vector<BatchProblem> problems;  // with lines; empty when the file is valid
  // Sizes outside the range the model was checked for (a warning, not a problem):
  // "/tasks/N: note".
  std::vector<std::string> notes;
};

// Reads and checks a batch file: the schema and its files, then, with `model`,
// the model's limits. Every problem is collected (the file is not refused here).
CheckedBatch check_batch_file(const std::filesystem::path& path, const ModelConfig* model,
                              const BatchCheckInputs& inputs);
// The same for a batch file's text; `origin` names it in problems, and
// relative paths in it are relative to origin's folder.
CheckedBatch check_batch_text(const std::string& text, const std::filesystem::path& origin, const ModelConfig* model,
                              const BatchCheckInputs& inputs);

// run --skip-invalid: the file without the tasks that have problems (each
// returned in `invalid` as its id, or pointer, and its errors). A problem
// outside /tasks/N (the file's structure) refuses the whole file: UsageError.
BatchFile keep_valid_tasks(CheckedBatch checked, std::vector<std::pair<std::string, std::string>>& invalid);

// Every problem of a batch file, with lines, as check_batch_file finds them
// with the model's defaults as the fallback. Empty when the file is valid.
std::vector<BatchProblem> validate_batch_file(const std::filesystem::path& path, const ModelConfig* model,
                                              const std::vector<std::filesystem::path>& wildcard_dirs = {},
                                              const std::vector<std::filesystem::path>& embedding_dirs = {});

}  // namespace sdxl
