// The parts of run_batch one at a time, on a fake lane: the work list
// (resume), the dispatcher (admission, solo probes, room, LoRA prefetch,
// retries), the failure policy (OOM halving, splitting, retries, giving a
// device up, classification), the writer pool and the run report.
// test_batch_runner.cpp runs them together.
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <mutex>

#include "batch/batch_file.h"
#include "core/error.h"
#include "core/sha256.h"
#include "scheduler/dispatcher.h"
#include "scheduler/failure_policy.h"
#include "scheduler/output_folder.h"
#include "scheduler/run_report.h"
#include "scheduler/run_state.h"
#include "scheduler/work_estimator.h"
#include "scheduler/work_list.h"
#include "scheduler/writer_pool.h"

namespace fs = std::filesystem;

namespace {

// A lane whose stages are never run here: the parts under test only look at
// its name, memory and prefetches.
class FakeLane final : public sdxl::DeviceLane {
 public:
  explicit FakeLane(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  sdxl::StageHandle encode(const std::vector<sdxl::GenerationParams>&) override { return nullptr; }
  sdxl::StageHandle sample(const sdxl::StageHandle& h, const sdxl::StepHook&) override { return h; }
  std::vector<sdxl::GeneratedImage> decode(const sdxl::StageHandle&) override { return {}; }
  bool can_prefetch() const override { return true; }
  void prefetch(const std::vector<sdxl::GenerationParams>& ps) override { prefetched.push_back(ps.front().prompt); }
  std::optional<sdxl::MemorySnapshot> memory() override {
    if (!accounted) return std::nullopt;
    return snapshot;
  }
  void release_cached() override { ++releases; }

  bool accounted = false;
  sdxl::MemorySnapshot snapshot;
  std::vector<std::string> prefetched;
  int releases = 0;

 private:
  std::string name_;
};

struct Parts : ::testing::Test {
  fs::path dir;
  sdxl::BatchFile bf;
  sdxl::RunOptions o;
  FakeLane lane0{"gpu0"}, lane1{"gpu1"};

  void SetUp() override {
    dir = fs::temp_directory_path() / ("sdxl_parts_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir / "out");
    o.out_dir = dir / "out";
    o.model_name = "fake";
  }
  void TearDown() override { fs::remove_all(dir); }

  void load(const std::string& json) {
    std::vector<sdxl::BatchProblem> problems;
    sdxl::GenerationParams fallback;
    fallback.width = 16;
    fallback.height = 8;
    fallback.steps = 2;
    bf = sdxl::parse_batch_text(json, dir / "batch.json", fallback, &problems);
    ASSERT_TRUE(problems.empty()) << problems[0].pointer << " " << problems[0].message;
  }
  std::unique_ptr<sdxl::RunState> state(std::vector<sdxl::DeviceLane*> lanes = {}) {
    if (lanes.empty()) lanes = {&lane0};
    return std::make_unique<sdxl::RunState>(bf, o, fs::canonical(dir / "out"), lanes);
  }
};

std::string tasks(int n, const std::string& extra = "") {
  std::string s = R"({"version": 1, "tasks": [)";
  for (int i = 0; i < n; ++i)
    s += std::string(i ? "," : "") + R"({"id": "t)" + std::to_string(i) + R"(", "prompt": "p)" + std::to_string(i) +
         R"(", "seed": )" + std::to_string(i) + extra + "}";
  return s + "]}";
}

sdxl::BatchPtr take(sdxl::RunState& run, sdxl::LaneState& l) {
  std::unique_lock lk(run.mu);
  return sdxl::next_batch(run, l, lk);
}

}  // namespace

// --- work list -------------------------------------------------------------

