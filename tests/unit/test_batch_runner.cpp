// run_batch with a fake generator: resume, sha256 checks, shards, failures,
// stop and max-runtime, templates. The real generator runs in the e2e tests.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "sdxl/batch_runner.h"
#include "sdxl/manifest.h"
#include "sdxl/run_lock.h"
#include "sdxl/sha256.h"

namespace fs = std::filesystem;

namespace {

struct Fixture : ::testing::Test {
  fs::path dir;
  int calls = 0;
  std::set<std::string> fail_prompts;
  std::atomic<bool> stop{false};
  int stop_after = -1;

  void SetUp() override {
    dir = fs::temp_directory_path() / ("sdxl_runner_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }

  sdxl::BatchFile batch(const std::string& json) {
    std::vector<sdxl::BatchProblem> problems;
    sdxl::GenerationParams fallback;
    fallback.width = 16;
    fallback.height = 8;
    fallback.steps = 2;
    auto bf = sdxl::parse_batch_text(json, dir / "batch.json", fallback, &problems);
    EXPECT_TRUE(problems.empty()) << (problems.empty() ? "" : problems[0].pointer + " " + problems[0].message);
    return bf;
  }

  sdxl::RunResult run(const sdxl::BatchFile& bf, sdxl::RunOptions o = {}) {
    o.out_dir = dir / "out";
    o.model_name = "fake";
    o.stop = &stop;
    return sdxl::run_batch(bf, o, [this](const sdxl::GenerationParams& p) {
      if (fail_prompts.count(p.prompt)) throw sdxl::TaskError("injected failure for " + p.prompt);
      ++calls;
      if (stop_after >= 0 && calls >= stop_after) stop = true;
      sdxl::GeneratedImage img;
      img.width = p.width;
      img.height = p.height;
      img.rgb.assign(static_cast<size_t>(p.width * p.height * 3), static_cast<std::uint8_t>(p.seed * 37 + 11));
      return img;
    });
  }

  std::vector<nlohmann::json> manifest_lines() {
    std::vector<nlohmann::json> out;
    std::ifstream in(dir / "out" / "manifest.jsonl");
    std::string line;
    while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
    return out;
  }
};

const char* kBatch = R"({"version": 1, "tasks": [
  {"id": "a", "prompt": "alpha", "seed": 10, "count": 2},
  {"id": "b", "prompt": "beta", "seed": 20},
  {"id": "c", "prompt": "gamma", "seed": -1, "count": 2}]})";

}  // namespace

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sdxl::sha256_hex({}), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string abc = "abc";
  EXPECT_EQ(sdxl::sha256_hex({reinterpret_cast<const std::uint8_t*>(abc.data()), abc.size()}),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string m(1000000, 'a');
  EXPECT_EQ(sdxl::sha256_hex({reinterpret_cast<const std::uint8_t*>(m.data()), m.size()}),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_F(Fixture, FreshRunThenRerunSkipsEverything) {
  auto bf = batch(kBatch);
  auto r = run(bf);
  EXPECT_EQ(r.total, 5);
  EXPECT_EQ(r.done, 5);
  EXPECT_EQ(r.exit_code(), sdxl::ExitCode::kOk);
  EXPECT_TRUE(fs::exists(dir / "out" / "a-1-11.png"));
  ASSERT_EQ(manifest_lines().size(), 5u);
  for (const auto& l : manifest_lines())
    EXPECT_EQ(*sdxl::sha256_file_hex(dir / "out" / l["file"].get<std::string>()), l["sha256"].get<std::string>());
  calls = 0;
  r = run(bf);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(r.skipped, 5);
  EXPECT_EQ(manifest_lines().size(), 5u) << "a rerun must not duplicate lines";
  auto report = nlohmann::json::parse(std::ifstream(dir / "out" / "report.json"));
  EXPECT_EQ(report["images_skipped"], 5);
}

TEST_F(Fixture, RandomSeedsComeBackFromTheManifest) {
  auto bf = batch(kBatch);
  run(bf);
  std::int64_t seed_c0 = -1;
  for (const auto& l : manifest_lines())
    if (l["task"] == "c" && l["index"] == 0) seed_c0 = l["seed"].get<std::int64_t>();
  ASSERT_GE(seed_c0, 0);
  fs::remove(dir / "out" / ("c-1-" + std::to_string(seed_c0 + 1) + ".png"));
  calls = 0;
  auto r = run(bf);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(fs::exists(dir / "out" / ("c-1-" + std::to_string(seed_c0 + 1) + ".png")));
  EXPECT_EQ(r.done, 1);
  EXPECT_EQ(r.skipped, 4);
}

TEST_F(Fixture, MissingCorruptOrChangedImagesAreRedone) {
  auto bf = batch(kBatch);
  run(bf);
  fs::remove(dir / "out" / "a-0-10.png");
  {
    std::fstream f(dir / "out" / "b-0-20.png", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(60);
    f.put('X');
  }
  bf.tasks[0].count = 2;
  bf.tasks[0].params.prompt = "alpha";
  calls = 0;
  auto r = run(bf);
  EXPECT_EQ(calls, 2);
  bf.tasks[1].params.prompt = "beta, edited";
  calls = 0;
  r = run(bf);
  EXPECT_EQ(calls, 1) << "an edited prompt regenerates that task only";
}

TEST_F(Fixture, ForceRegeneratesEverything) {
  auto bf = batch(kBatch);
  run(bf);
  calls = 0;
  sdxl::RunOptions o;
  o.force = true;
  auto r = run(bf, o);
  EXPECT_EQ(calls, 5);
  EXPECT_EQ(r.done, 5);
}

TEST_F(Fixture, ShardsTogetherMakeTheWholeBatchOnce) {
  auto bf = batch(R"({"version": 1, "tasks": [
    {"id": "t0", "prompt": "0", "seed": 1}, {"id": "t1", "prompt": "1", "seed": 2, "count": 3},
    {"id": "t2", "prompt": "2", "seed": 3}, {"id": "t3", "prompt": "3", "seed": 4},
    {"id": "t4", "prompt": "4", "seed": 5, "count": 2}, {"id": "t5", "prompt": "5", "seed": 6},
    {"id": "t6", "prompt": "6", "seed": 7}]})");
  int total = 0;
  for (int k = 0; k < 3; ++k) {
    sdxl::RunOptions o;
    o.shard_index = k;
    o.shard_count = 3;
    total += run(bf, o).done;
    EXPECT_TRUE(fs::exists(dir / "out" / ("report-shard-" + std::to_string(k) + "-of-3.json")));
  }
  EXPECT_EQ(total, 10);
  EXPECT_EQ(calls, 10);
  std::set<std::pair<std::string, int>> seen;
  for (const auto& l : manifest_lines())
    EXPECT_TRUE(seen.insert(std::make_pair(l["task"].get<std::string>(), l["index"].get<int>())).second) << l.dump();
  EXPECT_EQ(seen.size(), 10u);
  calls = 0;
  EXPECT_EQ(run(bf).skipped, 10) << "an unsharded rerun sees the shards' work as done";
}

TEST_F(Fixture, AFailedTaskDoesNotStopTheBatch) {
  auto bf = batch(kBatch);
  fail_prompts = {"beta"};
  auto r = run(bf);
  EXPECT_EQ(r.done, 4);
  EXPECT_EQ(r.failed, 1);
  EXPECT_EQ(r.exit_code(), sdxl::ExitCode::kTasksFailed);
  auto report = nlohmann::json::parse(std::ifstream(dir / "out" / "report.json"));
  ASSERT_EQ(report["failures"].size(), 1u);
  EXPECT_NE(report["failures"][0]["error"].get<std::string>().find("injected failure"), std::string::npos);
  fail_prompts.clear();
  calls = 0;
  r = run(bf);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(r.exit_code(), sdxl::ExitCode::kOk);
}

TEST_F(Fixture, StopFinishesTheImageInFlightAndARerunCompletes) {
  auto bf = batch(kBatch);
  stop_after = 2;
  auto r = run(bf);
  EXPECT_EQ(r.done, 2);
  EXPECT_EQ(r.not_started, 3);
  EXPECT_EQ(r.stop_reason, "stopped by a signal");
  EXPECT_EQ(r.exit_code(), sdxl::ExitCode::kTasksFailed);
  EXPECT_TRUE(fs::exists(dir / "out" / "report.json"));
  stop = false;
  stop_after = -1;
  calls = 0;
  r = run(bf);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(r.skipped, 2);
}

TEST_F(Fixture, MaxRuntimeStopsTakingNewImages) {
  auto bf = batch(kBatch);
  sdxl::RunOptions o;
  o.max_runtime_s = 1e-9;
  auto r = run(bf, o);
  EXPECT_EQ(r.done + r.not_started, 5);
  EXPECT_LE(r.done, 1);
  EXPECT_EQ(r.stop_reason, "--max-runtime reached");
}

TEST_F(Fixture, TemplatesWithFoldersAndLinksThatEscape) {
  auto bf = batch(R"({"version": 1, "output": {"template": "{date}/{id}/{index}-{width}x{height}.png"},
                      "tasks": [{"id": "a", "prompt": "x", "seed": 1}]})");
  run(bf);
  const auto lines = manifest_lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(fs::exists(dir / "out" / lines[0]["file"].get<std::string>()));
  EXPECT_NE(lines[0]["file"].get<std::string>().find("/a/0-16x8.png"), std::string::npos);
  // A link inside the output folder that points outside it is refused.
  fs::create_directories(dir / "elsewhere");
  fs::create_directory_symlink(dir / "elsewhere", dir / "out" / "escape");
  auto bf2 = batch(R"({"version": 1, "output": {"template": "escape/sub/{index}.png"},
                       "tasks": [{"id": "b", "prompt": "y", "seed": 1}]})");
  auto r = run(bf2);
  EXPECT_EQ(r.failed, 1);
  EXPECT_TRUE(fs::is_empty(dir / "elsewhere"));
}

