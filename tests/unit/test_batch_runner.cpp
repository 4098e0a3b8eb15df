// run_batch with a fake generator: resume, sha256 checks, shards, failures,
// stop and max-runtime, templates. The real generator runs in the e2e tests.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <thread>
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
  std::vector<int> batch_sizes;
  std::vector<std::string> order;  // prompt#seed in generation order

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
    return sdxl::run_batch(bf, o, [this](const std::vector<sdxl::GenerationParams>& ps, const sdxl::StepHook& hook) {
      batch_sizes.push_back(static_cast<int>(ps.size()));
      std::vector<sdxl::GeneratedImage> out;
      for (const auto& p : ps) {
        if (fail_prompts.count(p.prompt)) throw sdxl::TaskError("injected failure for " + p.prompt);
        order.push_back(p.prompt + "#" + std::to_string(p.seed));
        if (hook) hook(1, 1);
      }
      for (const auto& p : ps) {
        ++calls;
        if (stop_after >= 0 && calls >= stop_after) stop = true;
        sdxl::GeneratedImage img;
        img.width = p.width;
        img.height = p.height;
        img.rgb.assign(static_cast<size_t>(p.width * p.height * 3), static_cast<std::uint8_t>(p.seed * 37 + 11));
        out.push_back(std::move(img));
      }
      return out;
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
  sdxl::RunOptions one_at_a_time;
  one_at_a_time.queue.max_batch = 1;
  auto r = run(bf, one_at_a_time);
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

namespace {

// A fake device: `weights` always allocated; a batch of n images needs
// `per_image * n` bytes above that; beyond `limit` it runs out of memory like
// the CUDA allocator would.
struct FakeDevice {
  std::uint64_t limit = 10000, weights = 4000, per_image = 1000, allocated = 4000, peak = 4000;
  int ooms = 0;
  int releases = 0;
  sdxl::DeviceHooks hooks() {
    sdxl::DeviceHooks h;
    h.memory = [this] {
      sdxl::MemorySnapshot m;
      m.allocated = allocated;
      m.reserved = allocated + 100;
      m.peak_allocated = peak;
      m.peak_reserved = peak + 100;
      m.limit = limit;
      return m;
    };
    h.reset_peak = [this] { peak = allocated; };
    h.release_cached = [this] { ++releases; };
    return h;
  }
  void run(size_t n) {
    const std::uint64_t need = weights + per_image * n;
    if (need > limit) {
      ++ooms;
      throw sdxl::OutOfMemoryError("CUDA out of memory. Tried to allocate " + std::to_string(need - limit) + " bytes");
    }
    peak = std::max(peak, need);
  }
};

// Flat grey images of the batch's size, one per params entry.
std::vector<sdxl::GeneratedImage> grey_images(const std::vector<sdxl::GenerationParams>& ps, std::uint8_t level) {
  std::vector<sdxl::GeneratedImage> out(ps.size());
  for (auto& g : out) {
    g.width = ps[0].width;
    g.height = ps[0].height;
    g.rgb.assign(static_cast<size_t>(g.width * g.height * 3), level);
  }
  return out;
}

std::string many_tasks(int n, const std::string& extra = "") {
  std::string s = R"({"version": 1, "tasks": [)";
  for (int i = 0; i < n; ++i)
    s += std::string(i ? "," : "") + R"({"id": "t)" + std::to_string(i) + R"(", "prompt": "p)" + std::to_string(i) +
         R"(", "seed": )" + std::to_string(i) + extra + "}";
  return s + "]}";
}

}  // namespace

TEST_F(Fixture, HigherPrioritiesRunFirstAndImagesAreBatched) {
  auto bf = batch(R"({"version": 1, "tasks": [
    {"id": "l", "prompt": "low", "seed": 1, "priority": "low"},
    {"id": "m", "prompt": "mid", "seed": 2, "count": 2},
    {"id": "h", "prompt": "high", "seed": 3, "priority": "high"},
    {"id": "big", "prompt": "other size", "seed": 4, "priority": "high", "width": 24}]})");
  sdxl::RunOptions o;
  o.queue.max_batch = 2;
  o.queue.fill_lower = false;
  auto r = run(bf, o);
  EXPECT_EQ(r.done, 5);
  EXPECT_EQ(order, (std::vector<std::string>{"high#3", "other size#4", "mid#2", "mid#3", "low#1"}));
  EXPECT_EQ(batch_sizes, (std::vector<int>{1, 1, 2, 1}));
  auto report = nlohmann::json::parse(std::ifstream(dir / "out" / "report.json"));
  EXPECT_EQ(report["queue"]["batches"], 4);
  EXPECT_EQ(report["batches"].size(), 4u);
}

