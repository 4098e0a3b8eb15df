// Base of the tests that load the tiny model ($SDXL_FIXTURES_DIR/tiny-model,
// made by the tiny_model ctest fixture): skips without it, one CPU thread.
// Base: ::testing::Test, or ::testing::TestWithParam<T> for parameterised tests.
#pragma once

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

namespace sdxl::testing {

template <class Base = ::testing::Test>
class TinyModelTest : public Base {
 protected:
  void SetUp() override {
    const char* fixtures = std::getenv("SDXL_FIXTURES_DIR");
    if (!fixtures) GTEST_SKIP() << "SDXL_FIXTURES_DIR is not set (run through ctest)";
    at::set_num_threads(1);
    model_ = std::filesystem::path(fixtures) / "tiny-model";
  }
  std::filesystem::path model_;
};

}  // namespace sdxl::testing
