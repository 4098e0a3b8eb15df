// DetectorCache (the detailer's detector folders) on the fixture's face detector (fixture_detector):
// the cache counts the weights it holds — the report's detector_cache_resident_mib once read 0 because
// a bare LruCache counted nothing — and drops them with an eviction.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "detect/detector_cache.h"

namespace fs = std::filesystem;

namespace {

fs::path fixture_detector() {
  const char* root = std::getenv("SDXL_FIXTURES_DIR");
  return root ? fs::path(root) / "detector" / "face" : fs::path();
}

// The module's parameters and buffers as torch loads them, counted here on their own.
std::uint64_t module_bytes(const fs::path& file) {
  const torch::jit::Module m = torch::jit::load(file.string(), torch::kCPU);
  std::uint64_t n = 0;
  for (const at::Tensor& t : m.parameters()) n += t.nbytes();
  for (const at::Tensor& t : m.buffers()) n += t.nbytes();
  return n;
}

}  // namespace

TEST(DetectorCache, CountsTheLoadedDetectorsWeights) {
  const fs::path face = fixture_detector();
  if (face.empty() || !fs::exists(face / "model.json")) GTEST_SKIP() << "no fixture detector (fixture_detector)";
  const fs::path copy = fs::temp_directory_path() / ("sdxl_detector_cache_" + std::to_string(::getpid()));
  fs::remove_all(copy);
  fs::copy(face, copy, fs::copy_options::recursive);
  const std::uint64_t want = module_bytes(face / "detector.ts");
  ASSERT_GT(want, 0u);

  sdxl::DetectorCache cache(torch::kCPU, /*capacity=*/1);
  EXPECT_EQ(cache.stats().resident_bytes, 0u);
  const auto det = cache.get(face.string());
  EXPECT_EQ(det->weight_bytes(), want);
  EXPECT_EQ(cache.stats().resident_bytes, want);
  EXPECT_EQ(cache.get(face.string()), det) << "a hit: the same detector";
  EXPECT_EQ(cache.stats().hits, 1);
  // A second folder evicts the first (capacity 1): still one detector's weights, not two.
  (void)cache.get(copy.string());
  const sdxl::LruCacheStats s = cache.stats();
  EXPECT_EQ(s.loads, 2);
  EXPECT_EQ(s.evictions, 1);
  EXPECT_EQ(s.resident_bytes, want);
  EXPECT_THROW(cache.get((copy / "missing").string()), sdxl::ModelError);
  EXPECT_EQ(cache.stats().resident_bytes, want) << "a folder that does not load leaves the cache as it was";
  fs::remove_all(copy);
}
