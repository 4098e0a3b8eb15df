// --cuda-allocator: what the run applies to the CUDA caching allocator and
// what its report says, with and without the user's environment variables.
#include <gtest/gtest.h>

#include "sdxl/error.h"
#include "sdxl/generator.h"

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

// Deterministic cuDNN is the default: the same seed gives the same PNG on every GPU.
TEST(CudaAllocator, DeterministicCudnnIsTheDefault) { EXPECT_TRUE(sdxl::RuntimeOptions{}.deterministic_cudnn); }

}  // namespace
