// run_batch with a fake generator: resume, sha256 checks, shards, failures,
// stop and max-runtime, templates. The real generator runs in the e2e tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <fstream>
#include <functional>
#include <thread>
#include <nlohmann/json.hpp>
#include <set>

#include "pipeline/detailer.h"
#include "scheduler/detailer_flow.h"
#include "scheduler/run_batch.h"
#include "scheduler/work_list.h"
#include "batch/manifest.h"
#include "core/run_lock.h"
#include "core/sha256.h"

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

  // The lines of every manifest in the output folder (the plain run's and each shard's).
  std::vector<nlohmann::json> manifest_lines() {
    std::vector<nlohmann::json> out;
    std::error_code ec;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir / "out", ec))
      if (sdxl::is_manifest_file_name(e.path().filename().string())) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f);
      std::string line;
      while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
    }
    return out;
  }
};

const char* kBatch = R"({"version": 1, "tasks": [
  {"id": "a", "prompt": "alpha", "seed": 10, "count": 2},
  {"id": "b", "prompt": "beta", "seed": 20},
  {"id": "c", "prompt": "gamma", "seed": -1, "count": 2}]})";

}  // namespace

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

// The report says which CUDA allocator settings ran (what cmd_run's hook returns).
TEST_F(Fixture, ReportNamesTheAllocatorSettings) {
  sdxl::RunOptions o;
  o.allocator = [] { return std::string("expandable_segments:True"); };
  run(batch(kBatch), o);
  auto report = nlohmann::json::parse(std::ifstream(dir / "out" / "report.json"));
  EXPECT_EQ(report["memory"]["allocator"], "expandable_segments:True");
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

TEST_F(Fixture, EventsNameEveryImageWrittenAndEveryFailure) {
  auto bf = batch(kBatch);
  fail_prompts = {"beta"};
  std::vector<sdxl::ImageEvent> images;
  std::vector<sdxl::FailureEvent> failures;
  sdxl::RunOptions o;
  o.on_image = [&](const sdxl::ImageEvent& e) { images.push_back(e); };
  o.on_failure = [&](const sdxl::FailureEvent& e) { failures.push_back(e); };
  const auto r = run(bf, o);
  ASSERT_EQ(images.size(), static_cast<size_t>(r.done));
  for (const auto& e : images) {
    EXPECT_TRUE(fs::is_regular_file(e.path)) << e.path;
    EXPECT_EQ(e.path.filename().string(), fs::path(e.file).filename().string());
  }
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_NE(failures[0].error.find("injected failure"), std::string::npos);
  images.clear();
  fail_prompts.clear();
  run(bf, o);
  EXPECT_EQ(images.size(), 1u) << "a rerun reports only the image it makes";
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

// A rerun skips a finished image only when its manifest line has the task's
// settings: every setting the resume check compares must survive the round trip.
TEST(Manifest, KeepsEverySettingTheResumeCheckCompares) {
  const auto path = fs::temp_directory_path() / ("sdxl_manifest_rt_" + std::to_string(::getpid()) + ".jsonl");
  fs::remove(path);
  sdxl::ManifestEntry e;
  e.task = "panel";
  e.file = "panel.png";
  e.sha256 = "00";
  e.seed = 7;
  sdxl::GenerationParams& p = e.params;
  p.seed = 7;
  p.prompt = "a lighthouse";
  p.guidance_rescale = 0.3;
  p.clip_skip = 3;
  p.init_image = "/in/p01.png";
  p.strength = 0.55;
  p.hires.scale = 1.5;
  p.hires.upscaler = "Nearest";
  p.hires.steps = 9;
  p.hires.denoise = 0.4;
  p.loras.push_back({"ink", "/l/ink.safetensors", 0.8});
  p.vae = "/vaes/fp16-fix";
  p.controlnets.push_back({"/cn/pose", "/poses/p01.png", 0.8, 0.1, 0.9, "", false});
  sdxl::Manifest(path).append(e);
  const auto back = sdxl::Manifest(path).find("panel", 0);
  ASSERT_TRUE(back.has_value());
  EXPECT_TRUE(sdxl::same_settings(back->params, p));
  sdxl::GenerationParams other = p;
  other.hires.denoise = 0.5;  // a changed setting is seen
  EXPECT_FALSE(sdxl::same_settings(back->params, other));
  other = p;
  other.controlnets[0].end = 1.0;
  EXPECT_FALSE(sdxl::same_settings(back->params, other));
  // A hires upscaler folder: its weights' sha256 survives; another export (or folder) is seen.
  e.task = "hires";
  p.hires.upscaler = "/up/4x-anime";
  p.hires.weights_sha256 = std::string(64, 'c');
  sdxl::Manifest(path).append(e);
  const auto hires = sdxl::Manifest(path).find("hires", 0);
  ASSERT_TRUE(hires.has_value());
  EXPECT_TRUE(sdxl::same_settings(hires->params, p));
  other = p;
  other.hires.weights_sha256 = std::string(64, 'd');
  EXPECT_FALSE(sdxl::same_settings(hires->params, other));
  other = p;
  other.hires.upscaler = "/up/2x-real";
  EXPECT_FALSE(sdxl::same_settings(hires->params, other));
  fs::remove(path);
}

namespace {

// A fake device: `weights` always allocated; a batch of n images needs
// `per_image * n` bytes above that; beyond `limit` it runs out of memory like
// the CUDA allocator would.
struct FakeDevice {
  std::mutex mu;  // the runner's stage threads and its dispatcher call in concurrently
  std::uint64_t limit = 10000, weights = 4000, per_image = 1000, allocated = 4000, peak = 4000;
  int ooms = 0;
  int releases = 0;
  sdxl::DeviceHooks hooks() {
    sdxl::DeviceHooks h;
    h.memory = [this] {
      std::lock_guard lk(mu);
      sdxl::MemorySnapshot m;
      m.allocated = allocated;
      m.reserved = allocated + 100;
      m.peak_allocated = peak;
      m.peak_reserved = peak + 100;
      m.limit = limit;
      return m;
    };
    h.reset_peak = [this] {
      std::lock_guard lk(mu);
      peak = allocated;
    };
    h.release_cached = [this] {
      std::lock_guard lk(mu);
      ++releases;
    };
    return h;
  }
  void run(size_t n) {
    std::lock_guard lk(mu);
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
  o.queue.max_batch = 8;  // the three images in one batch first, then halved
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

TEST(DeviceLostMessages, AreRecognised) {
  EXPECT_TRUE(sdxl::is_device_lost_message("CUDA error: an illegal memory access was encountered"));
  EXPECT_TRUE(sdxl::is_device_lost_message("CUDA error: unspecified launch failure"));
  EXPECT_FALSE(sdxl::is_device_lost_message("CUDA out of memory. Tried to allocate 2.00 GiB"));
  EXPECT_FALSE(sdxl::is_device_lost_message("shape mismatch: [2, 4] vs [2, 5]"));
}

namespace {

// A fake staged device: each stage sleeps a little and records, under a lock,
// when it ran; sampling "uses" the LoRA set applied by the text stage.
struct StagedFake {
  std::string name;
  std::mutex mu;
  int stage_ms[3] = {5, 30, 10};
  int alive_handles = 0, max_alive_handles = 0;   // batches between encode and the end of decode
  int sampling = 0;
  std::string applied_lora;                        // set by encode on a switch
  bool switched_while_sampling = false;
  std::vector<std::string> encode_order, sample_order, decode_order;
  std::vector<std::pair<double, double>> sample_times, decode_times;
  std::function<void(const std::vector<sdxl::GenerationParams>&)> fail_sample;  // may throw
  // The detailer's detector: regions of an image (may throw); unset = the lane cannot detail.
  std::function<std::vector<sdxl::DetailerRegion>(const sdxl::DetailerUse&, const sdxl::PixelImage&)> detect;
  std::vector<std::vector<sdxl::GenerationParams>> sampled;  // every batch's params, in order
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  int prefetches = 0;
  std::vector<std::pair<double, std::string>> prefetch_log;  // when, and the first prompt

  double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  struct Handle {
    Handle(std::vector<sdxl::GenerationParams> p, StagedFake* o) : ps(std::move(p)), owner(o) {}
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    std::vector<sdxl::GenerationParams> ps;
    StagedFake* owner;
    ~Handle() {
      std::lock_guard lk(owner->mu);
      --owner->alive_handles;
    }
  };
  std::unique_ptr<sdxl::DeviceLane> lane();
};

// The fake as the scheduler sees it.
class FakeLane final : public sdxl::DeviceLane {
 public:
  explicit FakeLane(StagedFake& f) : f_(f) {}
  std::string name() const override { return f_.name; }
  std::string device_name() const override { return f_.name; }
  bool can_prefetch() const override { return true; }
  void prefetch(const std::vector<sdxl::GenerationParams>& ps) override {
    std::lock_guard lk(f_.mu);
    ++f_.prefetches;
    f_.prefetch_log.emplace_back(f_.now(), ps.front().prompt);
  }
  sdxl::StageHandle encode(const std::vector<sdxl::GenerationParams>& ps) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(f_.stage_ms[0]));
    std::lock_guard lk(f_.mu);
    const std::string lora = sdxl::lora_set_key(ps[0]);
    if (lora != f_.applied_lora) {
      if (f_.sampling > 0) f_.switched_while_sampling = true;
      f_.applied_lora = lora;
    }
    f_.encode_order.push_back(ps[0].prompt);
    ++f_.alive_handles;
    f_.max_alive_handles = std::max(f_.max_alive_handles, f_.alive_handles);
    return std::make_shared<StagedFake::Handle>(ps, &f_);
  }
  sdxl::StageHandle sample(const sdxl::StageHandle& h, const sdxl::StepHook& hook) override {
    auto* hd = static_cast<StagedFake::Handle*>(h.get());
    double start;
    {
      std::lock_guard lk(f_.mu);
      ++f_.sampling;
      start = f_.now();
      f_.sample_order.push_back(hd->ps[0].prompt);
    }
    struct Done {
      StagedFake* f;
      ~Done() {
        std::lock_guard lk(f->mu);
        --f->sampling;
      }
    } done{&f_};
    if (f_.fail_sample) f_.fail_sample(hd->ps);
    {
      std::lock_guard lk(f_.mu);
      f_.sampled.push_back(hd->ps);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(f_.stage_ms[1]));
    if (hook) hook(1, 1);
    std::lock_guard lk(f_.mu);
    f_.sample_times.emplace_back(start, f_.now());
    return h;
  }
  std::vector<sdxl::GeneratedImage> decode(const sdxl::StageHandle& h) override {
    auto* hd = static_cast<StagedFake::Handle*>(h.get());
    const double start = f_.now();
    std::this_thread::sleep_for(std::chrono::milliseconds(f_.stage_ms[2]));
    std::lock_guard lk(f_.mu);
    f_.decode_times.emplace_back(start, f_.now());
    f_.decode_order.push_back(hd->ps[0].prompt);
    return grey_images(hd->ps, static_cast<std::uint8_t>(hd->ps[0].seed * 7 + 3));
  }
  std::vector<sdxl::DetailerRegion> detailer_regions(const sdxl::DetailerUse& u, const sdxl::PixelImage& image,
                                                     std::string& model_name) override {
    if (!f_.detect) return DeviceLane::detailer_regions(u, image, model_name);
    model_name = fs::path(u.detector).filename().string() + ".pt";
    return f_.detect(u, image);
  }

 private:
  StagedFake& f_;
};

std::unique_ptr<sdxl::DeviceLane> StagedFake::lane() { return std::make_unique<FakeLane>(*this); }

// Seconds during which a decode and a sampling ran at the same time.
double overlap_s(const StagedFake& f) {
  double s = 0;
  for (const auto& [d0, d1] : f.decode_times)
    for (const auto& [s0, s1] : f.sample_times) s += std::max(0.0, std::min(d1, s1) - std::max(d0, s0));
  return s;
}

// Runs bf with one lane per fake (named gpu0, gpu1, ... unless named before),
// one image per batch, images and report in `out`.
sdxl::RunResult run_on(const sdxl::BatchFile& bf, const std::vector<StagedFake*>& fakes, const fs::path& out,
                       sdxl::RunOptions o = {}) {
  o.queue.max_batch = 1;
  o.out_dir = out;
  o.model_name = "fake";
  std::vector<std::unique_ptr<sdxl::DeviceLane>> lanes;
  std::vector<sdxl::DeviceLane*> ptrs;
  for (size_t i = 0; i < fakes.size(); ++i) {
    if (fakes[i]->name.empty()) fakes[i]->name = "gpu" + std::to_string(i);
    lanes.push_back(fakes[i]->lane());
    ptrs.push_back(lanes.back().get());
  }
  return sdxl::run_batch(bf, o, ptrs);
}

}  // namespace

TEST_F(Fixture, PipelineOverlapsStagesInOrderWithBoundedBatchesInFlight) {
  StagedFake dev;
  auto r = run_on(batch(many_tasks(8)), {&dev}, dir / "out");
  EXPECT_EQ(r.done, 8);
  EXPECT_EQ(dev.encode_order, dev.sample_order);
  EXPECT_EQ(dev.sample_order, dev.decode_order) << "each stage keeps the queue's order";
  EXPECT_LE(dev.max_alive_handles, 3) << "at most three batches between the text stage and the end of decode";
  EXPECT_GT(overlap_s(dev), 0.02) << "decodes ran while the next batch sampled";
  auto report = nlohmann::json::parse(std::ifstream(dir / "out" / "report.json"));
  ASSERT_EQ(report["devices"].size(), 1u);
  EXPECT_GT(report["devices"][0]["overlap_s"].get<double>(), 0.0);
  EXPECT_EQ(report["devices"][0]["images"], 8);
  const auto& b = report["batches"][1];
  EXPECT_LE(b["text"][0].get<double>(), b["sample"][0].get<double>());
  EXPECT_LE(b["sample"][1].get<double>(), b["decode"][0].get<double>() + 1e-9);
  EXPECT_EQ(manifest_lines().size(), 8u);
}

TEST_F(Fixture, WithoutOverlapOneBatchAtATime) {
  StagedFake dev;
  sdxl::RunOptions o;
  o.overlap = false;
  auto r = run_on(batch(many_tasks(5)), {&dev}, dir / "out", o);
  EXPECT_EQ(r.done, 5);
  EXPECT_EQ(dev.max_alive_handles, 1);
  EXPECT_EQ(overlap_s(dev), 0.0);
}

// n tasks p0..p(n-1), the odd ones with a LoRA tag: in file order every batch switches sets.
std::string alternating_lora_sets(int n) {
  std::string tasks = R"({"version": 1, "tasks": [)";
  for (int i = 0; i < n; ++i)
    tasks += std::string(i ? "," : "") + R"({"id": "t)" + std::to_string(i) + R"(", "prompt": "p)" + std::to_string(i) +
             (i % 2 ? R"( <lora:style:0.8>)" : "") + R"(", "seed": )" + std::to_string(i) + "}";
  return tasks + "]}";
}

