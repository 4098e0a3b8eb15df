#include "stock_fixtures.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace sdxl::fixtures {

std::optional<std::filesystem::path> fixtures_dir() {
  const char* dir = std::getenv("SDXL_FIXTURES_DIR");
  if (dir == nullptr || *dir == '\0') return std::nullopt;
  return std::filesystem::path(dir);
}

const StockTokenizers* stock_tokenizers() {
  static const std::unique_ptr<StockTokenizers> loaded = []() -> std::unique_ptr<StockTokenizers> {
    const auto dir = fixtures_dir();
    if (!dir) return nullptr;
    return std::make_unique<StockTokenizers>(
        StockTokenizers{ClipTokenizer::from_dir(*dir / "tiny-model" / "tokenizer", "<|endoftext|>"),
                        ClipTokenizer::from_dir(*dir / "tiny-model" / "tokenizer_2", "!")});
  }();
  return loaded.get();
}

nlohmann::json load_golden(const std::string& name) {
  const auto dir = fixtures_dir();
  if (!dir) throw std::runtime_error("SDXL_FIXTURES_DIR is not set (run through ctest)");
  const std::filesystem::path path = *dir / "goldens" / name;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  return nlohmann::json::parse(in);
}

const Stock* stock(const std::string& golden_name) {
  static std::map<std::string, std::unique_ptr<Stock>> loaded;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  const StockTokenizers* t = stock_tokenizers();
  if (t == nullptr) return nullptr;
  auto& slot = loaded[golden_name];
  if (!slot) slot = std::make_unique<Stock>(Stock{&t->tokenizer, &t->tokenizer_2, load_golden(golden_name)});
  return slot.get();
}

std::string escaped(const std::string& s) { return nlohmann::json(s).dump(-1, ' ', /*ensure_ascii=*/true); }

}  // namespace sdxl::fixtures
