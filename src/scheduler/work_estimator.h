// WorkEstimator: how much device memory and time a batch of n images at W×H
// needs, from what was measured, never from guessed constants.
//
// Memory: the peak above what was allocated before the batch started (the
// resident weights and the LoRA cache), per resolution. With observations at
// two or more batch sizes the estimate is the least-squares line a + b·n, raised
// so that it covers every observation (it is a safety bound, not an average).
// With one size n0 measured, the part that grows with n is the sampling peak
// (when it was measured): estimate(n) = peak + (n - n0) * sampling peak / n0,
// and the peak itself for n <= n0 — the VAE decodes image by image, so its
// peak, most of the whole, hardly grows with the batch while the sampling
// peak does (measured: docs/scheduling-and-memory.md#admission-and-the-estimator). Without
// a sampling peak (older estimates.json files) the whole peak scales per
// image, an overestimate that admits too few images. A resolution never
// measured has no estimate: the caller runs it alone first (a probe) and measures.
//
// Time: seconds per image per step, per resolution and batch size, as measured
// (the newest 8 observations averaged); unmeasured sizes are scaled from the
// nearest measured one by pixels, and marked as such.
//
// Batches that run ControlNets or an IP-Adapter beside the UNet (`controlnets`
// > 0: their activations and residuals, the eager UNet path) are kept apart
// from plain ones of the same size: every figure is per (width, height,
// side_modules_key), saved as "controlnets", "ip_adapter", "upscaler" and "regions".
//
// Saved as JSON (estimates.json in the output folder, and `run --estimates FILE`
// when named) so the next run and `--dry-run` start from this run's figures, also
// in a fresh output folder; keyed by device and model, since figures from
// another GPU do not apply. torch-free, not thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "batch/generation_params.h"

namespace sdxl {

// The third part of an estimate's key: the ControlNet count, plus kIpAdapterKey with an IP-Adapter,
// plus kUpscalerKey with an upscaler model: a frame's (its weights and tiles' activations join the
// decode stage's peak) or the hires fix's (the sampling stage's).
// Regions add kRegionsKey per region: each is a prompt's context and attention more in every
// cross-attention layer (regions of panels that share a batch: the key is each image's own, and a batch's
// images share one key's figures, so a panel's regions are counted as its own).
inline constexpr int kIpAdapterKey = 1000;
inline constexpr int kUpscalerKey = 10000;
inline constexpr int kRegionsKey = 100000;
inline int side_modules_key(const GenerationParams& p) {
  const bool upscaler = p.upscale.uses_model() || p.hires_uses_model();
  return static_cast<int>(p.controlnets.size()) + (p.ip_adapter.on() ? kIpAdapterKey : 0) +
         (upscaler ? kUpscalerKey : 0) + static_cast<int>(p.regions.size()) * kRegionsKey;
}

struct TimeEstimate {
  double seconds_per_image = 0;
  bool measured = false;  // false: scaled from another resolution or batch size
};

class WorkEstimator {
 public:
  WorkEstimator() = default;
  WorkEstimator(std::string device, std::string model) : device_(std::move(device)), model_(std::move(model)) {}

  // peak_work_bytes: the batch's whole peak; sample_peak_bytes: that of its
  // sampling stage alone (0: not measured).
  void observe_memory(int width, int height, int batch, std::uint64_t peak_work_bytes,
                      std::uint64_t sample_peak_bytes = 0, int controlnets = 0);
  void observe_time(int width, int height, int batch, int steps, double seconds, int controlnets = 0);

  // Estimated peak work bytes of a batch; nullopt when this resolution was never measured.
  std::optional<std::uint64_t> peak_bytes(int width, int height, int batch, int controlnets = 0) const;
  // Largest n in 1..max_n whose estimate × safety fits in `free_bytes`; 1 when
  // the resolution is unmeasured (a probe) or nothing fits.
  int max_batch(int width, int height, int max_n, std::uint64_t free_bytes, double safety, int controlnets = 0) const;

  std::optional<TimeEstimate> seconds_per_image(int width, int height, int batch, int steps, int controlnets = 0) const;

  // The detailer: `regions` found by one unit's detector folder `detector` in one image (the run
  // observes each detailed image), and the mean per image so far (nullopt: never measured), which
  // --dry-run's plan counts region passes by. Saved as "detailer": [{"detector", "images", "regions"}].
  void observe_detailer_regions(const std::string& detector, int regions);
  std::optional<double> detailer_regions_per_image(const std::string& detector) const;

  bool empty() const { return memory_.empty() && time_.empty(); }
  const std::string& device() const { return device_; }
  const std::string& model() const { return model_; }

  std::string to_json() const;
  // Reads a saved file; returns an empty estimator when the file is missing,
  // unreadable or for another device/model (a warning says which).
  static WorkEstimator load(const std::filesystem::path& path, const std::string& device, const std::string& model,
                            std::string* why_not = nullptr);
  // What a saved file holds for a device and model; read() adds its figures to `into` (a fresh
  // estimator of that device and model) only when `ok`, and leaves it empty otherwise.
  enum class Saved { missing, ok, other_device_or_model, invalid };
  static Saved read(const std::filesystem::path& path, const std::string& device, const std::string& model,
                    WorkEstimator& into, std::string* why_not = nullptr);
  // Takes what this estimator lacks from `other` (figures of the same device and model measured
  // elsewhere, e.g. `run --estimates FILE`): each (size, batch) memory and sampling peak becomes the
  // larger of the two (a safety bound), and time per size and batch and detailer counts per detector
  // folder come from `other` only where this has none. What this measured comes first.
  void fill_from(const WorkEstimator& other);
  void save(const std::filesystem::path& path) const;  // atomic write; throws IoError

 private:
  using Res = std::tuple<int, int, int>;  // width, height, ControlNets
  std::string device_, model_;
  std::map<Res, std::map<int, std::uint64_t>> memory_;         // resolution -> batch -> max observed peak
  std::map<Res, std::map<int, std::uint64_t>> sample_memory_;  // the same for the sampling stage (when measured)
  std::map<Res, std::map<int, std::vector<double>>> time_;     // resolution -> batch -> s/image/step (newest last)
  std::map<std::string, std::pair<long long, long long>> detailer_;  // detector folder -> images, regions
};

}  // namespace sdxl
