// sdxl_batch: the library's public API. SDXL images from batch files or from
// tasks built in code, on a model folder written by scripts/export_sdxl.py.
//
//   sdxl_batch::Session s({.model_dir = "models/tiny"});   // reads model.json, loads no weights
//   s.submit({.id = "harbour", .prompt = "a misty harbour", .seed = 7, .width = 256, .height = 256});
//   sdxl_batch::RunResult r = s.run({.out_dir = "out"}, &sink);  // PNGs + manifest + report; a rerun resumes
//
// Only standard-library types appear here; the header includes no other
// header of the project and no torch header. Link sdxl_api (CMake target).
//
// Errors: every function that can fail throws sdxl_batch::Error or one of its
// subclasses below, each carrying the exit code the CLI returns for it (0 all
// done, 1 fatal: model or environment, 2 bad arguments or batch file, 3
// finished with failed or unstarted images, 4 another run holds the output
// folder). No other exception type leaves the library, except std::bad_alloc.
//
// Threading: a Session is used by one thread at a time (its methods are not
// synchronised). run() blocks; while it runs, the EventSink is called from the
// run's own threads, one call at a time, and RunOptions::stop may be set from
// any thread or a signal handler. Free functions are safe to call from any
// thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace sdxl_batch {

// ---------------------------------------------------------------------------
// Errors

// The process exit code an error or a run's outcome maps to.
enum class ExitCode : int { kOk = 0, kFatal = 1, kUsage = 2, kTasksFailed = 3, kLocked = 4 };

// The base of every error the library throws. what() names the file, flag,
// folder or JSON pointer at fault.
class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& what) : std::runtime_error(what), code_(code) {}
  ExitCode code() const noexcept { return code_; }
  int exit_code() const noexcept { return static_cast<int>(code_); }

 private:
  ExitCode code_;
};

// A bad option value, task or batch file (exit 2).
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& what) : Error(ExitCode::kUsage, what) {}
};

// One problem of a batch file or of submitted tasks. For tasks submitted in
// code, `file` is empty, `line` 0 and `pointer` "/tasks/N/..." where N is the
// task's position among the tasks submitted.
struct Problem {
  std::string file{};
  int line = 0;           // 1-based, 0 when unknown
  std::string pointer{};  // JSON pointer of the value, "" = the whole file
  std::string message{};
};

// Input that cannot run (exit 2): every problem found, not only the first.
class InvalidInputError : public UsageError {
 public:
  InvalidInputError(const std::string& what, std::vector<Problem> problems)
      : UsageError(what), problems_(std::move(problems)) {}
  const std::vector<Problem>& problems() const noexcept { return problems_; }

 private:
  std::vector<Problem> problems_{};
};

// A model folder or module that cannot be read, verified or loaded (exit 1).
class ModelError : public Error {
 public:
  explicit ModelError(const std::string& what) : Error(ExitCode::kFatal, what) {}
};

// Outputs that cannot be written: disk full, permissions (exit 1).
class IoError : public Error {
 public:
  explicit IoError(const std::string& what) : Error(ExitCode::kFatal, what) {}
};

// Another run holds the output folder's lock or the lock file (exit 4).
class LockedError : public Error {
 public:
  explicit LockedError(const std::string& what) : Error(ExitCode::kLocked, what) {}
};

// ---------------------------------------------------------------------------
// Values as users type them (the CLI's flags, batch files). Each throws
// UsageError naming the text.

// "90", "90s", "30m", "6h", "1h30m" -> seconds.
double parse_duration_seconds(const std::string& text);
// "24GiB", "12G", "800MiB", "65536" -> bytes (G and GiB are both 2^30).
std::uint64_t parse_size_bytes(const std::string& text);
// "1080x1920" -> {1080, 1920} (a frame size, WxH, as batch files give it).
std::pair<int, int> parse_frame_size(const std::string& text);
// "K/N" with 0 <= K < N -> {K, N}; "auto" or "auto/N": K (and N) from the
// scheduler's environment, a Slurm job array (SLURM_ARRAY_TASK_ID with
// SLURM_ARRAY_TASK_COUNT or _MIN/_MAX) or a Kubernetes Indexed Job
// (JOB_COMPLETION_INDEX, with N from auto/N); UsageError when neither is there
// or they disagree (docs/unattended-runs.md#several-machines-shards).
std::pair<int, int> parse_shard(const std::string& text);

