// The pipeline runs each stage on its own thread (text, sampling, decode), and
// TorchScript's executor settings are thread-local in libtorch. A setting made
// where the model loads must hold on those threads too: with it lost, the
// stage threads ran the optimising executor, which re-optimised the UNet graph
// at the second call of every new shape (5-6 s on the H200 each time).
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "pipeline/generator.h"
#include "tiny_model_test.h"

namespace {

using GeneratorThreads = sdxl::testing::TinyModelTest<::testing::TestWithParam<bool>>;

TEST_P(GeneratorThreads, ExecutorSettingReachesEveryStageThread) {
  const bool optimize = GetParam();
  sdxl::RuntimeOptions opts;
  opts.jit_optimize = optimize;
  sdxl::Generator gen(model_, opts);  // loaded on this thread
  sdxl::GenerationParams p;
  p.prompt = "a lighthouse";
  p.seed = 3;
  p.steps = 2;
  p.width = p.height = 256;

  // Each stage on a fresh thread whose own setting is the opposite, as a
  // thread that never heard of the option would be (libtorch's default is on).
  auto fresh_thread = [&](auto&& body) {
    std::thread t([&] {
      torch::jit::setGraphExecutorOptimize(!optimize);
      body();
    });
    t.join();
  };
  std::shared_ptr<sdxl::EncodedBatch> encoded;
  std::shared_ptr<sdxl::SampledBatch> sampled;
  bool after_encode = !optimize, during_sampling = !optimize, after_decode = !optimize;
  std::vector<sdxl::GeneratedImage> images;
  fresh_thread([&] {
    encoded = gen.encode_batch({p});
    after_encode = torch::jit::getGraphExecutorOptimize();
  });
  fresh_thread([&] {
    sampled = gen.sample_batch(encoded, [&](int, int) { during_sampling = torch::jit::getGraphExecutorOptimize(); });
  });
  fresh_thread([&] {
    images = gen.decode_batch(sampled);
    after_decode = torch::jit::getGraphExecutorOptimize();
  });
  EXPECT_EQ(after_encode, optimize);
  EXPECT_EQ(during_sampling, optimize);
  EXPECT_EQ(after_decode, optimize);
  ASSERT_EQ(images.size(), 1u);
  EXPECT_EQ(images[0].rgb.size(), 256u * 256u * 3u);
}

// --deterministic-cudnn (the default) reaches libtorch's (process-wide) cuDNN
// setting, and --no-deterministic-cudnn leaves cuDNN free to pick any algorithm.
TEST_F(GeneratorThreads, DeterministicCudnnOptionIsApplied) {
  sdxl::RuntimeOptions opts;
  opts.deterministic_cudnn = true;
  { sdxl::Generator gen(model_, opts); }
  EXPECT_TRUE(at::globalContext().deterministicCuDNN());
  opts.deterministic_cudnn = false;
  { sdxl::Generator gen(model_, opts); }
  EXPECT_FALSE(at::globalContext().deterministicCuDNN());
}

INSTANTIATE_TEST_SUITE_P(JitOptimize, GeneratorThreads, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "On" : "Off"; });

}  // namespace
