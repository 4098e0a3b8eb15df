// The public API's boundary without a model: public error types and exit
// codes, problems with file, line and pointer. The model's side runs in the
// api_example test (tests/api/example_api.cpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sdxl_batch/sdxl_batch.h>

#include "scheduler/task_queue.h"

namespace fs = std::filesystem;

namespace {

fs::path write_temp(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("sdxl_api_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p;
}

}  // namespace

TEST(Api, CheckListsEveryProblemWithFileLineAndPointer) {
  const fs::path p = write_temp("bad.json", R"({"version": 1,
  "tasks": [
    {"id": "a", "prompt": "cat", "steps": 0},
    {"id": "b", "prompt": "dog", "width": 100, "sampler": "no such sampler"}
  ]})");
  const sdxl_batch::CheckReport r = sdxl_batch::check_batch_file(p.string());
  fs::remove(p);
  EXPECT_FALSE(r.ok());
  bool steps = false, width = false;
  for (const auto& pr : r.problems) {
    EXPECT_EQ(pr.file, p.string());
    if (pr.pointer == "/tasks/0/steps") steps = pr.line == 3;
    if (pr.pointer == "/tasks/1/width") width = pr.line == 4;
  }
  EXPECT_TRUE(steps && width) << r.problems.size() << " problem(s)";
}

TEST(Api, CheckExpandsEveryImagesPrompt) {
  const fs::path p = write_temp("ok.json", R"({"version": 1,
  "tasks": [{"id": "a", "prompt": "a {red|blue} kite", "seed": 5, "count": 2},
            {"id": "b", "prompt": "a {red|blue} boat", "count": 3}]})");
  sdxl_batch::CheckOptions o;
  o.expand = true;
  const sdxl_batch::CheckReport r = sdxl_batch::check_batch_file(p.string(), o);
  fs::remove(p);
  ASSERT_TRUE(r.ok()) << r.problems[0].pointer << ": " << r.problems[0].message;
  ASSERT_EQ(r.expansions.size(), 2u);
  ASSERT_EQ(r.expansions[0].images.size(), 2u);
  EXPECT_EQ(r.expansions[0].images[1].seed, std::optional<std::int64_t>(6));
  EXPECT_EQ(r.expansions[0].images[0].picked.size(), 1u);
  EXPECT_TRUE(r.expansions[1].drawn_at_run_time) << "a random seed draws the wildcards at run time";
}

TEST(Api, ErrorsArePublicTypesWithTheirExitCodes) {
  try {
    sdxl_batch::Session s({.model_dir = "/nonexistent/model"});
    FAIL() << "a missing model folder opens";
  } catch (const sdxl_batch::ModelError& e) {
    EXPECT_EQ(e.exit_code(), 1);
  }
  EXPECT_THROW(sdxl_batch::check_batch_file("/nonexistent/batch.json"), sdxl_batch::UsageError);
  EXPECT_THROW(sdxl_batch::parse_shard("3/2"), sdxl_batch::UsageError);
  EXPECT_EQ(sdxl_batch::parse_size_bytes("2GiB"), 2ull << 30);
  EXPECT_DOUBLE_EQ(sdxl_batch::parse_duration_seconds("1h30m"), 5400.0);
}

// One --max-batch default: the public RunOptions' is the queue's (scheduler/task_queue.h), and the CLI takes
// the public one.
TEST(Api, MaxBatchHasOneDefault) {
  EXPECT_EQ(sdxl_batch::RunOptions{}.max_batch, sdxl::kDefaultMaxBatch);
  EXPECT_EQ(sdxl::QueuePolicy{}.max_batch, sdxl::kDefaultMaxBatch);
}