TEST(RunLock, SecondHolderGetsExitCode4) {
  const auto path = fs::temp_directory_path() / ("sdxl_lock_" + std::to_string(::getpid()));
  sdxl::RunLock first(path);
  try {
    sdxl::RunLock second(path);
    FAIL() << "second lock acquired";
  } catch (const sdxl::Error& e) {
    EXPECT_EQ(e.code(), sdxl::ExitCode::kLocked);
    EXPECT_NE(std::string(e.what()).find(std::to_string(::getpid())), std::string::npos) << e.what();
  }
}

TEST(Manifest, TornLastLineIsIgnored) {
  const auto path = fs::temp_directory_path() / ("sdxl_manifest_" + std::to_string(::getpid()) + ".jsonl");
  fs::remove(path);
  {
    sdxl::Manifest m(path);
    sdxl::ManifestEntry e;
    e.task = "a";
    e.file = "a.png";
    e.sha256 = "00";
    m.append(e);
  }
  {
    std::ofstream(path, std::ios::app) << "{\"task\": \"b\", \"ind";
  }
  sdxl::Manifest m(path);
  EXPECT_EQ(m.size(), 1u);
  EXPECT_EQ(m.torn_lines(), 1);
  EXPECT_TRUE(m.find("a", 0).has_value());
  fs::remove(path);
}
