// --cuda-allocator: what the run applies to the CUDA caching allocator and
// what its report says, with and without the user's environment variables.
#include <c10/core/AllocatorConfig.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "device/device.h"
#include "core/error.h"
#include "pipeline/generator.h"

namespace {

TEST(CudaAllocator, ExpandableIsAppliedWhenTheEnvironmentSaysNothing) {
  const auto c = sdxl::choose_cuda_allocator("expandable", nullptr, "");
  EXPECT_EQ(c.apply, "expandable_segments:True");
  EXPECT_EQ(c.report, "expandable_segments:True");
  EXPECT_EQ(sdxl::RuntimeOptions{}.cuda_allocator, "expandable");
}

TEST(CudaAllocator, DefaultLeavesTheAllocatorAlone) {
  const auto c = sdxl::choose_cuda_allocator("default", nullptr, nullptr);
  EXPECT_EQ(c.apply, "");
  EXPECT_EQ(c.report, "default");
}

TEST(CudaAllocator, TheUsersEnvironmentWinsAndIsReportedByName) {
  auto c = sdxl::choose_cuda_allocator("expandable", nullptr, "max_split_size_mb:512");
  EXPECT_EQ(c.apply, "");
  EXPECT_EQ(c.report, "max_split_size_mb:512 (PYTORCH_CUDA_ALLOC_CONF)");
  c = sdxl::choose_cuda_allocator("default", "expandable_segments:False", "max_split_size_mb:512");
  EXPECT_EQ(c.apply, "");
  EXPECT_EQ(c.report, "expandable_segments:False (PYTORCH_ALLOC_CONF)");
}

TEST(CudaAllocator, UnknownModeIsAUsageErrorNamingIt) {
  try {
    sdxl::choose_cuda_allocator("huge", nullptr, nullptr);
    FAIL() << "no error";
  } catch (const sdxl::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'huge'"), std::string::npos) << e.what();
  }
}

// The real path: the choice reaches libtorch's allocator configuration (no GPU
// needed to parse it), once per process, and the report reads what was applied.
TEST(CudaAllocator, ConfigureAppliesExpandableSegmentsOnceToLibtorch) {
  if (std::getenv("PYTORCH_ALLOC_CONF") || std::getenv("PYTORCH_CUDA_ALLOC_CONF"))
    GTEST_SKIP() << "an allocator setting in the environment wins over --cuda-allocator";
  ASSERT_EQ(sdxl::cuda_allocator_settings(), "") << "nothing configured yet in this process";
  ASSERT_FALSE(c10::CachingAllocator::AcceleratorAllocatorConfig::use_expandable_segments());
  sdxl::configure_cuda_allocator("expandable");
  EXPECT_TRUE(c10::CachingAllocator::AcceleratorAllocatorConfig::use_expandable_segments());
  EXPECT_EQ(sdxl::cuda_allocator_settings(), "expandable_segments:True");
  sdxl::configure_cuda_allocator("default");  // a second device's generator changes nothing
  EXPECT_TRUE(c10::CachingAllocator::AcceleratorAllocatorConfig::use_expandable_segments());
  EXPECT_EQ(sdxl::cuda_allocator_settings(), "expandable_segments:True");
}

// Deterministic cuDNN is the default: the same seed gives the same PNG on every GPU.
TEST(CudaAllocator, DeterministicCudnnIsTheDefault) { EXPECT_TRUE(sdxl::RuntimeOptions{}.deterministic_cudnn); }

}  // namespace