// ---------------------------------------------------------------------------
// The task keys of a batch file, one entry each (the library's table; docs/batch-files.md#task-keys
// prints it): a client that takes the same settings (a flag per key, a form) reads names, ranges and
// help here instead of copying them.
struct TaskKeyInfo {
  std::string name;           // the JSON key ("steps")
  std::string type;           // integer, number, string, path, object, array, duration
  bool in_defaults = false;   // allowed in "defaults" (else in a task only)
  double lo = 0, hi = 0;      // an integer's or number's range
  int multiple_of = 0;        // an integer's step (sizes: 8), 0 none
  std::vector<std::string> choices;  // a string's values (empty: any)
  std::string range;          // lo..hi or the choices as text ("" none)
  std::string default_text;   // the default ("the model's (28)")
  std::string a1111;          // the A1111 field it writes into a PNG's parameters ("" none)
  std::string manifest;       // its JSON pointer in a manifest line's "params" ("" not recorded)
  std::string split;          // images that differ in it share a UNet call: "no", "value", "presence", "parts"
  bool remakes = true;        // a change makes the image again on a rerun (count, priority, notes...: no)
  std::string generate_flag;  // `sdxl-batch generate`'s flag, as CLI11 names it ("--steps"; "" none)
  std::string summary;        // what it does, one line
};
// Every key, in the order the library reads a task.
std::vector<TaskKeyInfo> task_keys();
// The key named `name`; UsageError when there is none.
TaskKeyInfo task_key(const std::string& name);

// The library's name and version ("sdxl-batch", "0.1.0").
std::string program_name();
std::string version();

// ---------------------------------------------------------------------------
// The model

// How a model folder is opened and, when a run needs it, loaded. Every field
// of the CLI's model flags (--model, --device, ..., --verify-model) is here.
struct ModelOptions {
  std::string model_dir{};            // the folder holding model.json
  std::string device = "cpu";         // cpu | cuda | cuda:N
  std::string dtype{};                // "" = the model's; fp32 | fp16 | bf16
  std::string precision = "default";  // UNet: default | fp8 (export_sdxl.py --fp8)
  int threads = 0;                    // CPU threads for torch, 0 = torch's default
  bool jit_optimize = false;          // TorchScript fusion (fp16 results then depend on the call count)
  bool cudnn_benchmark = false;
  bool deterministic_cudnn = true;
  std::string cuda_allocator = "expandable";  // expandable | default
  bool cuda_graphs = true;
  std::string unet_backend = "auto";  // auto | torchscript | aoti
  std::string vae_backend = "auto";   // auto | torchscript | aoti
  std::string vae_tiling = "auto";    // auto | always | never
  std::string vae_dtype = "auto";     // auto | fp32 | fp16 | bf16
  std::size_t vae_cache = 2, controlnet_cache = 2, ip_adapter_cache = 2, ip_image_cache = 64;
  std::size_t upscaler_cache = 1;  // upscaler folders of the tasks' frames ("upscale") that stay loaded
  std::size_t detector_cache = 2;  // detector folders of the tasks' detailers ("detailer") that stay loaded
  std::vector<std::string> lora_dirs{};       // where <lora:NAME:W> tags find NAME.safetensors
  std::uint64_t lora_cache_bytes = 0;         // 0 = 30% of the memory free after the weights
  bool lora_strict = false;                   // unmapped LoRA keys are an error, not a warning
  std::vector<std::string> embedding_dirs{};  // textual-inversion embeddings, used by file name
  std::string vae_dir{};                      // a VAE folder for images that name none ("" = the model's)
  bool verify = false;                        // check every file's sha256 (model.json) when opening
};

// What model.json says of the model.
struct ModelInfo {
  std::string dir{}, name{}, dtype{};
  std::string unet_precision{};  // "" = the model dtype, "fp8"
  int default_steps = 0, default_width = 0, default_height = 0;
  double default_cfg = 0;
  int batch_max = 1;           // images per UNet call at most
  int context_chunks_max = 1;  // 75-token chunks a prompt may use
};