TEST_F(Parts, WorkListSkipsRecordedImagesWhoseFileIsIntactAndShardsByPosition) {
  load(tasks(4, R"(, "count": 2)"));
  auto run = state();
  EXPECT_EQ(run->work.size(), 8u);
  // Record t0#0 as done, with its file.
  const std::string png = "not really a png";
  std::ofstream(dir / "out" / run->work[0].file) << png;
  sdxl::ManifestEntry e;
  e.task = "t0";
  e.index = 0;
  e.seed = run->work[0].params.seed;
  e.file = run->work[0].file;
  e.sha256 = sdxl::sha256_hex(std::vector<std::uint8_t>(png.begin(), png.end()));
  e.params = run->work[0].params;
  run->manifest.append(e);
  const sdxl::Manifest m(dir / "out" / "manifest.jsonl");
  auto wl = sdxl::build_work(bf, {}, m, dir / "out", run->date, run->start_unix);
  EXPECT_EQ(wl.total, 8);
  EXPECT_EQ(wl.skipped_count, 1);
  EXPECT_EQ(wl.work.size(), 7u);
  // A run in another UNet precision (--precision fp8) makes it again, and the
  // manifest line round-trips the precision it was made in.
  EXPECT_EQ(sdxl::build_work(bf, {false, 0, 1, "fp8"}, m, dir / "out", run->date, run->start_unix).work.size(), 8u);
  e.index = 1;
  e.unet_precision = "fp8";
  e.seed = run->work[1].params.seed;
  e.file = run->work[1].file;
  e.params = run->work[1].params;
  std::ofstream(dir / "out" / run->work[1].file) << png;
  run->manifest.append(e);
  const sdxl::Manifest m8(dir / "out" / "manifest.jsonl");
  EXPECT_EQ(sdxl::build_work(bf, {false, 0, 1, "fp8"}, m8, dir / "out", run->date, run->start_unix).work.size(), 7u);
  EXPECT_EQ(sdxl::build_work(bf, {}, m8, dir / "out", run->date, run->start_unix).work.size(), 7u);
  // A changed file is made again; --force makes everything.
  std::ofstream(dir / "out" / run->work[0].file) << "changed";
  EXPECT_EQ(sdxl::build_work(bf, {}, m, dir / "out", run->date, run->start_unix).work.size(), 8u);
  EXPECT_EQ(sdxl::build_work(bf, {true, 0, 1, ""}, m, dir / "out", run->date, run->start_unix).work.size(), 8u);
  // Shard 1 of 2 takes tasks 1 and 3.
  auto shard = sdxl::build_work(bf, {false, 1, 2, ""}, m, dir / "out", run->date, run->start_unix);
  ASSERT_EQ(shard.work.size(), 4u);
  EXPECT_EQ(shard.work[0].task->id, "t1");
  EXPECT_EQ(shard.work[2].task->id, "t3");
}

TEST_F(Parts, GroupKeysSeparateWhatCannotShareAUnetCall) {
  sdxl::GenerationParams a, b;
  EXPECT_EQ(sdxl::batch_group_key(a), sdxl::batch_group_key(b));
  b.prompt = "x <lora:style:0.5>";
  EXPECT_NE(sdxl::batch_group_key(a), sdxl::batch_group_key(b));
  EXPECT_EQ(sdxl::lora_set_key(b), "<style:0.5>;");
  b = a;
  b.width = 512;
  EXPECT_NE(sdxl::batch_group_key(a), sdxl::batch_group_key(b));
  b = a;
  b.seed = 99;
  b.prompt = "another prompt";
  EXPECT_EQ(sdxl::batch_group_key(a), sdxl::batch_group_key(b)) << "prompts and seeds may share a call";
  // The hires fix with an upscaler model: its own group, and estimates keyed with the upscaler (its
  // weights and tiles are in the sampling stage's peak), as a frame's upscaler is.
  a.hires.scale = b.hires.scale = 1.5;
  b.hires.upscaler = "/up/4x-anime";
  EXPECT_NE(sdxl::batch_group_key(a), sdxl::batch_group_key(b));
  EXPECT_EQ(sdxl::side_modules_key(a), 0);
  EXPECT_EQ(sdxl::side_modules_key(b), sdxl::kUpscalerKey);
  b.hires.upscaler = "Lanczos";
  EXPECT_EQ(sdxl::side_modules_key(b), 0) << "a name needs no model";
}

// --- dispatcher -------------------------------------------------------------

