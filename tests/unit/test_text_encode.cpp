// The C++ SDXL conditioning (A1111 prompt rules, both encoders of the tiny
// model, on the CPU) against the goldens of tests/reference/gen_conditioning_goldens.py,
// made with the diffusers pipeline's own text encoders.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "model/sdxl_model.h"
#include "core/npy.h"
#include "pipeline/text_encode.h"

namespace fs = std::filesystem;

TEST(Conditioning, MatchesTheDiffusersReferenceForEveryGoldenPrompt) {
  const char* fixtures = std::getenv("SDXL_FIXTURES_DIR");
  if (!fixtures) GTEST_SKIP() << "SDXL_FIXTURES_DIR is not set (run through ctest)";
  const fs::path dir = fs::path(fixtures) / "goldens" / "conditioning";
  std::ifstream in(dir / "index.json");
  ASSERT_TRUE(in) << "missing " << dir / "index.json";
  const auto index = nlohmann::json::parse(in);
  ASSERT_GE(index.size(), 50u);
  at::set_num_threads(1);
  c10::InferenceMode guard;
  const sdxl::ModelConfig cfg = sdxl::load_model_config(fs::path(fixtures) / "tiny-model");
  auto model = sdxl::SdxlModel::load(cfg, torch::Device(torch::kCPU), "");
  double worst = 0;
  std::set<int64_t> chunk_counts;
  for (size_t i = 0; i < index.size(); ++i) {
    const std::string prompt = index[i]["prompt"].get<std::string>();
    const sdxl::PromptEmbeds e = sdxl::encode_prompt_tokens(*model, sdxl::tokenize_sdxl_prompt(*model, prompt));
    std::vector<int64_t> shape;
    const std::vector<float> ctx = sdxl::read_npy_f32(dir / ("context-" + std::to_string(i) + ".npy"), &shape);
    const std::vector<float> pooled = sdxl::read_npy_f32(dir / ("pooled-" + std::to_string(i) + ".npy"), nullptr);
    ASSERT_EQ(e.context.sizes().vec(), shape) << "prompt " << i << ": " << prompt;
    chunk_counts.insert(shape[1] / 77);
    const torch::Tensor ref = torch::from_blob(const_cast<float*>(ctx.data()), shape, torch::kFloat32);
    const torch::Tensor ref_pooled = torch::from_blob(const_cast<float*>(pooled.data()), e.pooled.sizes(), torch::kFloat32);
    // Absurd weights (1e37 squared) overflow to inf/NaN in the reference too:
    // those must sit at the same places; the rest is compared.
    const torch::Tensor bad = e.context.isfinite().logical_not();
    ASSERT_TRUE(bad.equal(ref.isfinite().logical_not())) << "prompt " << i << " non-finite values differ: " << prompt;
    const double d = torch::where(bad, torch::zeros_like(ref), e.context - ref).abs().max().item<double>();
    const double dp = (e.pooled - ref_pooled).abs().max().item<double>();
    worst = std::max({worst, d, dp});
    EXPECT_LT(d, 1e-4) << "prompt " << i << ": " << prompt;
    EXPECT_LT(dp, 1e-4) << "prompt " << i << " (pooled): " << prompt;
  }
  EXPECT_GE(chunk_counts.size(), 3u) << "goldens should cover several chunk counts";
  std::cout << "conditioning: " << index.size() << " prompts, chunk counts " << *chunk_counts.begin() << ".."
            << *chunk_counts.rbegin() << ", max |diff| " << worst << "\n";
}