TEST_F(Fixture, AdmissionFollowsTheMeasuredBudget) {
  auto bf = batch(many_tasks(12));
  FakeDevice dev;  // 6000 bytes free for work: 1000 per image
  sdxl::WorkEstimator est;
  sdxl::RunOptions o;
  o.queue.max_batch = 8;
  o.device = dev.hooks();
  o.estimator = &est;
  o.safety = 1.2;
  auto r = sdxl::run_batch(bf, [&] {
    o.out_dir = dir / "out";
    o.model_name = "fake";
    return o;
  }(), [&](const std::vector<sdxl::GenerationParams>& ps, const sdxl::StepHook&) {
    batch_sizes.push_back(static_cast<int>(ps.size()));
    dev.run(ps.size());
    return grey_images(ps, 7);
  });
  EXPECT_EQ(r.done, 12);
  EXPECT_EQ(dev.ooms, 0);
  // First a probe of one image (size never measured), then 6000 / (1000 x 1.2) = 5 at a time.
  ASSERT_GE(batch_sizes.size(), 2u);
  EXPECT_EQ(batch_sizes[0], 1);
  EXPECT_EQ(batch_sizes[1], 5);
  EXPECT_EQ(est.peak_bytes(16, 8, 1), 1000u);
}

TEST_F(Fixture, OutOfMemoryHalvesTheBatchAndNothingIsLost) {
  auto bf = batch(many_tasks(8));
  FakeDevice dev;
  dev.limit = 7500;  // 3 images fit, 4 do not
  sdxl::RunOptions o;
  o.queue.max_batch = 8;
  o.device = dev.hooks();
  o.out_dir = dir / "out";
  o.model_name = "fake";
  auto r = sdxl::run_batch(bf, o, [&](const std::vector<sdxl::GenerationParams>& ps, const sdxl::StepHook&) {
    batch_sizes.push_back(static_cast<int>(ps.size()));
    dev.run(ps.size());
    return grey_images(ps, 9);
  });
  EXPECT_EQ(r.done, 8);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.oom_recoveries, 2);  // 8 -> 4 -> 2
  EXPECT_GE(dev.releases, 2) << "cached blocks are freed after each OOM";
  EXPECT_EQ(batch_sizes, (std::vector<int>{8, 4, 2, 2, 2, 2}));
  EXPECT_EQ(manifest_lines().size(), 8u);
}

TEST_F(Fixture, ASingleImageThatStillRunsOutOfMemoryFailsAloneAfterItsRetries) {
  auto bf = batch(many_tasks(3));
  sdxl::RunOptions o;
  o.retries = 2;
  o.retry_backoff_s = 0.01;
  o.out_dir = dir / "out";
  o.model_name = "fake";
  int attempts_p1 = 0;
  auto r = sdxl::run_batch(bf, o, [&](const std::vector<sdxl::GenerationParams>& ps, const sdxl::StepHook&) {
    for (const auto& p : ps)
      if (p.prompt == "p1") {
        ++attempts_p1;
        throw sdxl::TaskError("unet failed: CUDA out of memory. Tried to allocate 2.00 GiB");
      }
    return grey_images(ps, 5);
  });
  EXPECT_EQ(r.done, 2);
  EXPECT_EQ(r.failed, 1);
  EXPECT_EQ(attempts_p1, 1 + 1 + 2) << "in the batch, alone, then two retries";
  auto report = nlohmann::json::parse(std::ifstream(dir / "out" / "report.json"));
  ASSERT_EQ(report["failures"].size(), 1u);
  EXPECT_EQ(report["failures"][0]["task"], "t1");
  EXPECT_EQ(report["failures"][0]["attempts"], 3);
}

