// GeneratorLane: the real pipeline as a DeviceLane — one device, its own
// Generator (model copy, LoRA cache, stage streams), loaded by start() on the
// lane's own thread when there is work, so several GPUs load at once. The
// report's views return empty values until the model is loaded.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "batch/lora_ref.h"
#include "lora/lora_stats.h"
#include "pipeline/generator.h"
#include "scheduler/device_lane.h"

namespace sdxl {

class GeneratorLane final : public DeviceLane {
 public:
  // `vram_limit` > 0 caps the device's allocator (--vram-limit).
  GeneratorLane(std::filesystem::path model_dir, RuntimeOptions runtime, LoraRegistry registry,
                std::uint64_t vram_limit);

  std::string name() const override { return runtime_.device; }
  // The lane's Generator once start() has loaded it (`generate` makes its image on it directly).
  Generator& generator() { return *gen_; }
  void start() override;
  StageHandle encode(const std::vector<GenerationParams>& params) override;
  StageHandle sample(const StageHandle& encoded, const StepHook& hook) override;
  std::vector<GeneratedImage> decode(const StageHandle& sampled) override;
  std::vector<DetailerRegion> detailer_regions(const DetailerUse& unit, const PixelImage& image,
                                               std::string& model_name) override;
  void make_frame(const GenerationParams& p, GeneratedImage& image) override;
  bool can_prefetch() const override { return true; }
  void prefetch(const std::vector<GenerationParams>& params) override;
  std::optional<MemorySnapshot> memory() override;
  void reset_peak() override;
  void release_cached() override;
  std::string device_name() const override;
  double load_seconds() const override;
  LoraStats lora_stats() const override;
  std::map<std::string, double> engine_counters() const override;

 private:
  std::filesystem::path model_dir_;
  RuntimeOptions runtime_;
  LoraRegistry registry_;
  std::uint64_t vram_limit_;
  std::unique_ptr<Generator> gen_;
  std::atomic<Generator*> ready_{nullptr};  // set once the model is loaded; other threads read through it
};

}  // namespace sdxl
