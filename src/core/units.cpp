#include "core/units.h"

#include <cctype>
#include <cmath>
#include <exception>
#include <limits>
#include <optional>
#include <stdexcept>

#include "core/error.h"

namespace sdxl {

std::pair<int, int> parse_shard(const std::string& text) {
  const size_t slash = text.find('/');
  try {
    if (slash != std::string::npos) {
      size_t a = 0, b = 0;
      const int k = std::stoi(text.substr(0, slash), &a);
      const int n = std::stoi(text.substr(slash + 1), &b);
      if (a == slash && b == text.size() - slash - 1 && n >= 1 && k >= 0 && k < n) return {k, n};
    }
  } catch (const std::exception&) {
  }
  throw UsageError("--shard '" + text + "': expected K/N with 0 <= K < N, e.g. 0/4 (K is the 0-based shard index)");
}

namespace {

// The largest index or count of a shard (the run counts shards in an int).
constexpr long long kMaxShardNumber = std::numeric_limits<int>::max();

// An environment variable that must hold a whole number of at most kMaxShardNumber in magnitude:
// nothing larger is narrowed into another shard.
std::optional<long long> env_number(const EnvLookup& env, const char* name) {
  const std::optional<std::string> v = env(name);
  if (!v) return std::nullopt;
  const std::string what = "--shard auto: " + std::string(name) + "='" + *v + "'";
  try {
    size_t used = 0;
    const long long n = std::stoll(*v, &used);
    if (used == v->size() && !v->empty()) {
      if (n > kMaxShardNumber || n < -kMaxShardNumber)
        throw UsageError(what + " is out of range (at most " + std::to_string(kMaxShardNumber) + ")");
      return n;
    }
  } catch (const std::out_of_range&) {
    throw UsageError(what + " is out of range (at most " + std::to_string(kMaxShardNumber) + ")");
  } catch (const std::invalid_argument&) {
  }
  throw UsageError(what + " is not a whole number");
}

// The Slurm job array's {index, count}, or nothing outside an array task.
std::optional<std::pair<long long, long long>> slurm_shard(const EnvLookup& env) {
  const std::optional<long long> id = env_number(env, "SLURM_ARRAY_TASK_ID");
  if (!id) return std::nullopt;
  const std::optional<long long> count = env_number(env, "SLURM_ARRAY_TASK_COUNT");
  const std::optional<long long> lo = env_number(env, "SLURM_ARRAY_TASK_MIN");
  const std::optional<long long> hi = env_number(env, "SLURM_ARRAY_TASK_MAX");
  const long long step = env_number(env, "SLURM_ARRAY_TASK_STEP").value_or(1);
  const long long min = lo.value_or(0);
  const std::string where = "--shard auto: the Slurm job array (SLURM_ARRAY_TASK_ID=" + std::to_string(*id) +
                            (count ? ", SLURM_ARRAY_TASK_COUNT=" + std::to_string(*count) : "") +
                            (lo ? ", SLURM_ARRAY_TASK_MIN=" + std::to_string(*lo) : "") +
                            (hi ? ", SLURM_ARRAY_TASK_MAX=" + std::to_string(*hi) : "") + ", step " +
                            std::to_string(step) + ")";
  if (step < 1 || *id < min || (*id - min) % step != 0)
    throw UsageError(where + ": the task's index is not on the array's range");
  if (!count && !hi) throw UsageError(where + " gives no count: use --shard auto/N");
  if (count && *count < 1) throw UsageError(where + ": SLURM_ARRAY_TASK_COUNT must be 1 or more");
  if (hi && (*hi < min || (*hi - min) % step != 0 || *id > *hi))
    throw UsageError(where + ": MIN, MAX and the step are not one range");
  const long long from_range = hi ? (*hi - min) / step + 1 : 0;
  if (count && hi && *count != from_range)
    throw UsageError(where + ": " + std::to_string(*count) + " tasks, but MIN..MAX holds " +
                     std::to_string(from_range) + " (an array of a list such as 1,3,7 cannot be shards: use a range)");
  return std::make_pair((*id - min) / step, count ? *count : from_range);
}

std::string shard_text(long long k, long long n) { return std::to_string(k) + "/" + std::to_string(n); }

}  // namespace

std::pair<int, int> parse_shard(const std::string& text, const EnvLookup& env) {
  if (text != "auto" && text.rfind("auto/", 0) != 0) return parse_shard(text);
  std::optional<long long> given;
  if (text != "auto") {
    try {
      size_t used = 0;
      const long long n = std::stoll(text.substr(5), &used);
      if (used == text.size() - 5 && n >= 1 && n <= kMaxShardNumber) given = n;
    } catch (const std::exception&) {
    }
    if (!given)
      throw UsageError("--shard '" + text + "': expected auto/N with N >= 1 (at most " +
                       std::to_string(kMaxShardNumber) + "), the number of shards");
  }
  const auto slurm = slurm_shard(env);
  const std::optional<long long> k8s = env_number(env, "JOB_COMPLETION_INDEX");
  if (!slurm && !k8s)
    throw UsageError("--shard " + text + ": no scheduler's index in the environment (SLURM_ARRAY_TASK_ID of a "
                     "Slurm job array, JOB_COMPLETION_INDEX of a Kubernetes Indexed Job); outside one, give --shard K/N");
  if (slurm && k8s && slurm->first != *k8s)
    throw UsageError("--shard auto: the Slurm array says shard " + shard_text(slurm->first, slurm->second) +
                     ", JOB_COMPLETION_INDEX says " + std::to_string(*k8s));
  if (slurm && given && slurm->second != *given)
    throw UsageError("--shard " + text + ": the Slurm job array has " + std::to_string(slurm->second) + " tasks");
  const long long k = slurm ? slurm->first : *k8s;
  const long long n = slurm ? slurm->second : given.value_or(0);
  // Each message names the variables the index and the count were read from.
  const std::string source = slurm ? "the Slurm job array's" : "JOB_COMPLETION_INDEX's";
  if (!slurm && n == 0)
    throw UsageError("--shard auto: JOB_COMPLETION_INDEX=" + std::to_string(k) + " (a Kubernetes Indexed Job) gives "
                     "the index, not the count: use --shard auto/N with N = the Job's completions");
  if (n > kMaxShardNumber)
    throw UsageError("--shard " + text + ": " + source + " count " + std::to_string(n) + " is out of range (at most " +
                     std::to_string(kMaxShardNumber) + ")");
  if (k < 0 || k >= n)
    throw UsageError("--shard " + text + ": " + source + " index " + std::to_string(k) +
                     (k < 0 ? " is negative" : " is not below the count " + std::to_string(n)));
  return {static_cast<int>(k), static_cast<int>(n)};
}

double parse_duration_s(const std::string& text) {
  const std::string hint = "duration '" + text + "': expected e.g. 90, 90s, 30m, 6h or 1h30m (finite, 0 or more)";
  double total = 0;
  size_t i = 0;
  bool any = false;
  while (i < text.size()) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(text.substr(i), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || !std::isfinite(v) || v < 0) throw UsageError(hint);  // stod reads "nan" and "inf" too
    i += used;
    double unit = 1;
    if (i < text.size()) {
      const char u = text[i];
      if (u == 's') unit = 1;
      else if (u == 'm') unit = 60;
      else if (u == 'h') unit = 3600;
      else throw UsageError("duration '" + text + "': unknown unit '" + std::string(1, u) + "' (use s, m or h)");
      ++i;
    }
    total += v * unit;
    any = true;
  }
  if (!any) throw UsageError("duration is empty: expected e.g. 90, 90s, 30m, 6h or 1h30m");
  if (!std::isfinite(total)) throw UsageError(hint + " (too large)");
  return total;
}