TEST_F(Parts, DispatcherBatchesUpToMaxBatchWithoutAccounting) {
  load(tasks(5));
  o.queue.max_batch = 3;
  auto run = state();
  auto b = take(*run, *run->lanes[0]);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->n, 3);
  EXPECT_FALSE(b->est_peak.has_value());
  EXPECT_EQ(run->lanes[0]->in_flight.size(), 1u);
  EXPECT_EQ(run->lanes[0]->unsampled, 1);
}

TEST_F(Parts, DispatcherProbesAnUnmeasuredSizeAloneThenFillsTheBudget) {
  load(tasks(12));
  o.queue.max_batch = 8;
  sdxl::WorkEstimator est;
  o.estimator = &est;
  lane0.accounted = true;
  lane0.snapshot.allocated = 4000;
  lane0.snapshot.limit = 10000;
  auto run = state();
  auto& l = *run->lanes[0];
  auto probe = take(*run, l);
  EXPECT_EQ(probe->n, 1);
  EXPECT_TRUE(probe->solo) << "a size never measured runs alone";
  EXPECT_EQ(l.fig.weights_bytes, 4000u);
  sdxl::leave_lane(l, probe);
  est.observe_memory(16, 8, 1, 1000);
  auto b = take(*run, l);
  EXPECT_EQ(b->n, 5) << "6000 bytes free / (1000 x 1.2)";
  EXPECT_EQ(b->est_peak, 5000u);
  EXPECT_FALSE(b->solo);
}

TEST_F(Parts, DispatcherLoadsTheHeadsLoraSetWhileTheLaneHasNoRoom) {
  load(R"({"version": 1, "tasks": [
    {"id": "a", "prompt": "plain", "seed": 1},
    {"id": "b", "prompt": "styled <lora:style:0.8>", "seed": 2},
    {"id": "c", "prompt": "plain again", "seed": 3}]})");
  o.queue.file_order = true;
  o.overlap = false;  // one batch at a time: the lane waits while "a" is in flight
  auto run = state();
  auto& l = *run->lanes[0];
  auto a = take(*run, l);
  EXPECT_EQ(a->params[0].prompt, "plain");
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::lock_guard lk(run->mu);
    sdxl::leave_lane(l, a);
    run->cv.notify_all();
  });
  auto b = take(*run, l);  // waits for room, loading b's set meanwhile
  later.join();
  EXPECT_EQ(b->params[0].prompt, "styled <lora:style:0.8>");
  EXPECT_TRUE(b->lora_switch);
  ASSERT_EQ(lane0.prefetched.size(), 1u);
  EXPECT_EQ(lane0.prefetched[0], "styled <lora:style:0.8>");
  EXPECT_EQ(l.prefetched_lora, b->picked[0].lora_set);
}

TEST_F(Parts, DispatcherRequeuesRetriesAfterTheirBackoffAndStopsOnASignal) {
  load(tasks(1));
  std::atomic<bool> stop{false};
  o.stop = &stop;
  auto run = state();
  auto& l = *run->lanes[0];
  auto b = take(*run, l);
  {
    std::lock_guard lk(run->mu);
    sdxl::leave_lane(l, b);
    run->work[0].not_before_s = run->elapsed() + 0.2;
    run->waiting.push_back(b->picked[0]);
  }
  const double t0 = run->elapsed();
  auto again = take(*run, l);
  ASSERT_TRUE(again);
  EXPECT_GE(run->elapsed() - t0, 0.15) << "the retry waited for its backoff";
  {
    std::lock_guard lk(run->mu);
    sdxl::leave_lane(l, again);
    run->queue.requeue(again->picked);
  }
  stop = true;
  EXPECT_FALSE(take(*run, l));
  EXPECT_EQ(run->res.stop_reason, "stopped by a signal");
}

// --- failure policy ---------------------------------------------------------

TEST_F(Parts, OutOfMemoryHalvesTheGroupAndRequeues) {
  load(tasks(8));
  o.queue.max_batch = 8;
  auto run = state();
  auto& l = *run->lanes[0];
  auto b = take(*run, l);
  ASSERT_EQ(b->n, 8);
  std::lock_guard lk(run->mu);
  EXPECT_TRUE(sdxl::on_failure(*run, l, b, {"CUDA out of memory", true, true, false})) << "release cached blocks";
  EXPECT_EQ(run->oom_cap[b->picked[0].group], 4);
  EXPECT_EQ(run->queue.size(), 8u);
  EXPECT_FALSE(l.overlap);
  EXPECT_EQ(run->res.oom_recoveries, 1);
  EXPECT_TRUE(l.in_flight.empty());
}

