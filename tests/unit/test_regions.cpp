// Regions (attention couple) in batch files: the "regions" key, a character's place and reference in
// a region, what is refused and where, the PNG's fields and the manifest (batch/regions.h,
// batch/story.h, check/batch_check.h). The weights themselves: test_region_weights.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "batch/batch_file.h"
#include "test_support.h"
#include "batch/regions.h"
#include "batch/task_keys.h"
#include "check/batch_check.h"
#include "core/error.h"
#include "image/png_writer.h"

namespace fs = std::filesystem;

namespace {

// A folder with PNGs: masks/left.png (64x64, left half white), masks/black.png, masks/wide.png
// (128x64, another aspect), refs/mara.png, and a broken masks/bad.png.
struct RegionDir {
  fs::path root = fs::temp_directory_path() / ("sdxl-regions-" + std::to_string(::getpid()));
  RegionDir() {
    fs::remove_all(root);
    fs::create_directories(root / "masks");
    fs::create_directories(root / "refs");
    png("masks/left.png", 64, 64, [](int x, int) { return x < 32 ? 255 : 0; });
    png("masks/black.png", 64, 64, [](int, int) { return 0; });
    png("masks/wide.png", 128, 64, [](int x, int) { return x < 64 ? 255 : 0; });
    png("refs/mara.png", 32, 32, [](int x, int y) { return (x * 7 + y * 3) % 256; });
    std::ofstream(root / "masks/bad.png") << "not a png";
  }
  ~RegionDir() { fs::remove_all(root); }
  template <class F>
  void png(const std::string& rel, int w, int h, F grey) {
    std::vector<std::uint8_t> rgb(static_cast<size_t>(w * h * 3));
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int c = 0; c < 3; ++c) rgb[static_cast<size_t>((y * w + x) * 3 + c)] = static_cast<std::uint8_t>(grey(x, y));
    sdxl::write_png(root / rel, w, h, 3, rgb.data(), {});
  }
};

const RegionDir& dir() {
  static const RegionDir d;
  return d;
}

std::vector<sdxl::BatchProblem> parse(const std::string& text, sdxl::BatchFile* out = nullptr) {
  std::vector<sdxl::BatchProblem> p;
  sdxl::FileInputChecks files;
  sdxl::GenerationParams fallback;
  fallback.width = fallback.height = 64;
  sdxl::BatchFile bf = sdxl::parse_batch_text(text, dir().root / "b.json", fallback, &p, {}, &files);
  if (out) *out = bf;
  return p;
}

using sdxl::testing::problem_at;

std::string all_problems(const std::vector<sdxl::BatchProblem>& ps) {
  std::string out;
  for (const auto& p : ps) out += p.pointer + ": " + p.message + "\n";
  return out;
}

const char* kCast = R"("version": 1,
  "characters": {"mara": {"prompt": "red scarf", "negative": "hat", "reference": {"image": "refs/mara.png", "scale": 0.7}},
                 "keeper": {"prompt": "grey beard"},
                 "lora_guy": {"prompt": "x", "loras": [{"path": "refs/mara.png", "weight": 1}]}},
  "styles": {"ink": {"prompt": "{prompt}, ink", "negative": "photo"}},)";

}  // namespace