// The tokens both text encoders get for a prompt (A1111's rules).
struct Token {
  std::int64_t id = 0;
  std::string text{};
  double weight = 1.0;  // emphasis
};
struct TokenChunk {
  std::size_t tokens_used = 0;      // prompt tokens in the chunk (0..75)
  std::vector<Token> tokens{};      // the used tokens, without bos and padding
  std::vector<std::int64_t> ids{};  // all 77 ids: bos, tokens, eos, padding
};
struct EncoderTokens {
  std::string encoder{}, tokenizer{};  // model.json's file names
  std::size_t token_count = 0;         // A1111's count
  std::vector<TokenChunk> chunks{};
};
struct PromptWarning {
  std::size_t position = 0;  // character offset in the prompt
  std::string message{};
};
// A1111 prompt editing and alternation: the text sampler steps first..last
// (from 1) use, as A1111's reconstruct_cond_batch picks it.
struct PromptScheduleSpan {
  int first_step = 1, last_step = 1;
  std::string text{};
};
struct TokenReport {
  std::vector<EncoderTokens> encoders{};  // of the text of the first step (the prompt itself without edits)
  std::vector<PromptWarning> warnings{};
  int context_chunks_max = 1;
  int schedule_steps = 0;                     // the steps the schedule is for
  std::vector<PromptScheduleSpan> schedule{};  // empty when the prompt has no edits
};

// ---------------------------------------------------------------------------
// Checking a batch file (what `validate` and `run` both do before any image)

struct CheckOptions {
  std::vector<std::string> wildcard_dirs{};   // searched before the file's "wildcards_dir"
  std::vector<std::string> embedding_dirs{};  // counted in the prompt-length check (with a model)
  std::vector<std::string> lora_dirs{};       // where prompt tags <lora:NAME:W> find NAME (as the run's)
  int clip_skip = 0;                          // for tasks that set none (0: none)
  std::string vae_dir{};                      // for tasks that name none ("" = the model's)
  bool expand = false;                        // fill CheckReport::expansions
};

// One image's prompt after characters, styles and wildcards.
struct ImagePrompt {
  int index = 0;
  std::optional<std::int64_t> seed{};  // empty: a random seed, drawn at run time
  std::string prompt{}, negative{};
  std::vector<std::string> picked{};  // what the wildcards chose
};
struct TaskExpansion {
  std::string task_id{};
  int count = 0;
  // A random-seed task with wildcards: its images' prompts are drawn at run
  // time from the seed; `prompt_template` holds the prompt before expansion.
  bool drawn_at_run_time = false;
  std::string prompt_template{};
  std::vector<ImagePrompt> images{};  // empty when drawn_at_run_time
};

struct CheckReport {
  std::vector<Problem> problems{};          // empty when the file can run
  std::vector<std::string> notes{};         // warnings: "/tasks/N: size outside the range the export checked"
  std::vector<TaskExpansion> expansions{};  // with CheckOptions::expand and no problems
  bool ok() const { return problems.empty(); }
};

// Checks a batch file without a model: the schema, the files it names (PNGs
// decoded whole), sampler names, the LoRAs of prompt tags. Problems are returned, not thrown; throws UsageError when the
// file cannot be read.
CheckReport check_batch_file(const std::string& path, const CheckOptions& options = {});

// The model folder a batch file names ("model", relative to the file), "" if none.
// Throws UsageError when the file cannot be read.
std::string batch_file_model_dir(const std::string& path);

// ---------------------------------------------------------------------------
// Tasks built in code

struct Lora {
  std::string path{};  // a .safetensors file
  double weight = 1.0;
};