TEST_F(Fixture, ALoraSwitchWaitsForTheEarlierBatchesSampling) {
  // Alternating LoRA sets in file order: every batch switches.
  const std::string tasks = alternating_lora_sets(6);
  StagedFake dev;
  sdxl::RunOptions o;
  o.queue.file_order = true;
  auto r = run_on(batch(tasks), {&dev}, dir / "out", o);
  EXPECT_EQ(r.done, 6);
  EXPECT_FALSE(dev.switched_while_sampling) << "weights changed under a running sampler";
  EXPECT_EQ(dev.prefetches, 5) << "the files of each new set were loaded ahead";
}

TEST_F(Fixture, ALaneWaitingForRoomLoadsTheNextLoraSetAhead) {
  // One batch at a time (no overlap): the lane waits while each batch runs.
  // The next set's files must load during that wait, not after the batch.
  const std::string tasks = alternating_lora_sets(6);
  StagedFake dev;
  dev.stage_ms[1] = 60;
  sdxl::RunOptions o;
  o.queue.file_order = true;
  o.overlap = false;
  auto r = run_on(batch(tasks), {&dev}, dir / "out", o);
  EXPECT_EQ(r.done, 6);
  EXPECT_FALSE(dev.switched_while_sampling);
  ASSERT_EQ(dev.prefetch_log.size(), 5u) << "each switch's set loaded once";
  ASSERT_EQ(dev.decode_times.size(), 6u);
  for (size_t i = 0; i < dev.prefetch_log.size(); ++i) {
    EXPECT_EQ(dev.prefetch_log[i].second, dev.sample_order[i + 1]) << "the set of the batch after the running one";
    EXPECT_LT(dev.prefetch_log[i].first, dev.decode_times[i].second)
        << "batch " << i + 1 << "'s LoRAs loaded only after batch " << i << " was done";
  }
}