TEST(Regions, CharactersJoinTheirRegionOnlyAndTheStyleWrapsEach) {
  sdxl::BatchFile bf;
  const auto p = parse(std::string("{") + kCast + R"(
    "defaults": {"negative": "blurry", "ip_adapter": {"model": "refs", "images": []}},
    "tasks": [{"id": "t", "prompt": "two people talking", "style": "ink", "region_base": 0.3,
      "regions": [{"box": [0, 0, 0.5, 1], "prompt": "a woman waving", "character": "mara"},
                  {"mask": "masks/left.png", "prompt": "an old man", "negative": "young", "weight": 2,
                   "character": "keeper"}]}]})", &bf);
  // The IP-Adapter folder is not one: the only problem.
  ASSERT_EQ(p.size(), 1u) << all_problems(p);
  EXPECT_EQ(p[0].pointer, "/defaults/ip_adapter/model");
  const sdxl::GenerationParams& g = bf.tasks[0].params;
  EXPECT_EQ(g.prompt, "two people talking, ink");
  EXPECT_EQ(g.negative_prompt, "blurry, photo");
  ASSERT_EQ(g.regions.size(), 2u);
  EXPECT_EQ(g.regions[0].prompt, "a woman waving, red scarf, ink");
  EXPECT_EQ(g.regions[0].negative, "blurry, hat, photo");  // the task's, then the character's
  EXPECT_EQ(g.regions[0].reference, (dir().root / "refs/mara.png").string());
  EXPECT_DOUBLE_EQ(g.regions[0].reference_scale, 0.7);
  EXPECT_EQ(g.regions[1].prompt, "an old man, grey beard, ink");
  EXPECT_EQ(g.regions[1].negative, "young, photo");
  EXPECT_DOUBLE_EQ(g.regions[1].weight, 2);
  EXPECT_EQ(g.regions[1].mask, (dir().root / "masks/left.png").string());
  EXPECT_EQ(g.regions[1].mask_sha256.size(), 64u);
  EXPECT_DOUBLE_EQ(g.region_base, 0.3);
  EXPECT_TRUE(g.ip_adapter.images.empty());  // the reference acts in its region, not in the task's row
}

TEST(Regions, BadRegionsAreRefusedAtTheirPointers) {
  const auto p = parse(std::string("{") + kCast + R"(
    "tasks": [{"id": "t", "prompt": "x", "regions": [
      {"box": [0, 0, 1.5, 1], "prompt": "a"},
      {"box": [0.5, 0, 0.5, 1], "prompt": "b"},
      {"mask": "masks/black.png", "prompt": "c"},
      {"mask": "masks/missing.png", "prompt": "d"},
      {"mask": "masks/bad.png", "prompt": "e"},
      {"mask": "masks/wide.png", "prompt": "f"},
      {"box": [0, 0, 1, 1], "prompt": "g", "weight": 0},
      {"box": [0, 0, 1, 1], "prompt": "h", "character": "ghost"},
      {"box": [0, 0, 1, 1], "prompt": "i", "character": "lora_guy"},
      {"box": [0, 0, 1, 1], "mask": "masks/left.png", "prompt": "j"},
      {"prompt": "k"},
      {"box": [0, 0, 1, 1], "prompt": "<lora:hero:1> l"},
      {"box": [0, 0, 1, 1], "prompt": "m", "character": "mara"},
      {"box": [0, 0, 1], "prompt": "n"}]}]})");
  const auto at = [&](int k, const std::string& key) { return problem_at(p, "/tasks/0/regions/" + std::to_string(k) + key); };
  EXPECT_NE(at(0, "/box").find("from 0 to 1 (got 1.5)"), std::string::npos) << all_problems(p);
  EXPECT_NE(at(1, "/box").find("no area"), std::string::npos);
  EXPECT_NE(at(2, "/mask").find("all black"), std::string::npos);
  EXPECT_NE(at(3, "/mask").find("missing.png"), std::string::npos);
  EXPECT_NE(at(4, "/mask").find("bad.png"), std::string::npos);
  EXPECT_NE(at(5, "/mask").find("another aspect ratio"), std::string::npos);
  EXPECT_NE(at(6, "/weight").find("positive"), std::string::npos);
  EXPECT_NE(at(7, "/character").find("unknown character 'ghost'"), std::string::npos);
  EXPECT_NE(at(8, "/character").find("has LoRAs"), std::string::npos);
  EXPECT_NE(at(9, "").find("both"), std::string::npos);
  EXPECT_NE(at(10, "").find("needs a \"box\""), std::string::npos);
  EXPECT_NE(at(11, "/prompt").find("<lora:...>"), std::string::npos);
  EXPECT_NE(at(12, "/character").find("no \"ip_adapter\""), std::string::npos);
  EXPECT_NE(at(13, "/box").find("four numbers"), std::string::npos);
  std::string many;
  for (int k = 0; k < 33; ++k) many += std::string(k ? ", " : "") + R"({"box": [0, 0, 1, 1], "prompt": "a"})";
  const auto too_many =
      parse(R"({"version": 1, "tasks": [{"id": "t", "prompt": "x", "region_base": 1.5, "regions": [)" + many + "]}]}");
  EXPECT_NE(problem_at(too_many, "/tasks/0/regions").find("at most 32"), std::string::npos) << all_problems(too_many);
  EXPECT_FALSE(problem_at(too_many, "/tasks/0/region_base").empty()) << all_problems(too_many);
}