TEST_F(Parts, AFailedBatchIsSplitAndASingleImageRetriedThenRecorded) {
  load(tasks(2));
  o.queue.max_batch = 2;
  o.retries = 1;
  o.retry_backoff_s = 10;
  auto run = state();
  auto& l = *run->lanes[0];
  auto b = take(*run, l);
  std::unique_lock lk(run->mu);
  sdxl::on_failure(*run, l, b, {"bad pixel", false, true, false});
  ASSERT_EQ(run->queue.size(), 2u) << "each image runs alone";
  lk.unlock();
  auto alone = take(*run, l);
  lk.lock();
  EXPECT_EQ(alone->n, 1);
  sdxl::on_failure(*run, l, alone, {"bad pixel", false, true, false});
  EXPECT_EQ(run->waiting.size(), 1u);
  EXPECT_EQ(run->res.retries, 1);
  EXPECT_GT(run->work[alone->picked[0].handle].not_before_s, 9.0);
  sdxl::on_failure(*run, l, alone, {"bad pixel", false, true, false});
  EXPECT_EQ(run->res.failed, 1) << "no attempts left";
  ASSERT_EQ(run->rec.failures.size(), 1u);
  EXPECT_EQ(run->rec.failures[0]["attempts"], 2);
}

TEST_F(Parts, ADeviceFailingBatchAfterBatchIsGivenUpWhileAnotherWorks) {
  load(tasks(6));
  o.lane_failures = 2;
  o.queue.max_batch = 1;
  auto run = state({&lane0, &lane1});
  auto& l = *run->lanes[0];
  for (int i = 0; i < 2; ++i) {
    auto b = take(*run, l);
    std::lock_guard lk(run->mu);
    sdxl::on_failure(*run, l, b, {"flaky", false, true, false});
  }
  EXPECT_FALSE(l.alive);
  EXPECT_EQ(run->res.devices_failed, 1);
  EXPECT_EQ(run->res.failed, 1) << "the first failure counts (no retries)";
  EXPECT_EQ(run->queue.size(), 5u) << "the batch that gave the device up went back without an attempt";
  ASSERT_EQ(run->rec.device_events.size(), 1u);
  EXPECT_EQ(run->rec.device_events[0]["device"], "gpu0");
  EXPECT_FALSE(take(*run, l)) << "a given-up lane takes nothing";
  EXPECT_TRUE(take(*run, *run->lanes[1])) << "the other lane goes on";
}

TEST_F(Parts, RunStageClassifiesWhatAStageThrows) {
  load(tasks(3));
  o.queue.max_batch = 1;
  auto run = state();
  auto& l = *run->lanes[0];
  auto b = take(*run, l);
  EXPECT_TRUE(sdxl::run_stage(*run, l, b, "sample", [] {}));
  EXPECT_FALSE(sdxl::run_stage(*run, l, b, "sample", [] { throw sdxl::TimeoutError("timed out"); }));
  EXPECT_EQ(run->res.failed, 1) << "a timeout is not retried";
  auto c = take(*run, l);
  EXPECT_FALSE(sdxl::run_stage(*run, l, c, "sample",
                               [] { throw std::runtime_error("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"); }));
  EXPECT_EQ(run->res.oom_recoveries, 1) << "an OOM recognised from a library's message";
  EXPECT_EQ(lane0.releases, 1) << "cached blocks are freed after any out-of-memory";
}

// --- writer pool ------------------------------------------------------------

TEST_F(Parts, WriterWritesThePngItsManifestLineAndTheRecord) {
  load(tasks(1));
  auto run = state();
  sdxl::WriteJob j;
  j.item = run->work[0];
  j.image.width = 4;
  j.image.height = 2;
  j.image.rgb.assign(4 * 2 * 3, 200);
  j.device = "gpu0";
  sdxl::write_image(*run, j);
  EXPECT_EQ(run->res.done, 1);
  ASSERT_TRUE(fs::exists(dir / "out" / j.item.file));
  const sdxl::Manifest m(dir / "out" / "manifest.jsonl");
  ASSERT_TRUE(m.find("t0", 0));
  EXPECT_EQ(*sdxl::sha256_file_hex(dir / "out" / j.item.file), m.find("t0", 0)->sha256);
  ASSERT_EQ(run->rec.images.size(), 1u);
  EXPECT_EQ(run->rec.images[0]["device"], "gpu0");
}