TEST_F(Fixture, TwoDevicesShareTheQueueAndTheImagesAreTheSame) {
  auto bf = batch(R"({"version": 1, "tasks": [
    {"id": "low", "prompt": "low", "seed": 1, "count": 6, "priority": "low"},
    {"id": "high", "prompt": "high", "seed": 100, "count": 6, "priority": "high"}]})");
  // One device first, for the reference images.
  StagedFake solo;
  ASSERT_EQ(run_on(bf, {&solo}, dir / "one").done, 12);

  StagedFake a, b;
  auto r = run_on(bf, {&a, &b}, dir / "two");
  EXPECT_EQ(r.done, 12);
  EXPECT_GT(a.decode_order.size(), 0u);
  EXPECT_GT(b.decode_order.size(), 0u) << "both devices made images";
  EXPECT_EQ(a.decode_order.size() + b.decode_order.size(), 12u);
  // Priorities hold across devices: each device took every high image it got
  // before any low one (the queue is shared, so no low image was taken while a
  // high one waited).
  for (const StagedFake* f : {&a, &b}) {
    bool seen_low = false;
    for (const auto& p : f->encode_order) {
      if (p == "low") seen_low = true;
      else EXPECT_FALSE(seen_low) << f->name << " took a high image after a low one";
    }
  }
  // Same images as on one device.
  for (const auto& e : fs::directory_iterator(dir / "one")) {
    if (e.path().extension() != ".png") continue;
    EXPECT_EQ(sdxl::sha256_file_hex(e.path()), sdxl::sha256_file_hex(dir / "two" / e.path().filename()))
        << e.path().filename();
  }
  auto report = nlohmann::json::parse(std::ifstream(dir / "two" / "report.json"));
  ASSERT_EQ(report["devices"].size(), 2u);
  EXPECT_EQ(report["devices"][0]["images"].get<int>() + report["devices"][1]["images"].get<int>(), 12);
  std::set<std::string> used;
  for (const auto& im : report["images"]) used.insert(im["device"].get<std::string>());
  EXPECT_EQ(used, (std::set<std::string>{"gpu0", "gpu1"}));
}