std::uint64_t parse_size_bytes(const std::string& text) {
  const std::string hint = "size '" + text + "': expected e.g. 24GiB, 12G, 800MiB or a number of bytes";
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw UsageError(hint);
  }
  if (used == 0 || !(v >= 0)) throw UsageError(hint);
  std::string unit = text.substr(used);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") mult = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib") mult = 1024.0 * 1024.0;
  else if (unit == "g" || unit == "gb" || unit == "gib") mult = 1024.0 * 1024.0 * 1024.0;
  else if (unit == "t" || unit == "tb" || unit == "tib") mult = 1024.0 * 1024.0 * 1024.0 * 1024.0;
  else throw UsageError(hint);
  const double bytes = v * mult;
  if (bytes > 1.8e19) throw UsageError(hint + " (too large)");
  return static_cast<std::uint64_t>(bytes);
}

}  // namespace sdxl

namespace sdxl {

std::string timestep_list_problem(const std::vector<int>& ts, int n) {
  if (ts.empty()) return "must hold at least one timestep, e.g. [999, 749, 499, 249]";
  for (size_t i = 0; i < ts.size(); ++i) {
    const std::string item = "item " + std::to_string(i) + " (" + std::to_string(ts[i]) + ")";
    if (ts[i] < 0 || ts[i] >= n)
      return item + " is out of range: the model's timesteps are 0.." + std::to_string(n - 1);
    if (i > 0 && ts[i] >= ts[i - 1])
      return "must be strictly decreasing: " + item + " is not below item " + std::to_string(i - 1) + " (" +
             std::to_string(ts[i - 1]) + ")";
  }
  return "";
}

}  // namespace sdxl
