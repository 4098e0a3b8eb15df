// Values users type on the command line and in batch files: durations, byte
// sizes, shard specs, and the steps a denoising strength leaves. Pure; the parsers throw UsageError
// naming the value.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sdxl {

// "90", "90s", "30m", "6h", "1h30m" -> seconds: finite, 0 or more (what 0
// means is the caller's: for every duration flag of `run`, no limit). NaN,
// infinities and negative values throw UsageError.
double parse_duration_s(const std::string& text);

// "24GiB", "12G", "800MiB", "1.5GB", "65536" (bytes) -> bytes; G/GB and
// GiB are both 2^30 (as nvidia-smi counts).
std::uint64_t parse_size_bytes(const std::string& text);

// --shard K/N: "K/N" with 0 <= K < N.
std::pair<int, int> parse_shard(const std::string& text);

// A timestep list (the task key "timesteps", diffusers' set_timesteps(timesteps=...)): "" when it is
// not empty, each in [0, num_train_timesteps) and strictly decreasing, else why not (naming the item).
std::string timestep_list_problem(const std::vector<int>& timesteps, int num_train_timesteps);

// An environment variable's value, or nothing when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;

// --shard K/N, auto or auto/N -> {K, N}. "auto" takes the index and the count
// from the scheduler's environment:
//   Slurm job array: K = (SLURM_ARRAY_TASK_ID - MIN) / STEP, N =
//     SLURM_ARRAY_TASK_COUNT, else (MAX - MIN) / STEP + 1 (MIN, MAX, STEP:
//     SLURM_ARRAY_TASK_MIN/_MAX/_STEP; MIN 0 and STEP 1 when unset);
//   Kubernetes Indexed Job: K = JOB_COMPLETION_INDEX; N only from auto/N
//     (the Job's completions are not in its pods' environment).
// UsageError, naming the variables, when neither is set, when a value is not a
// number, when the array is not the range MIN..MAX (a list such as 1,3,7),
// when Slurm's count variables disagree with each other, and when auto/N, the
// Slurm array and the Kubernetes index disagree; also for an index or count
// beyond an int (2^31 - 1: never narrowed into another shard) and a Slurm
// count below 1. Each message names the variables it read.
std::pair<int, int> parse_shard(const std::string& text, const EnvLookup& env);

// The sampler steps a denoising pass of `steps` at `strength` runs (img2img, inpainting, the hires
// fix's second pass, a detailer's regions): min(int(steps * strength), steps), as diffusers'
// StableDiffusionXLImg2ImgPipeline.get_timesteps. Sampling plans with it; checks refuse 0 with it.
inline int strength_steps(int steps, double strength) {
  return std::min(static_cast<int>(steps * strength), steps);
}

}  // namespace sdxl