TEST_F(Fixture, ALostDeviceGivesItsImagesToTheOthers) {
  StagedFake good, bad;
  bad.fail_sample = [](const std::vector<sdxl::GenerationParams>&) {
    throw sdxl::TaskError("CUDA error: an illegal memory access was encountered");
  };
  sdxl::RunOptions o;
  o.retries = 0;
  auto r = run_on(batch(many_tasks(10)), {&good, &bad}, dir / "out", o);
  EXPECT_EQ(r.done, 10) << "the working device finished the batch";
  EXPECT_EQ(r.failed, 0) << "the lost device's images were not counted as failed attempts";
  EXPECT_EQ(r.devices_failed, 1);
  EXPECT_EQ(good.decode_order.size(), 10u);
  auto report = nlohmann::json::parse(std::ifstream(dir / "out" / "report.json"));
  EXPECT_TRUE(report["devices"][1]["failed"].get<bool>());
  EXPECT_NE(report["devices"][1]["failure"].get<std::string>().find("illegal memory access"), std::string::npos);
  ASSERT_EQ(report["device_events"].size(), 1u);
  EXPECT_EQ(report["device_events"][0]["device"], "gpu1");
}

TEST_F(Fixture, ADeviceThatKeepsRunningOutOfMemoryIsGivenUp) {
  StagedFake good, small;
  small.fail_sample = [](const std::vector<sdxl::GenerationParams>&) {
    throw sdxl::OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB");
  };
  sdxl::RunOptions o;
  o.retries = 5;
  o.retry_backoff_s = 0.01;
  o.lane_failures = 3;
  auto r = run_on(batch(many_tasks(9)), {&good, &small}, dir / "out", o);
  EXPECT_EQ(r.done, 9);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.devices_failed, 1);
  auto report = nlohmann::json::parse(std::ifstream(dir / "out" / "report.json"));
  EXPECT_TRUE(report["devices"][1]["failed"].get<bool>());
  EXPECT_EQ(report["devices"][1]["images"], 0);
}

