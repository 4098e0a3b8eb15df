// Batch files: a JSON list of scenes (tasks) with defaults, read and validated
// before any model is loaded. Every problem is reported with the JSON pointer of
// the value and a hint; parse_batch_file() throws UsageError listing them all.
// The schema is checked here; what needs the model or decodes files (folders
// of a kind, PNG sizes, sampler names) is asked of an InputChecks, which the
// check layer implements (check/batch_check.h). Depends on core only; torch-free.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "batch/generation_params.h"
#include "batch/lora_ref.h"

namespace sdxl {

struct VideoSpec;  // batch/video_spec.h

struct BatchTask {
  std::string id;
  GenerationParams params;  // seed is the first image's seed
  bool seed_random = false; // seed was -1: drawn at run time
  int count = 1;            // images; image i uses seed + i
  std::string priority = "mid";  // high | mid | low
  std::string deadline;          // "" or RFC 3339 time ("2026-12-01T06:00:00Z") or local "HH:MM"
  double timeout_s = 0;          // per image; 0: the run's --timeout
  // Story tools: params.prompt / negative_prompt hold the task's text joined
  // with its characters' and style's, possibly with wildcards
  // (batch/wildcards.h) that each image expands from its seed, or, with
  // expand_all, one image per combination (count is then their number).
  std::string source_prompt;             // the task's "prompt" as written
  std::vector<std::string> characters;   // names, in order
  std::string style;
  bool expand_all = false;
};

inline constexpr const char* kDefaultNameTemplate = "{id}-{index}-{seed}.png";

struct BatchFile {
  std::filesystem::path path;
  int version = 1;
  std::string model;       // optional model dir, relative to the batch file
  std::string output_dir;  // optional, relative to the batch file
  std::string name_template = kDefaultNameTemplate;  // output.template
  // "loras": {"NAME": {"path": FILE (relative to the batch file), "pin": bool}}:
  // names that tasks, defaults and prompt tags <lora:NAME:W> use.
  LoraRegistry lora_registry;
  // Where __name__ wildcards are looked up: --wildcards-dir folders, then the
  // file's "wildcards_dir" (relative to the batch file).
  std::vector<std::filesystem::path> wildcard_dirs;
  // "embeddings_dir" (relative to the batch file): textual-inversion
  // embeddings loaded with the model, after --embedding-dir's.
  std::vector<std::filesystem::path> embedding_dirs;
  // "pins": {"FOLDER": "SHA256"}: model folders (the model's, or any a task names) that must be the one
  // whose model.json has this sha256, every file as that model.json records it (check/folder_pins.h),
  // before anything loads. FOLDER absolute and normal; pointer: where the batch file pins it.
  struct FolderPin {
    std::string folder, sha256, pointer;
  };
  std::vector<FolderPin> pins;
  std::vector<BatchTask> tasks;
  // The "video" section (`sdxl-batch video`), when the file has one.
  std::shared_ptr<const VideoSpec> video;
};

struct BatchProblem {
  std::string pointer;  // JSON pointer, e.g. /tasks/2/steps
  std::string message;
  int line = 0;         // 1-based line of the value in the file, 0 if unknown
};

// What the parser asks of the layers above it. Each call returns "" when the
// value is fine, else why not; the parser adds the JSON pointer.
class InputChecks {
 public:
  virtual ~InputChecks() = default;
  // Whether folder `dir` reads as a `kind` folder ("vae", "controlnet", "ip_adapter", "upscaler", "detector").
  virtual std::string folder_problem(const std::string& kind, const std::string& dir) = 0;
  // The size of a PNG, or why it cannot be used (check/ decodes it whole, as the run will).
  virtual std::string png_size(const std::string& path, int& width, int& height) = 0;
  // Sampler and schedule rewritten to their canonical names; throws UsageError
  // listing the valid names.
  virtual void canonicalize_sampler(GenerationParams& p) = 0;
  // An inpainting mask PNG: "" when it marks something to repaint, else why
  // not (unreadable, or no pixel at 0.5 or above: nothing to repaint).
  virtual std::string mask_problem(const std::string& path) = 0;
  // A region mask PNG: "" when it can be read and is not all black, else why not.
  virtual std::string region_mask_problem(const std::string& /*path*/) { return ""; }
  // The sha256 of the weights of a `kind` folder that folder_problem passed, as its model.json
  // records it ("" when not recorded): what a resume compares.
  virtual std::string folder_weights_sha256(const std::string& /*kind*/, const std::string& /*dir*/) { return ""; }
  // Why a task's timestep list cannot be used with its (canonical) sampler and schedule ("" when it
  // can, or when not checked).
  virtual std::string timesteps_problem(const GenerationParams& /*p*/) { return ""; }
  // Why an audio file cannot be decoded ("" when it can, or when not checked).
  virtual std::string audio_problem(const std::string& /*path*/) { return ""; }
};

// Line (1-based) of every value of a JSON text by its JSON pointer ("" = root).
// Best effort on malformed text: what was scanned before the error is kept.
std::map<std::string, int> json_pointer_lines(const std::string& text);
// Sets each problem's line (of its pointer, or of the nearest ancestor present).
void attach_lines(const std::string& text, std::vector<BatchProblem>& problems);
// "batch file 'PATH' has N problem(s):" and one line per problem.
std::string describe_problems(const std::filesystem::path& path, const std::vector<BatchProblem>& problems);

// An inpainting mask of mask_w x mask_h (0 x 0 = not known) against the rest
// of `p`: it needs an init image, no hires fix, and the task's aspect ratio
// within a pixel (it is resized, never cropped). "" when fine, else why not
// (a sentence to follow the mask's name). Batch files and `generate` share it.
std::string mask_settings_problem(const GenerationParams& p, int mask_w, int mask_h);

// A denoising strength that leaves no sampler step: img2img and inpainting run int(steps *
// strength) of `steps` (sampling's plan_apply_strength, diffusers' rule), so that must be at least 1,
// and a strength of 0 (or NaN) runs none. "" when fine, else why not (a sentence after the key's pointer).
std::string strength_steps_problem(int steps, double strength);

// An init image of image_w x image_h for a task of width x height: they must be equal (img2img never
// resizes). "" when fine, else why not (a sentence to follow the image's name). Batch files,
// `generate` and the generator share it.
std::string init_size_problem(int image_w, int image_h, int width, int height);

// The text of a batch file: a regular file of at most 64 MiB (UsageError otherwise).
inline constexpr std::uint64_t kMaxBatchFileBytes = 64ull << 20;
std::string read_batch_text(const std::filesystem::path& path);

// Parses and validates; `fallback` supplies defaults not set in the file
// (the model's defaults). Throws UsageError with every problem listed.
// `wildcard_dirs`: --wildcards-dir folders, searched before the file's "wildcards_dir".
// Without `checks`, folders, PNGs and sampler names are taken as written and
// an init image's size does not set the task's.
BatchFile parse_batch_file(const std::filesystem::path& path, const GenerationParams& fallback,
                           const std::vector<std::filesystem::path>& wildcard_dirs = {},
                           InputChecks* checks = nullptr);
BatchFile parse_batch_text(const std::string& text, const std::filesystem::path& origin,
                           const GenerationParams& fallback, std::vector<BatchProblem>* problems,
                           const std::vector<std::filesystem::path>& wildcard_dirs = {},
                           InputChecks* checks = nullptr);

// A "detailer" list given outside a batch file (`sdxl-batch generate`'s --detailer flags, as JSON:
// [{"detector": DIR, "confidence": 0.3, ...}]) read by the batch file's own rules and messages: each
// unit with ADetailer's defaults for what it leaves out, relative detector folders from `base_dir`,
// the text rule of batch_strings.h. Problems (pointers "/detailer/K/KEY") are appended, never thrown.
std::vector<DetailerUse> read_detailer_list(const nlohmann::json& list, const std::filesystem::path& base_dir,
                                            InputChecks* checks, std::vector<BatchProblem>& problems);

// Checks a file-name template: fields {id} {index} {seed} {date} {steps}
// {cfg} {width} {height}, ends in .png, relative, no "..". "" when fine, else why.
std::string check_name_template(const std::string& tmpl);

// Output file name (relative to the output folder) of image `index` of a task.
// Characters outside [A-Za-z0-9._-] in the id become '_'; `date` is YYYY-MM-DD.
std::string output_file_name(const BatchTask& task, int index, std::int64_t seed,
                             const std::string& tmpl = kDefaultNameTemplate, const std::string& date = "");

// Whether task number `position` belongs to shard K of N (round robin by position).
inline bool in_shard(size_t position, int k, int n) { return static_cast<int>(position % static_cast<size_t>(n)) == k; }

// A task deadline as Unix time: RFC 3339 ("2026-12-01T06:00:00Z", "...+01:00")
// or a local wall-clock time "HH:MM" (the next such time after `now_unix`).
// Throws UsageError naming the value.
double parse_deadline_unix(const std::string& text, double now_unix);

}  // namespace sdxl