// One task: `count` images with seeds seed, seed + 1, ... Unset values come
// from the model's defaults. The same rules as a batch file's task apply
// (docs/batch-files.md): ids are unique and name the files.
struct Task {
  std::string id{};
  std::string prompt{};    // A1111 syntax, may hold <lora:NAME:W> tags
  std::string negative{};  // "" = SDXL's zero negative conditioning
  std::int64_t seed = -1;  // -1: a random seed, recorded in the manifest (a rerun reuses it)
  int count = 1;
  std::optional<int> steps{};
  std::optional<double> cfg{};
  std::optional<int> width{}, height{};
  std::string sampler = "Euler";       // A1111 name, e.g. "DPM++ 2M"
  std::string schedule = "Automatic";  // Automatic | Karras | Exponential | SGM Uniform
  std::vector<Lora> loras{};
  std::string priority = "mid";  // high | mid | low
};

// "FILE[:WEIGHT]" (the CLI's --lora; the weight is the text after the last ':'
// when it parses as a number, else 1). Throws UsageError for an empty FILE.
Lora parse_lora(const std::string& text);

// ---------------------------------------------------------------------------
// One image, written where the caller says (`sdxl-batch generate`)

struct ControlNet {
  std::string model{};  // a ControlNet folder (scripts/export_sdxl.py --controlnet)
  std::string image{};  // its control image (PNG), resized to the image's size
  double strength = 1.0, start = 0.0, end = 1.0;  // scale; the fraction of the steps it acts in
  std::string type{};      // a Union ControlNet's control type of the image ("openpose"); "" for a plain one
  bool same_call = false;  // one call with the ControlNet before (the same Union ControlNet's next image)
};
struct IpAdapter {
  std::string model{};                // an IP-Adapter folder ("" = none)
  std::vector<std::string> images{};  // reference PNGs, their tokens joined in order
  double scale = 1.0;
};
// A region of the panel (docs/story-tools.md#regions): a box in fractions of the panel [x0, y0, x1,
// y1] or a mask PNG (white = inside, the panel's aspect ratio), with its own prompt, negative ("" = the
// image's) and weight; the image's own prompt weighs `region_base` inside regions.
struct Region {
  std::vector<double> box{};  // 4 values, or empty with `mask`
  std::string mask{};
  std::string prompt{};
  std::string negative{};
  double weight = 1.0;
};
// "x0,y0,x1,y1:PROMPT" (the CLI's --region) and "FILE:PROMPT" (--region-mask); UsageError naming the
// text when it is not one.
Region parse_region(const std::string& text);
Region parse_region_mask(const std::string& text);

struct Hires {
  double scale = 0;                   // 0 = no second pass
  std::string upscaler = "Latent";    // A1111's hires upscaler names, or an upscaler folder
  int steps = 0;                      // 0 = the task's steps
  double denoise = 0.7;
};

// The final upscale of the image to its frame (docs/upscaling.md): an upscaler folder
// (scripts/export_sdxl.py --upscaler) or "Lanczos", then by a factor or to a frame with a fit.
struct Upscale {
  std::string model{};  // "" = none
  double scale = 0;     // > 0: by this factor; else to width x height
  int width = 0, height = 0;
  std::string fit = "stretch";  // with a size: stretch | crop | pad
};

// One detailer unit (docs/detailer.md; a batch file's "detailer" entry, ADetailer's settings and
// defaults): after the decode, the detector folder's regions are redrawn one by one ("only masked"
// inpaintings, seed + the region's index), before the final upscale. Checked as a batch file's
// entry; each value's problem names its flag (--detailer, --detailer-confidence, ...).
struct Detailer {
  std::string detector{};            // a detector folder (scripts/export_sdxl.py --detector)
  std::string prompt{}, negative{};  // "" = the image's; "[PROMPT]" stands for it
  double confidence = 0.3;           // detections scoring above it, in (0, 1]
  int dilate = 4;                    // px of dilation (negative: erosion) of each mask, -128..128
  int blur = 4;                      // the inpainting's mask blur, 0..64
  double denoise = 0.4;              // the inpainting's strength, in (0, 1]
  int padding = 32;                  // "only masked" padding, 0..256
  int max = 0;                       // only the k largest regions (0 = all)
  std::optional<int> steps{};        // the regions' steps, 1..200 (empty = the image's)
};