TEST(Regions, AModelWithoutRegionalMethodsOrWithFewerIsRefused) {
  sdxl::ModelConfig mc;
  mc.name = "old";
  sdxl::GenerationParams p;
  EXPECT_EQ(sdxl::regions_problem(mc, p), "");  // no regions: nothing to ask of the model
  p.regions.resize(3);
  EXPECT_NE(sdxl::regions_problem(mc, p).find("--max-regions"), std::string::npos);
  mc.unet_regions.downscales = {2, 4};
  mc.unet_regions.max_regions = 2;
  EXPECT_NE(sdxl::regions_problem(mc, p).find("allows at most 2"), std::string::npos);
  mc.unet_regions.max_regions = 8;
  EXPECT_EQ(sdxl::regions_problem(mc, p), "");
  mc.unet_precision = "fp8";
  EXPECT_NE(sdxl::regions_problem(mc, p).find("--precision fp8"), std::string::npos);
}

TEST(Regions, ParametersManifestAndBatchingFollowTheRegions) {
  sdxl::GenerationParams p;
  p.prompt = "two people";
  sdxl::RegionUse a;
  a.x0 = 0, a.y0 = 0, a.x1 = 0.5, a.y1 = 1;
  a.prompt = "a woman, waving";
  a.character = "mara";
  sdxl::RegionUse b;
  b.mask = "/m/right.png";
  b.mask_sha256 = std::string(64, 'a');
  b.prompt = "an old man";
  b.weight = 2;
  p.regions = {a, b};
  const std::string text = sdxl::a1111_parameters(p, "m");
  EXPECT_NE(text.find("RP Active: True, RP Divide mode: Mask, RP Mask submode: Mask, RP Calc Mode: Attention, "
                      "RP Base Ratios: 0.2"),
            std::string::npos) << text;
  EXPECT_NE(text.find(R"(Region 1: "Box: 0 0 0.5 1, Weight: 1, Character: mara, Prompt: a woman, waving")"),
            std::string::npos) << text;
  EXPECT_NE(text.find(R"(Region 2: "Mask: right.png [aaaaaaaaaa], Weight: 2, Prompt: an old man")"), std::string::npos);

  nlohmann::json params;
  sdxl::record_regions(p, params);
  sdxl::GenerationParams back;
  sdxl::restore_regions(params, back);
  EXPECT_TRUE(back.regions == p.regions);
  EXPECT_TRUE(sdxl::same_settings(p, p));
  sdxl::GenerationParams moved = p;
  moved.regions[0].x1 = 0.6;
  EXPECT_FALSE(sdxl::same_settings(p, moved));  // a change remakes the image
  sdxl::GenerationParams base = p;
  base.region_base = 0.5;
  EXPECT_FALSE(sdxl::same_settings(p, base));
  sdxl::GenerationParams none;
  none.prompt = p.prompt;
  EXPECT_EQ(sdxl::batch_group_key(p), sdxl::batch_group_key(none));  // panels with and without regions share calls
  p.ip_adapter.model = "/ip";
  none.ip_adapter.model = "/ip";
  EXPECT_NE(sdxl::batch_group_key(p), sdxl::batch_group_key(none));  // masked groups vs one row of tokens
}

TEST(Regions, GenerateFlagsParse) {
  const sdxl::RegionUse r = sdxl::parse_region_flag("0,0.25,0.5,1:a woman: waving");
  EXPECT_DOUBLE_EQ(r.y0, 0.25);
  EXPECT_EQ(r.prompt, "a woman: waving");
  EXPECT_THROW(sdxl::parse_region_flag("0,0,0.5:x"), sdxl::UsageError);
  EXPECT_THROW(sdxl::parse_region_flag("0,0,0.5,1"), sdxl::UsageError);
  EXPECT_THROW(sdxl::parse_region_flag("0,0,0,1:x"), sdxl::UsageError);
  const sdxl::RegionUse m = sdxl::parse_region_mask_flag("masks/left.png:a cat");
  EXPECT_EQ(m.mask, "masks/left.png");
  EXPECT_EQ(m.prompt, "a cat");
}