// A fake detector's regions: as many as the folder name's last digit (".../det2": two), each a 4x4 box
// (shifted by its index) with a mask of the whole image.
std::vector<sdxl::DetailerRegion> regions_by_name(const sdxl::DetailerUse& u, const sdxl::PixelImage& img) {
  const int n = u.detector.back() - '0';
  std::vector<sdxl::DetailerRegion> out;
  for (int j = 0; j < n; ++j) {
    auto m = std::make_shared<sdxl::PixelImage>(sdxl::PixelImage{img.width, img.height, {}});
    m->rgb.assign(img.rgb.size(), 255);
    out.push_back({1.0f * j, 0, 4.0f + j, 4, 0.9f, 0, m});
  }
  return out;
}

// The detailer through the run loop: each image's regions become passes that go through the queue,
// in order per image (seed + j, each from the previous result), batched across images; a detector
// that fails fails its image only; the report counts regions and detailer batches.
TEST_F(Fixture, DetailerRegionsArePassesBatchedAcrossImages) {
  StagedFake dev;
  dev.stage_ms[0] = dev.stage_ms[1] = dev.stage_ms[2] = 1;
  dev.detect = [](const sdxl::DetailerUse& u, const sdxl::PixelImage& img) {
    if (u.detector.ends_with("bad")) throw sdxl::ModelError("detector.ts is damaged");
    return regions_by_name(u, img);
  };
  const auto bf = batch(R"({"version": 1, "tasks": [
      {"id": "a", "prompt": "alpha", "seed": 10, "steps": 3, "detailer": [{"detector": "det1"}]},
      {"id": "b", "prompt": "beta", "seed": 20, "steps": 3, "detailer": [{"detector": "det2", "prompt": "[PROMPT] face"}]},
      {"id": "c", "prompt": "gamma", "seed": 30, "steps": 3, "detailer": [{"detector": "det3"}, {"detector": "det1"}]},
      {"id": "d", "prompt": "delta", "seed": 40, "steps": 3, "detailer": [{"detector": "bad"}]},
      {"id": "e", "prompt": "plain", "seed": 50, "steps": 3}]})");
  sdxl::RunOptions o;
  o.queue.max_batch = 8;
  o.out_dir = dir / "out";
  o.model_name = "fake";
  auto lane = dev.lane();
  const auto r = sdxl::run_batch(bf, o, {lane.get()});
  EXPECT_EQ(r.done, 4);
  EXPECT_EQ(r.failed, 1) << "the bad detector fails its image alone";
  EXPECT_EQ(r.detailer_regions, 1 + 2 + 3 + 1);
  EXPECT_LT(r.detailer_batches, r.detailer_regions);
  // Per image, its passes in order: seeds seed + j, each unit's from 0; b's prompt per [PROMPT].
  std::map<std::string, std::vector<std::int64_t>> seeds;
  for (const auto& batch : dev.sampled)
    for (const auto& p : batch)
      if (p.inpaint()) {
        EXPECT_TRUE(p.init_pixels && p.mask_pixels && p.inpaint_masked());
        EXPECT_EQ(p.strength, 0.4);
        seeds[p.prompt].push_back(p.seed);
      }
  EXPECT_EQ(seeds["alpha"], (std::vector<std::int64_t>{10}));
  EXPECT_EQ(seeds["beta face"], (std::vector<std::int64_t>{20, 21}));
  EXPECT_EQ(seeds["gamma"], (std::vector<std::int64_t>{30, 31, 32, 30}));
  EXPECT_EQ(dev.sampled[1].size(), 3u) << "the first regions of a, b and c share a call";
  auto report = nlohmann::json::parse(std::ifstream(dir / "out" / "report.json"));
  EXPECT_EQ(report["detailer"]["regions"], 7);
  for (const auto& img : report["images"]) {
    const std::string t = img["task"];
    const size_t want = t == "a" ? 1 : t == "b" ? 2 : t == "c" ? 4 : 0;
    EXPECT_EQ(img.contains("detailer") ? img["detailer"].size() : 0u, want) << t;
  }
  ASSERT_EQ(report["failures"].size(), 1u);
  EXPECT_NE(report["failures"][0]["error"].get<std::string>().find("detector.ts is damaged"), std::string::npos);
  EXPECT_EQ(report["failures"][0]["task"], "d");
}