// A task's settings (its id, count and priority are not used) and what one
// image made outside a run takes. Flag names in error messages are the CLI's.
struct ImageRequest {
  Task task{};
  std::optional<double> guidance_rescale{};  // diffusers' guidance_rescale, 0..1 (empty = the model's default)
  // diffusers' timesteps=: the UNet's timesteps, strictly decreasing; the steps are their count
  // (a task's steps must then equal it). Empty = the sampler's spacing.
  std::vector<int> timesteps{};
  double eta = 0.3;  // TCD's eta (gamma), 0..1
  int clip_skip = 0;
  std::string init_image{};  // img2img: its size unless the task sets width/height, which must then match
  double strength = 0.75;
  // Inpainting (with init_image): the mask PNG (white = repaint; "" = none), its
  // Gaussian blur radius, "whole" or "masked" (only the padded box around it).
  std::string mask{};
  int mask_blur = 4;
  std::string inpaint_area = "whole";
  int inpaint_padding = 32;
  Hires hires{};
  std::vector<ControlNet> controlnets{};
  IpAdapter ip_adapter{};
  std::vector<Region> regions{};  // attention couple; checked against the model's unet.regions
  double region_base = 0.2;
  std::vector<Detailer> detailer{};  // applied in order after the decode (faces, then hands ...)
  Upscale upscale{};           // the PNG written is this frame (made after the detailer)
  std::string out_path{};      // "" = sdxl-<seed>.png
  std::string latents_path{};  // also the final latents, float32 .npy ("" = none)
  std::string timings_path{};  // stage timings and peak memory as JSON ("" = none)
};
struct ImageResult {
  std::string path{};
  std::int64_t seed = 0;
  int width = 0, height = 0, steps = 0;
  double text_s = 0, sample_s = 0, decode_s = 0, write_s = 0, total_s = 0;  // stages; total without the load
  std::uint64_t peak_bytes = 0;  // the device's peak memory
};

// ---------------------------------------------------------------------------
// Running

// Every field of the CLI's `run` flags other than the model's.
struct RunOptions {
  std::string out_dir{};                 // "" = the batch file's output.dir, else ./out
  bool force = false;                    // make every image again, even those done
  bool skip_invalid = false;             // run a batch file's valid tasks; the invalid ones count as failed
  double max_runtime_s = 0;              // stop taking new images after this long (0: no limit)
  int shard_index = 0, shard_count = 1;  // take share K of N of the tasks
  std::string lock_file{};               // also hold this lock (the output folder's own is always held)
  // Measured memory and time shared between output folders (one device and model per file): read
  // where the output folder's estimates.json lacks a figure, written back after the run. A fresh
  // output folder then starts batching at once instead of running each new size alone first.
  std::string estimates_file{};
  std::vector<std::string> wildcard_dirs{};
  int clip_skip = 0;                   // for tasks that set none (0: none)
  std::uint64_t vram_limit_bytes = 0;  // device memory budget (0: the card)
  int max_batch = 1;                   // images per UNet call at most (capped by the model's batch_max)
  double safety = 1.2;                 // a batch runs only if its estimated peak times this fits
  int retries = 1;                     // extra attempts of an image that failed
  double retry_backoff_s = 2.0;        // first wait; doubles per attempt
  double timeout_s = 0;                // per image when the task sets none (0: none)
  double aging_s = 900;                // a waiting image moves up one priority class per this long (0: never)
  int release_every = 0;               // free the allocator's cached blocks every N images
  int writer_threads = 2;
  bool file_order = false;  // the file's order instead of the queue's
  std::string devices{};    // "all" or GPU indices "0,1": one model copy per GPU ("" = the model's device)
  bool overlap = true;      // text / sample / decode of consecutive batches at once
  // Set to true (any thread, or a signal handler) to stop taking new images;
  // the images in flight are finished and the report is written.
  const std::atomic<bool>* stop = nullptr;
};

// Events of a run. Paths are absolute; `file` is relative to the output folder.
struct ImageWritten {
  std::string task_id{};
  int index = 0;
  std::int64_t seed = 0;
  std::string path{}, file{};
};
struct Progress {
  int total = 0, done = 0, skipped = 0, failed = 0;
  double elapsed_s = 0, images_per_minute = 0;
  double eta_s = -1;               // < 0: unknown
  std::uint64_t memory_bytes = 0;  // device memory in use
  std::string last_file{};
  std::string extra{};  // devices, LoRA cache hit rate
};
struct TaskFailed {
  std::string task_id{};
  int index = 0;
  std::int64_t seed = 0;
  std::string error{};
};