TEST_F(Parts, AfterAnOutputErrorTheWriterDropsImagesForTheRerun) {
  load(tasks(1));
  auto run = state();
  run->fatal = "disk full";
  sdxl::WriteJob j;
  j.item = run->work[0];
  j.image.width = 1;
  j.image.height = 1;
  j.image.rgb.assign(3, 1);
  sdxl::write_image(*run, j);
  EXPECT_EQ(run->dropped, 1);
  EXPECT_FALSE(fs::exists(dir / "out" / j.item.file));
}

TEST_F(Parts, OutputPathsStayInsideTheFolderAndStaleTempFilesGo) {
  const fs::path out = fs::canonical(dir / "out");
  EXPECT_THROW(sdxl::checked_output_path(out, "../escape.png"), sdxl::UsageError);
  fs::create_directory_symlink(dir, out / "link");
  EXPECT_THROW(sdxl::checked_output_path(out, "link/x.png"), sdxl::UsageError);
  EXPECT_EQ(sdxl::checked_output_path(out, "sub/x.png"), out / "sub" / "x.png");
  EXPECT_TRUE(fs::is_directory(out / "sub"));
  // Only this host's temporary files of a process that is gone are removed
  // (test_hostile_run.cpp checks every case).
  const sdxl::TempFileOwner me = sdxl::this_temp_file_owner();
  const std::string dead = sdxl::temp_file_name("x.png", {me.host, 999999999, ""}, 1);
  const std::string alive = sdxl::temp_file_name("y.png", {me.host, static_cast<long>(::getppid()), ""}, 1);
  std::ofstream(out / dead) << "left by a dead process";
  std::ofstream(out / alive) << "another process's, alive";
  std::ofstream(out / ".z.png.999999999.1.tmp") << "no host: not provably dead here";
  EXPECT_EQ(sdxl::remove_stale_temp_files(out), 1);
  EXPECT_FALSE(fs::exists(out / dead));
  EXPECT_TRUE(fs::exists(out / alive));
  EXPECT_TRUE(fs::exists(out / ".z.png.999999999.1.tmp"));
}

// --- run report ---------------------------------------------------------------

TEST(RunReport, BusyAndOverlapCountTimeCoveredOnceAndTwice) {
  const auto [busy, overlap] = sdxl::busy_and_overlap({{0, 2}, {1, 3}, {5, 6}, {4, 4}});
  EXPECT_DOUBLE_EQ(busy, 4.0);
  EXPECT_DOUBLE_EQ(overlap, 1.0);
}

TEST_F(Parts, TheReportNamesTheDevicesTheirFiguresAndTheShard) {
  load(tasks(2));
  o.shard_index = 1;
  o.shard_count = 3;
  auto run = state({&lane0, &lane1});
  run->lanes[1]->failure = "lost";
  run->lanes[0]->fig.intervals = {{0, 1}, {0.5, 2}};
  run->lanes[0]->fig.images = 2;
  const fs::path path = sdxl::write_run_report(*run, 4.0);
  EXPECT_EQ(path.filename(), "report-shard-1-of-3.json");
  auto r = nlohmann::json::parse(std::ifstream(path));
  ASSERT_EQ(r["devices"].size(), 2u);
  EXPECT_EQ(r["devices"][0]["name"], "gpu0");
  EXPECT_DOUBLE_EQ(r["devices"][0]["busy_s"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(r["devices"][0]["overlap_s"].get<double>(), 0.5);
  EXPECT_TRUE(r["devices"][1]["failed"].get<bool>());
  EXPECT_EQ(r["shard"]["count"], 3);
  EXPECT_TRUE(fs::exists(dir / "out" / "report-shard-1-of-3.html"));
}
