#include <gtest/gtest.h>

#include "sdxl/batch_file.h"
#include "sdxl/error.h"

namespace {

std::vector<sdxl::BatchProblem> problems_of(const std::string& text) {
  std::vector<sdxl::BatchProblem> p;
  sdxl::parse_batch_text(text, "b.json", sdxl::GenerationParams{}, &p);
  return p;
}

bool has(const std::vector<sdxl::BatchProblem>& ps, const std::string& pointer) {
  for (const auto& p : ps)
    if (p.pointer == pointer) return true;
  return false;
}

}  // namespace

TEST(BatchFile, DefaultsApplyAndTasksOverride) {
  std::vector<sdxl::BatchProblem> p;
  auto bf = sdxl::parse_batch_text(R"({"version": 1, "defaults": {"negative": "blurry", "steps": 12, "width": 512},
      "tasks": [{"id": "a", "prompt": "cat", "seed": 7, "count": 2},
                {"id": "b", "prompt": "dog", "steps": 20, "negative": "", "seed": -1}]})",
                                   "b.json", sdxl::GenerationParams{}, &p);
  ASSERT_TRUE(p.empty());
  ASSERT_EQ(bf.tasks.size(), 2u);
  EXPECT_EQ(bf.tasks[0].params.negative_prompt, "blurry");
  EXPECT_EQ(bf.tasks[0].params.steps, 12);
  EXPECT_EQ(bf.tasks[0].params.width, 512);
  EXPECT_EQ(bf.tasks[0].params.seed, 7);
  EXPECT_EQ(bf.tasks[0].count, 2);
  EXPECT_FALSE(bf.tasks[0].seed_random);
  EXPECT_EQ(bf.tasks[1].params.steps, 20);
  EXPECT_EQ(bf.tasks[1].params.negative_prompt, "");
  EXPECT_TRUE(bf.tasks[1].seed_random);
}

TEST(BatchFile, EveryProblemIsListedWithItsPointer) {
  auto p = problems_of(R"({"version": 1, "tasks": [
      {"id": "a", "prompt": "x", "steps": 500},
      {"id": "a", "prompt": "y", "width": 100},
      {"prompt": "z", "colour": "red"},
      {"id": "d"}]})");
  EXPECT_TRUE(has(p, "/tasks/0/steps"));
  EXPECT_TRUE(has(p, "/tasks/1/id"));
  EXPECT_TRUE(has(p, "/tasks/1/width"));
  EXPECT_TRUE(has(p, "/tasks/2/id"));
  EXPECT_TRUE(has(p, "/tasks/2/colour"));
  EXPECT_TRUE(has(p, "/tasks/3/prompt"));
}

TEST(BatchFile, StructuralErrors) {
  EXPECT_TRUE(has(problems_of("[1,2]"), ""));
  EXPECT_TRUE(has(problems_of(R"({"version": 1, "tasks": []})"), "/tasks"));
  EXPECT_TRUE(has(problems_of(R"({"tasks": [{"id": "a", "prompt": "x"}]})"), "/version"));
  EXPECT_FALSE(problems_of("{not json").empty());
}

TEST(BatchFile, ParseFileThrowsUsageErrorListingProblems) {
  try {
    sdxl::parse_batch_file("/nonexistent/batch.json", sdxl::GenerationParams{});
    FAIL();
  } catch (const sdxl::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/batch.json"), std::string::npos);
  }
}

TEST(BatchFile, OutputNamesAreSafe) {
  sdxl::BatchTask t;
  t.id = "../scene 1/ok";
  EXPECT_EQ(sdxl::output_file_name(t, 2, 44), "_.._scene_1_ok-2-44.png");
  t.id = "scene-01";
  EXPECT_EQ(sdxl::output_file_name(t, 0, 7), "scene-01-0-7.png");
}

TEST(GenerationParams, A1111Format) {
  sdxl::GenerationParams p;
  p.prompt = "a cat";
  p.negative_prompt = "blurry";
  p.seed = 42;
  p.steps = 28;
  p.cfg = 7;
  p.width = 1024;
  p.height = 768;
  EXPECT_EQ(sdxl::a1111_parameters(p, "sdxl-base"),
            "a cat\nNegative prompt: blurry\nSteps: 28, Sampler: Euler, Schedule type: Automatic, CFG scale: 7, "
            "Seed: 42, Size: 1024x768, Model: sdxl-base, Version: sdxl-batch 0.1.0");
  p.negative_prompt.clear();
  p.cfg = 7.5;
  EXPECT_EQ(sdxl::a1111_parameters(p, "a,b").find("Negative prompt"), std::string::npos);
  EXPECT_NE(sdxl::a1111_parameters(p, "a,b").find("CFG scale: 7.5"), std::string::npos);
  EXPECT_NE(sdxl::a1111_parameters(p, "a,b").find("Model: \"a,b\""), std::string::npos);
}