// --dry-run's plan of the detailer: before any run each task's units are "unknown until detection";
// a run measures the regions per image per detector folder (estimates.json), and the next plan counts
// the passes (capped by "max") and their time in its estimate.
TEST_F(Fixture, DetailerPlanCountsTheRegionsEarlierRunsMeasured) {
  StagedFake dev;
  dev.stage_ms[0] = dev.stage_ms[1] = dev.stage_ms[2] = 1;
  dev.detect = regions_by_name;
  const auto bf = batch(R"({"version": 1, "tasks": [
      {"id": "a", "prompt": "alpha", "seed": 10, "count": 2, "detailer": [{"detector": "det3", "denoise": 0.5, "max": 2}]},
      {"id": "b", "prompt": "beta", "seed": 20, "detailer": [{"detector": "det2", "denoise": 0.5}, {"detector": "det1", "denoise": 0.5}]},
      {"id": "e", "prompt": "plain", "seed": 50, "steps": 3}]})");
  sdxl::WorkEstimator est("fake", "fake");
  sdxl::RunOptions o;
  o.out_dir = dir / "out";
  o.model_name = "fake";
  o.estimator = &est;
  const auto before = sdxl::plan_batch(bf, o, UINT64_MAX);
  ASSERT_EQ(before.detailers.size(), 2u) << "the plain task has none";
  EXPECT_EQ(before.detailers[0].task, "a");
  EXPECT_EQ(before.detailers[0].images, 2);
  EXPECT_EQ(before.detailers[1].detectors, (std::vector<std::string>{(dir / "det2").string(), (dir / "det1").string()}));
  EXPECT_EQ(before.detailers[1].regions_per_image, (std::vector<double>{-1, -1}));
  EXPECT_LT(before.detailers[1].est_regions, 0);
  EXPECT_TRUE(before.detailer_unknown);

  auto lane = dev.lane();
  ASSERT_EQ(sdxl::run_batch(bf, o, {lane.get()}).done, 4);
  // The figures survive estimates.json.
  est.save(dir / "estimates.json");
  sdxl::WorkEstimator back = sdxl::WorkEstimator::load(dir / "estimates.json", "fake", "fake");
  EXPECT_EQ(back.detailer_regions_per_image((dir / "det3").string()), 3.0) << "measured: 3 per image";
  EXPECT_EQ(back.detailer_regions_per_image((dir / "det1").string()), 1.0);
  EXPECT_FALSE(back.detailer_regions_per_image((dir / "det9").string()));
  o.estimator = &back;
  o.force = true;
  const auto after = sdxl::plan_batch(bf, o, UINT64_MAX);
  ASSERT_EQ(after.detailers.size(), 2u);
  EXPECT_EQ(after.detailers[0].regions_per_image, (std::vector<double>{2}));
  EXPECT_EQ(after.detailers[0].est_regions, 4) << "2 images x the 2 largest";
  EXPECT_EQ(after.detailers[1].regions_per_image, (std::vector<double>{2, 1}));
  EXPECT_EQ(after.detailers[1].est_regions, 3);
  EXPECT_FALSE(after.detailer_unknown);
  ASSERT_GE(after.est_seconds, 0);
  double batches_s = 0, passes_s = 0;
  for (const auto& b : after.batches) batches_s += b.est_seconds;
  for (const auto& d : after.detailers) {
    EXPECT_GT(d.est_seconds, 0) << d.task;
    passes_s += d.est_seconds;
  }
  EXPECT_NEAR(after.est_seconds, batches_s + passes_s, 1e-9) << "the plan's time counts the passes";
}

