#include "scheduler/generator_lane.h"

#include <spdlog/spdlog.h>


namespace sdxl {

GeneratorLane::GeneratorLane(std::filesystem::path model_dir, RuntimeOptions runtime, LoraRegistry registry,
                             std::uint64_t vram_limit)
    : model_dir_(std::move(model_dir)),
      runtime_(std::move(runtime)),
      registry_(std::move(registry)),
      vram_limit_(vram_limit) {}

void GeneratorLane::start() {
  gen_ = std::make_unique<Generator>(model_dir_, runtime_);
  gen_->set_lora_registry(registry_);
  if (vram_limit_ > 0) {
    gen_->set_memory_limit(vram_limit_);
    spdlog::info("{}: device memory budget {:.2f} GiB (--vram-limit)", runtime_.device,
                 static_cast<double>(vram_limit_) / (1024.0 * 1024.0 * 1024.0));
  }
  ready_ = gen_.get();
}

StageHandle GeneratorLane::encode(const std::vector<GenerationParams>& params) { return gen_->encode_batch(params); }

StageHandle GeneratorLane::sample(const StageHandle& encoded, const StepHook& hook) {
  return gen_->sample_batch(std::static_pointer_cast<EncodedBatch>(encoded), hook);
}

std::vector<GeneratedImage> GeneratorLane::decode(const StageHandle& sampled) {
  return gen_->decode_batch(std::static_pointer_cast<SampledBatch>(sampled));
}

std::vector<DetailerRegion> GeneratorLane::detailer_regions(const DetailerUse& unit, const PixelImage& image,
                                                            std::string& model_name) {
  return gen_->detailer_regions(unit, image, model_name);
}
void GeneratorLane::make_frame(const GenerationParams& p, GeneratedImage& image) {
  gen_->make_frame(p, image);
}

void GeneratorLane::prefetch(const std::vector<GenerationParams>& params) { gen_->prefetch_loras(params); }

std::optional<MemorySnapshot> GeneratorLane::memory() { return gen_->memory(); }
void GeneratorLane::reset_peak() { gen_->reset_peak_memory(); }
void GeneratorLane::release_cached() { gen_->release_cached_memory(); }

std::string GeneratorLane::device_name() const { return ready_ ? ready_.load()->device_name() : std::string(); }
double GeneratorLane::load_seconds() const { return ready_ ? ready_.load()->load_seconds() : 0.0; }
LoraStats GeneratorLane::lora_stats() const { return ready_ ? ready_.load()->lora_stats() : LoraStats{}; }
std::map<std::string, double> GeneratorLane::engine_counters() const {
  return ready_ ? ready_.load()->engine_counters() : std::map<std::string, double>{};
}

}  // namespace sdxl
