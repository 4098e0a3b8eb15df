// Shared by the golden tests: the stock SDXL tokenizers of the tiny model and
// the golden files that the project's scripts write under $SDXL_FIXTURES_DIR
// (ctest sets it). Everything is loaded once per test binary.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "text/clip_tokenizer.h"

namespace sdxl::fixtures {

std::optional<std::filesystem::path> fixtures_dir();

struct StockTokenizers {
  ClipTokenizer tokenizer;    // pad "<|endoftext|>"
  ClipTokenizer tokenizer_2;  // pad "!"
};

// nullptr when SDXL_FIXTURES_DIR is not set.
const StockTokenizers* stock_tokenizers();

// $SDXL_FIXTURES_DIR/goldens/<name>; throws naming the path when missing.
nlohmann::json load_golden(const std::string& name);

// The stock tokenizers with one golden file, loaded once per name; nullptr
// when SDXL_FIXTURES_DIR is not set.
struct Stock {
  const ClipTokenizer* tokenizer;
  const ClipTokenizer* tokenizer_2;
  nlohmann::json golden;
};
const Stock* stock(const std::string& golden_name);

// Printable form of a test string for failure messages.
std::string escaped(const std::string& s);

}  // namespace sdxl::fixtures

// Declares `st` (the Stock of GOLDEN) in a test body, or skips the test.
#define REQUIRE_STOCK(golden_name)                                                        \
  const ::sdxl::fixtures::Stock* st = ::sdxl::fixtures::stock(golden_name);               \
  if (st == nullptr) GTEST_SKIP() << "SDXL_FIXTURES_DIR is not set (no stock tokenizers)"; \
  static_assert(true)