// Receives a run's events. Calls come from the run's threads, one at a time,
// and none after run() returns; a handler must return quickly, must not call
// the Session, and must not throw (an exception is logged and dropped).
class EventSink {
 public:
  virtual ~EventSink() = default;
  // A PNG is in place and its manifest line written.
  virtual void on_image(const ImageWritten&) {}
  // After each image made or failed.
  virtual void on_progress(const Progress&) {}
  // An image failed for good (after its retries), or an invalid task was skipped.
  virtual void on_task_failed(const TaskFailed&) {}
};

struct RunResult {
  int total = 0, done = 0, skipped = 0, failed = 0, not_started = 0;
  int batches = 0, oom_recoveries = 0, retries = 0, deadlines_missed = 0, devices_failed = 0;
  std::string stop_reason{};  // "" when every image was attempted
  std::string out_dir{}, report_path{};
  // kOk, or kTasksFailed when an image failed or was not started.
  ExitCode exit_code() const { return (failed > 0 || not_started > 0) ? ExitCode::kTasksFailed : ExitCode::kOk; }
};

// What a run would do (`run --dry-run`), with the memory and time that earlier
// runs into the same output folder measured.
struct PlannedBatch {
  std::string priority{};
  int width = 0, height = 0, steps = 0;
  std::vector<std::string> images{};  // "task#index"
  std::int64_t est_peak_bytes = -1;   // -1: never measured (the size runs alone first)
  double est_seconds = -1;            // -1: unknown
  bool time_measured = false;         // false: est_seconds is extrapolated
  int regions = 0;                    // the most regions of one of its images (each a prompt more per row)
};
// A task's detailer (docs/detailer.md): its units and the region passes its images need. Regions
// exist only once an image is decoded, so they come from what earlier runs into the folder found
// per image with each detector folder (estimates.json).
struct PlannedDetailer {
  std::string task_id{};
  int images = 0;                            // the task's images to make
  std::vector<std::string> detectors{};      // its units' detector folders, in order
  std::vector<double> regions_per_image{};   // per unit (at most its "max"); -1: unknown until detection
  double est_regions = -1;                   // passes of its images; -1: a unit is unknown
  double est_seconds = -1;                   // their time; -1: unknown
};
struct Plan {
  std::string model_name{}, out_dir{};
  int total = 0, to_make = 0, skipped = 0;
  std::vector<PlannedBatch> batches{};  // in queue order
  std::vector<PlannedDetailer> detailers{};  // tasks with a detailer; their passes go through the queue too
  bool detailer_unknown = false;        // some passes are unknown until detection: not in est_seconds
  double est_seconds = -1;              // -1: unknown for at least one batch; counts the known passes
  bool estimates_measured = false;      // earlier runs into the folder measured this device
  std::string estimates_device{}, why_no_estimates{};
  std::uint64_t vram_limit_bytes = 0, weights_bytes = 0, free_bytes = 0;
  double safety = 1.2;
  int max_batch = 1;  // after the model's batch_max
};

// ---------------------------------------------------------------------------
// The session: one model, the tasks submitted to it, and runs.

class Session {
 public:
  // Opens the model folder: reads model.json (and, with `verify`, checks its
  // files' sha256). Weights are loaded by the first run that has an image to
  // make, on each device's own thread. Throws ModelError (unreadable folder,
  // sha256 mismatch) or UsageError (a bad option value). A moved-from
  // Session may only be destroyed or assigned to.
  explicit Session(ModelOptions options);
  ~Session();
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const ModelOptions& options() const;
  ModelInfo model() const;

  // How both tokenizers read `text`, with the session's embeddings (and
  // `embedding_dirs`) as their vectors, and its schedule over `steps` sampler
  // steps (0: the model's default) when it uses prompt editing. Throws
  // UsageError for unreadable embeddings and prompt edits the run refuses.
  TokenReport tokens(const std::string& text, const std::vector<std::string>& embedding_dirs = {},
                     int steps = 0) const;