// generate's detailer (detail_image): the run's steps on one image, each pass alone — detector, the
// regions in order with seed + j, each from the previous result, the next unit, the boxes.
TEST_F(Fixture, DetailImageTakesTheRunsStepsOnOneImage) {
  StagedFake dev;
  dev.stage_ms[0] = dev.stage_ms[1] = dev.stage_ms[2] = 1;
  std::vector<std::uint8_t> seen_first;  // the image each detector call saw: its first byte
  dev.detect = [&](const sdxl::DetailerUse& u, const sdxl::PixelImage& img) {
    seen_first.push_back(img.rgb.front());
    return regions_by_name(u, img);
  };
  const auto bf = batch(R"({"version": 1, "tasks": [
      {"id": "b", "prompt": "beta", "seed": 20, "detailer": [{"detector": "det2", "denoise": 0.5, "prompt": "[PROMPT] face"},
                                                             {"detector": "det1", "steps": 5}]}]})");
  const sdxl::GenerationParams& p = bf.tasks[0].params;
  auto lane = dev.lane();
  sdxl::GeneratedImage base = lane->decode(lane->sample(lane->encode({p}), {})).front();
  nlohmann::json boxes;
  const sdxl::GeneratedImage out = sdxl::detail_image(*lane, p, base, &boxes);
  ASSERT_EQ(dev.sampled.size(), 4u) << "the image, then one call per region";
  std::vector<std::string> passes;
  for (size_t k = 1; k < dev.sampled.size(); ++k) {
    const auto& q = dev.sampled[k].front();
    EXPECT_TRUE(q.inpaint_masked());
    passes.push_back(q.prompt + "#" + std::to_string(q.seed) + "/" + std::to_string(q.steps));
  }
  EXPECT_EQ(passes, (std::vector<std::string>{"beta face#20/2", "beta face#21/2", "beta#20/5"}));
  EXPECT_EQ(seen_first, (std::vector<std::uint8_t>{20 * 7 + 3, 21 * 7 + 3})) << "unit 2 sees unit 1's result";
  EXPECT_EQ(out.rgb, std::vector<std::uint8_t>(base.rgb.size(), 20 * 7 + 3)) << "the last pass's pixels";
  EXPECT_EQ(out.detailer_models, (std::vector<std::string>{"det2.pt", "det1.pt"}));
  ASSERT_EQ(boxes.size(), 3u);
  EXPECT_EQ(boxes[2]["unit"], 1);
}