TEST_F(Fixture, FlakyFailuresAreRetriedWithBackoff) {
  auto bf = batch(many_tasks(2));
  sdxl::RunOptions o;
  o.retries = 1;
  o.retry_backoff_s = 0.2;
  o.queue.max_batch = 1;
  o.out_dir = dir / "out";
  o.model_name = "fake";
  int calls_t0 = 0;
  std::vector<std::chrono::steady_clock::time_point> t0_times;
  auto r = sdxl::run_batch(bf, o, [&](const std::vector<sdxl::GenerationParams>& ps, const sdxl::StepHook&) {
    if (ps[0].prompt == "p0") {
      t0_times.push_back(std::chrono::steady_clock::now());
      if (++calls_t0 == 1) throw sdxl::TaskError("transient: driver hiccup");
    }
    return grey_images(ps, 1);
  });
  EXPECT_EQ(r.done, 2);
  EXPECT_EQ(r.retries, 1);
  ASSERT_EQ(t0_times.size(), 2u);
  EXPECT_GE(std::chrono::duration<double>(t0_times[1] - t0_times[0]).count(), 0.19);
}

TEST_F(Fixture, ATaskPastItsTimeoutIsCancelledBetweenSteps) {
  auto bf = batch(R"({"version": 1, "tasks": [
    {"id": "slow", "prompt": "slow", "seed": 1, "timeout": 0.05},
    {"id": "fast", "prompt": "fast", "seed": 2, "width": 24}]})");
  sdxl::RunOptions o;
  o.retries = 3;  // a timeout is not retried
  o.out_dir = dir / "out";
  o.model_name = "fake";
  int steps_run = 0;
  auto r = sdxl::run_batch(bf, o, [&](const std::vector<sdxl::GenerationParams>& ps, const sdxl::StepHook& hook) {
    for (int s = 1; s <= 20; ++s) {
      if (ps[0].prompt == "slow") std::this_thread::sleep_for(std::chrono::milliseconds(10));
      ++steps_run;
      hook(s, 20);
    }
    return grey_images(ps, 1);
  });
  EXPECT_EQ(r.done, 1);
  EXPECT_EQ(r.failed, 1);
  EXPECT_LT(steps_run, 40) << "the slow task stopped early";
  auto report = nlohmann::json::parse(std::ifstream(dir / "out" / "report.json"));
  EXPECT_NE(report["failures"][0]["error"].get<std::string>().find("timed out"), std::string::npos);
}

TEST_F(Fixture, DryRunPlansWithoutWriting) {
  auto bf = batch(many_tasks(5, R"(, "priority": "low")"));
  sdxl::RunOptions o;
  o.out_dir = dir / "planned";
  o.queue.max_batch = 2;
  auto plan = sdxl::plan_batch(bf, o, UINT64_MAX);
  EXPECT_EQ(plan.to_make, 5);
  ASSERT_EQ(plan.batches.size(), 3u);
  EXPECT_EQ(plan.batches[0].images, (std::vector<std::string>{"t0#0", "t1#0"}));
  EXPECT_EQ(plan.batches[0].priority, "low");
  EXPECT_LT(plan.est_seconds, 0) << "nothing measured";
  EXPECT_FALSE(fs::exists(dir / "planned")) << "a dry run creates nothing";
  // After a run, the plan knows what is done.
  run(bf);
  o.out_dir = dir / "out";
  plan = sdxl::plan_batch(bf, o, UINT64_MAX);
  EXPECT_EQ(plan.to_make, 0);
  EXPECT_EQ(plan.skipped, 5);
}

TEST(OutOfMemoryMessages, AreRecognised) {
  EXPECT_TRUE(sdxl::is_out_of_memory_message("CUDA out of memory. Tried to allocate 20.00 MiB"));
  EXPECT_TRUE(sdxl::is_out_of_memory_message("The following operation failed in the TorchScript interpreter.\n"
                                             "RuntimeError: CUDA error: out of memory"));
  EXPECT_TRUE(sdxl::is_out_of_memory_message("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)"));
  EXPECT_TRUE(sdxl::is_out_of_memory_message("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1"));
  EXPECT_FALSE(sdxl::is_out_of_memory_message("shape mismatch: [2, 4] vs [2, 5]"));
}