  // check_batch_file with this model: also sizes, clip skip, folders that fit
  // the model and prompt lengths, with the model's defaults for what the file
  // does not set. The session's embedding and LoRA dirs count too.
  CheckReport check_batch_file(const std::string& path, const CheckOptions& options = {}) const;

  // Queues a batch file's tasks for the next run (at most one batch file, and
  // not together with tasks submitted in code). The file is checked at run().
  // Throws UsageError when something is queued already.
  void submit_batch_file(const std::string& path);
  // Queues one task (its settings are checked now, the set at run()). Throws
  // InvalidInputError listing its problems, UsageError when a batch file is
  // queued or the id was submitted already.
  void submit(const Task& task);
  // Forgets what was submitted.
  void clear();

  // Makes one image now, without an output folder, manifest or lock: the
  // request is checked first (settings, files, folders that fit the model;
  // UsageError / ModelError before any weight loads), the weights load on this
  // thread, and the PNG (with A1111 `parameters`) goes to out_path.
  // Throws as run() does; the submitted tasks are untouched.
  ImageResult generate(const ImageRequest& request);

  // Runs everything submitted into options.out_dir (created; its lock held
  // for the run). Images the folder's manifest shows as done are skipped, so
  // a second run of the same tasks makes nothing. The submitted tasks stay
  // queued. Throws InvalidInputError (a task or the file cannot run),
  // LockedError, ModelError (weights that do not load), IoError (an output
  // that cannot be written; the report is written first). Failed images do
  // not throw: they are in the result, its exit_code() and the events.
  RunResult run(const RunOptions& options, EventSink* sink = nullptr);
  // What run(options) would make, in queue order with estimates; loads no
  // weights and writes nothing (the output folder is only read). Throws as run()
  // does before its first image.
  Plan plan(const RunOptions& options) const;

  struct Impl;  // the library's own state, defined inside it

 private:
  std::unique_ptr<Impl> impl_{};
};

// ---------------------------------------------------------------------------
// Upscaling existing images (`sdxl-batch upscale`): each PNG brought to a frame
// by an upscaler folder (export_sdxl.py --upscaler; tiled as ComfyUI's
// ImageUpscaleWithModel, at most 3 passes until the target is reached) or by
// LANCZOS alone, then LANCZOS to the exact size and, for a size, cropped or
// padded to it. Resumable: out_dir/manifest.jsonl records each image made
// (source path and sha256, settings, file); an image whose line and file are
// there is skipped unless `force`. Outputs are written atomically, under the
// folder's lock; out_dir/report.json sums the run. The PNG keeps the source's
// text chunks, its "parameters" extended with A1111's "Postprocess upscale
// by" / "Postprocess upscale to" and "Postprocess upscaler".

struct UpscaleOptions {
  std::string upscaler{};  // an upscaler folder, or "Lanczos"
  double scale = 0;        // > 0: by this factor; else to width x height
  int width = 0, height = 0;
  std::string fit = "stretch";      // with a size: "stretch", "crop" or "pad"
  std::vector<std::string> inputs;  // PNG files, or folders whose *.png are taken (sorted, not recursive)
  std::string out_dir{};
  std::string device = "auto";  // "auto" (CUDA when there is one), "cpu", "cuda", "cuda:N"
  int tile = 512;               // ComfyUI's tile (halved on out-of-memory down to 128)
  bool force = false;
};

struct UpscaleResult {
  int written = 0, skipped = 0, failed = 0;
  std::vector<std::string> failures{};  // "<source>: why", one per failed image
  int exit_code() const { return failed ? static_cast<int>(ExitCode::kTasksFailed) : 0; }
};

// Throws UsageError for bad options or inputs (no PNG, a bad scale or size, two
// sources with one output name, an input that is not a regular file, an
// out_dir that is a file or an input's folder, or whose output file is an
// input through a link, a manifest that is not a regular file), ModelError for
// an upscaler folder that does not load, LockedError when another process
// holds out_dir, IoError when the manifest or report cannot be written. An
// image that cannot be read or made (its frame outside 8..16384 a side, an
// upscaler output that is not finite) is a failure in the result; the others
// go on. Not thread-safe per out_dir.
UpscaleResult upscale_images(const UpscaleOptions& options);