TEST_F(Fixture, AFailedDetailerPassFailsItsImageWithTheImagesSeed) {
  StagedFake dev;
  dev.stage_ms[0] = dev.stage_ms[1] = dev.stage_ms[2] = 1;
  dev.detect = [](const sdxl::DetailerUse&, const sdxl::PixelImage& img) {
    auto m = std::make_shared<sdxl::PixelImage>(sdxl::PixelImage{img.width, img.height, {}});
    m->rgb.assign(img.rgb.size(), 255);
    return std::vector<sdxl::DetailerRegion>{{0, 0, 4, 4, 0.9f, 0, m}, {0, 0, 4, 4, 0.8f, 0, m}};
  };
  dev.fail_sample = [](const std::vector<sdxl::GenerationParams>& ps) {
    for (const auto& p : ps)
      if (p.inpaint() && p.prompt == "zeta" && p.seed == 61) throw sdxl::TaskError("injected failure of a region");
  };
  const auto bf = batch(R"({"version": 1, "tasks": [
      {"id": "a", "prompt": "alpha", "seed": 10, "detailer": [{"detector": "det", "steps": 3}]},
      {"id": "f", "prompt": "zeta", "seed": 60, "detailer": [{"detector": "det", "steps": 3}]}]})");
  sdxl::RunOptions o;
  o.queue.max_batch = 8;
  o.out_dir = dir / "out";
  o.model_name = "fake";
  auto lane = dev.lane();
  const auto r = sdxl::run_batch(bf, o, {lane.get()});
  EXPECT_EQ(r.done, 1);
  EXPECT_EQ(r.failed, 1);
  auto report = nlohmann::json::parse(std::ifstream(dir / "out" / "report.json"));
  ASSERT_EQ(report["failures"].size(), 1u);
  const auto& f = report["failures"][0];
  EXPECT_EQ(f["task"], "f");
  EXPECT_EQ(f["seed"], 60) << "the image's seed, not its region's";
  EXPECT_NE(f["error"].get<std::string>().find("detailer unit 1 region 1: injected failure"), std::string::npos)
      << f["error"];
  EXPECT_FALSE(fs::exists(dir / "out" / "f-0-60.png"));
  EXPECT_TRUE(fs::exists(dir / "out" / "a-0-10.png"));
}