// One report for an output folder that several runs wrote (the shards of a job
// array, reruns): every run's report-shard-K-of-N.json (and a plain run's
// report.json) and every manifest merged into out_dir/report.json and
// report.html (counts of the whole batch, one row per run with its host,
// per-host throughput, the slowest run, every run's images and failures).
// The last shard of an array to finish writes it too. Returns the path of
// report.json. UsageError when the folder has no run report or holds runs of
// different batch files (nothing written), IoError for an unreadable report.
struct FolderReport {
  std::string path;  // out_dir/report.json
  int images_total = 0, images_done = 0, images_failed = 0, runs = 0, hosts = 0;
  int exit_code() const { return images_done >= images_total ? 0 : static_cast<int>(ExitCode::kTasksFailed); }
};
FolderReport write_folder_report(const std::string& out_dir);

// ---------------------------------------------------------------------------
// Detection (`sdxl-batch detect`): faces, hands, people ... found by a detector folder
// (export_sdxl.py --detector: an Ultralytics YOLO detect or segment model, as ADetailer uses them),
// with Ultralytics' predict semantics (fixed-size letterbox, confidence filter, class-aware NMS at
// IoU 0.7, at most 300, boxes in image pixels; docs/detailer.md).

struct DetectOptions {
  std::string detector{};               // a detector folder
  double confidence = 0.3;              // in (0, 1]: ADetailer's default
  std::string device = "auto";          // "auto" (CUDA when there is one), "cpu", "cuda", "cuda:N"
  std::vector<std::string> images{};    // PNG files
};

struct DetectedBox {
  float x1 = 0, y1 = 0, x2 = 0, y2 = 0;  // image pixels, x2 > x1 not guaranteed for a clipped box
  float score = 0;
  int class_id = 0;
  std::string class_name{};
  long long mask_area = -1;  // segment models: the mask's pixels in the image; -1 otherwise
};

struct ImageDetections {
  std::string image{};
  int width = 0, height = 0;
  std::vector<DetectedBox> boxes{};  // by descending score
};

// Calls `sink` with each image's detections, in the order of options.images, as each is done.
// Throws UsageError for a confidence outside (0, 1], no image, or an image that is missing or not a
// readable PNG (every image is checked before the detector loads), ModelError for a folder that is
// not a detector folder or does not load.
void detect_images(const DetectOptions& options, const std::function<void(const ImageDetections&)>& sink);

// ---------------------------------------------------------------------------
// The short video (`sdxl-batch video`, docs/video.md): a batch file's "video" section made into an
// H.264 MP4 (and an .srt beside it) from a run's output folder, by the ffmpeg program. Each clip
// and each transition is encoded once into a segment named by the hash of what makes it, so a rerun
// encodes only what changed; the video is written under a temporary name and renamed into place,
// under the folder's lock (as a run's).

struct VideoOptions {
  std::string batch_file{};
  std::string out_dir{};  // the run's output folder (manifest.jsonl and its PNGs)
  std::string video{};    // "" = out_dir/video.mp4; the .srt is written beside it
  // Called as frames are encoded (from the encoding threads, one call at a time): frames done and to do (of the segments
  // not yet made), seconds so far, seconds still to go (estimated).
  std::function<void(int done, int total, double elapsed_s, double eta_s)> on_progress{};
};

struct VideoResult {
  // "TASK#INDEX (pointer): why" for each image the video needs that the run has not made (missing
  // or failed); then nothing was written.
  std::vector<std::string> missing{};
  std::string video{}, srt{};
  int clips_encoded = 0, transitions_encoded = 0, segments_reused = 0;
  int frames = 0;
  double seconds = 0;
  int exit_code() const { return missing.empty() ? 0 : static_cast<int>(ExitCode::kTasksFailed); }
};

// Throws InvalidInputError for a batch file with problems (those `validate` reports: the video
// section's at their JSON pointers), UsageError when it has no "video" section, LockedError when
// another process holds out_dir, IoError when ffmpeg fails or an output cannot be written.
VideoResult make_video(const VideoOptions& options);

}  // namespace sdxl_batch
