// TaskQueue order (priorities, FIFO, deadlines, aging, LoRA affinity),
// grouping and admission; WorkEstimator fits; size and deadline parsing.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "batch/batch_file.h"
#include "core/error.h"
#include "core/lru_cache.h"
#include "scheduler/task_queue.h"
#include "scheduler/work_estimator.h"
#include "core/units.h"

namespace {

using sdxl::Priority;
using sdxl::QueuedImage;
using sdxl::TaskQueue;

QueuedImage img(size_t h, Priority p, const std::string& group = "g", double deadline = -1, const std::string& lora = "",
                double enqueued = 0) {
  QueuedImage q;
  q.handle = h;
  q.priority = p;
  q.group = group;
  q.deadline_s = deadline;
  q.lora_set = lora;
  q.enqueued_s = enqueued;
  return q;
}

std::vector<size_t> drain(TaskQueue& q, double now = 0, int per_batch = 1) {
  std::vector<size_t> out;
  while (!q.empty())
    for (const auto& b : q.pop_batch(now, "", [&](const QueuedImage&, int) { return per_batch; })) out.push_back(b.handle);
  return out;
}

}  // namespace

TEST(TaskQueue, PriorityClassesThenFifo) {
  TaskQueue q;
  q.push(img(0, Priority::kLow));
  q.push(img(1, Priority::kMid));
  q.push(img(2, Priority::kHigh));
  q.push(img(3, Priority::kMid));
  q.push(img(4, Priority::kHigh));
  EXPECT_EQ(drain(q), (std::vector<size_t>{2, 4, 1, 3, 0}));
}

TEST(TaskQueue, EarliestDeadlineFirstWithinAClass) {
  TaskQueue q;
  q.push(img(0, Priority::kMid));
  q.push(img(1, Priority::kMid, "g", 500));
  q.push(img(2, Priority::kMid, "g", 100));
  q.push(img(3, Priority::kHigh));
  q.push(img(4, Priority::kLow, "g", 1));  // a deadline does not lift a class
  EXPECT_EQ(drain(q), (std::vector<size_t>{3, 2, 1, 0, 4}));
}

TEST(TaskQueue, AgingLiftsWaitingWorkSoNothingStarves) {
  sdxl::QueuePolicy pol;
  pol.aging_s = 100;
  TaskQueue q(pol);
  q.push(img(0, Priority::kLow, "g", -1, "", 0));     // waiting since 0
  q.push(img(1, Priority::kHigh, "g", -1, "", 250));  // just arrived
  EXPECT_EQ(q.effective_class(img(0, Priority::kLow), 50), 2);
  EXPECT_EQ(q.effective_class(img(0, Priority::kLow), 150), 1);
  EXPECT_EQ(q.effective_class(img(0, Priority::kLow), 250), 0);
  // At t=250 the low image has aged to high and arrived first: it goes first.
  EXPECT_EQ(drain(q, 250), (std::vector<size_t>{0, 1}));
  TaskQueue q2(pol);
  q2.push(img(0, Priority::kLow, "g", -1, "", 0));
  q2.push(img(1, Priority::kHigh, "g", -1, "", 0));
  EXPECT_EQ(drain(q2, 50), (std::vector<size_t>{1, 0}));
}

TEST(TaskQueue, BatchesTakeCompatibleImagesOnlyUpToTheAdmission) {
  sdxl::QueuePolicy pol;
  pol.max_batch = 3;
  TaskQueue q(pol);
  q.push(img(0, Priority::kMid, "A"));
  q.push(img(1, Priority::kMid, "B"));
  q.push(img(2, Priority::kMid, "A"));
  q.push(img(3, Priority::kMid, "A"));
  q.push(img(4, Priority::kMid, "A"));
  int asked = 0;
  auto b1 = q.pop_batch(0, "", [&](const QueuedImage& head, int available) {
    EXPECT_EQ(head.handle, 0u);
    asked = available;
    return 2;  // the budget allows two
  });
  EXPECT_EQ(asked, 3) << "available is capped by max_batch";
  ASSERT_EQ(b1.size(), 2u);
  EXPECT_EQ(b1[0].handle, 0u);
  EXPECT_EQ(b1[1].handle, 2u);
  auto b2 = q.pop_batch(0, "", nullptr);
  ASSERT_EQ(b2.size(), 1u);
  EXPECT_EQ(b2[0].handle, 1u) << "B arrived before the remaining As";
  auto b3 = q.pop_batch(0, "", [](const QueuedImage&, int) { return 0; });
  ASSERT_EQ(b3.size(), 1u) << "admission never returns fewer than one image";
  EXPECT_EQ(q.size(), 1u);
}

TEST(TaskQueue, LowerClassesFillABatchOnlyWhenAllowed) {
  for (bool fill : {true, false}) {
    sdxl::QueuePolicy pol;
    pol.max_batch = 8;  // the library's default is 1: batches of one
    pol.fill_lower = fill;
    TaskQueue q(pol);
    q.push(img(0, Priority::kHigh, "A"));
    q.push(img(1, Priority::kLow, "A"));
    q.push(img(2, Priority::kMid, "B"));
    auto b = q.pop_batch(0, "", nullptr);
    EXPECT_EQ(b.size(), fill ? 2u : 1u);
    EXPECT_EQ(b[0].handle, 0u);
  }
}

TEST(TaskQueue, PrefersTheAppliedLoraSetWithinAClass) {
  TaskQueue q;
  q.push(img(0, Priority::kMid, "g1", -1, "style-a"));
  q.push(img(1, Priority::kMid, "g2", -1, "style-b"));
  q.push(img(2, Priority::kMid, "g3", -1, "style-a"));
  q.push(img(3, Priority::kHigh, "g4", -1, "style-b"));
  std::vector<size_t> got;
  std::string lora = "style-a";
  while (!q.empty()) {
    auto b = q.pop_batch(0, lora, nullptr);
    got.push_back(b[0].handle);
    lora = b[0].lora_set;
  }
  // The high image goes first whatever its LoRA; then the set applied stays on.
  EXPECT_EQ(got, (std::vector<size_t>{3, 1, 0, 2}));
}

TEST(TaskQueue, RequeueKeepsArrivalOrder) {
  sdxl::QueuePolicy pol;
  pol.max_batch = 8;
  TaskQueue q(pol);
  q.push(img(0, Priority::kMid));
  q.push(img(1, Priority::kMid));
  q.push(img(2, Priority::kMid));
  auto b = q.pop_batch(0, "", [](const QueuedImage&, int) { return 2; });
  ASSERT_EQ(b.size(), 2u);
  q.requeue(b);  // an out-of-memory: they go back ahead of later arrivals
  EXPECT_EQ(drain(q), (std::vector<size_t>{0, 1, 2}));
}

TEST(TaskQueue, HopelessDeadlinesAreReportedOnce) {
  TaskQueue q;
  q.push(img(0, Priority::kHigh));
  q.push(img(1, Priority::kHigh));
  q.push(img(2, Priority::kMid, "g", 25));  // third in line, 10 s per image -> done at 30
  q.push(img(3, Priority::kMid, "g", 100));
  auto h = q.newly_hopeless(0, "", 10);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].handle, 2u);
  EXPECT_TRUE(q.newly_hopeless(0, "", 10).empty()) << "said once";
}

TEST(TaskQueue, PriorityNames) {
  EXPECT_EQ(sdxl::parse_priority("high"), Priority::kHigh);
  EXPECT_EQ(sdxl::parse_priority("normal"), Priority::kMid);
  EXPECT_FALSE(sdxl::parse_priority("urgent").has_value());
  EXPECT_STREQ(sdxl::priority_name(Priority::kLow), "low");
}

TEST(WorkEstimator, UnmeasuredSizesRunAloneFirst) {
  sdxl::WorkEstimator e("cuda/fp16", "m");
  EXPECT_FALSE(e.peak_bytes(1024, 1024, 1));
  EXPECT_EQ(e.max_batch(1024, 1024, 8, 1ull << 40, 1.2), 1);
}

TEST(WorkEstimator, OneObservationScalesPerImage) {
  sdxl::WorkEstimator e;
  e.observe_memory(1024, 1024, 1, 1000);
  EXPECT_EQ(*e.peak_bytes(1024, 1024, 4), 4000u);
  // 1.2 x 3000 = 3600 fits in 4000, 1.2 x 4000 does not.
  EXPECT_EQ(e.max_batch(1024, 1024, 8, 4000, 1.2), 3);
  EXPECT_EQ(e.max_batch(1024, 1024, 8, 10, 1.2), 1) << "nothing fits: still one (OOM recovery takes over)";
  EXPECT_FALSE(e.peak_bytes(512, 512, 1)) << "another size is not guessed";
}

TEST(WorkEstimator, OneObservationGrowsByItsSamplingPartOnly) {
  // The H200's first 1024x1024 batch alone (2026-11-30): peak 4.15 GiB, of it
  // sampling 0.36 GiB; the VAE decode (image by image) is the rest.
  const std::uint64_t GiB = 1ull << 30;
  sdxl::WorkEstimator e;
  e.observe_memory(1024, 1024, 1, 415 * GiB / 100, 36 * GiB / 100);
  EXPECT_EQ(*e.peak_bytes(1024, 1024, 1), 415 * GiB / 100);
  EXPECT_NEAR(static_cast<double>(*e.peak_bytes(1024, 1024, 4)), (4.15 + 3 * 0.36) * GiB, 4.0);
  // What a 24 GiB cap leaves after the weights and the LoRA cache (~16.6 GiB):
  // four at a time fit (the per-image rule allowed 3: 1.2 x 4 x 4.15 > 16.6).
  EXPECT_EQ(e.max_batch(1024, 1024, 4, 166 * GiB / 10, 1.2), 4);
  sdxl::WorkEstimator old;
  old.observe_memory(1024, 1024, 1, 415 * GiB / 100);
  EXPECT_EQ(old.max_batch(1024, 1024, 4, 166 * GiB / 10, 1.2), 3) << "without the split: per image, as before";
  // Smaller than the measured batch: the measured peak (the decode does not shrink).
  sdxl::WorkEstimator at4;
  at4.observe_memory(1024, 1024, 4, 450 * GiB / 100, 120 * GiB / 100);
  EXPECT_EQ(*at4.peak_bytes(1024, 1024, 2), 450 * GiB / 100);
  EXPECT_NEAR(static_cast<double>(*at4.peak_bytes(1024, 1024, 8)), (4.5 + 1.2) * GiB, 4.0);
}

TEST(WorkEstimator, LineThroughSeveralSizesCoversEveryObservation) {
  sdxl::WorkEstimator e;
  e.observe_memory(832, 1216, 1, 1000);
  e.observe_memory(832, 1216, 2, 1300);
  e.observe_memory(832, 1216, 4, 2100);  // a + b n: not exactly linear
  for (int n : {1, 2, 4}) {
    const auto est = *e.peak_bytes(832, 1216, n);
    EXPECT_GE(est, n == 1 ? 1000u : n == 2 ? 1300u : 2100u) << n;
  }
  EXPECT_LT(*e.peak_bytes(832, 1216, 8), 8u * 1000u) << "the fixed part is not counted per image";
  e.observe_memory(832, 1216, 2, 1250);  // lower repeat keeps the max
  EXPECT_GE(*e.peak_bytes(832, 1216, 2), 1300u);
}

TEST(WorkEstimator, TimeIsMeasuredOrScaledAndMarked) {
  sdxl::WorkEstimator e;
  EXPECT_FALSE(e.seconds_per_image(1024, 1024, 1, 28));
  e.observe_time(1024, 1024, 2, 28, 2 * 28 * 0.05);  // 0.05 s per image-step
  auto t = *e.seconds_per_image(1024, 1024, 2, 20);
  EXPECT_TRUE(t.measured);
  EXPECT_NEAR(t.seconds_per_image, 1.0, 1e-9);
  t = *e.seconds_per_image(512, 512, 2, 28);
  EXPECT_FALSE(t.measured);
  EXPECT_NEAR(t.seconds_per_image, 28 * 0.05 / 4, 1e-9);
}

TEST(WorkEstimator, SavedFiguresComeBackOnlyForTheSameDeviceAndModel) {
  const auto path = std::filesystem::temp_directory_path() / ("sdxl_est_" + std::to_string(::getpid()) + ".json");
  sdxl::WorkEstimator e("cuda/fp16", "sdxl");
  e.observe_memory(1024, 1024, 2, 123456789, 23456789);
  e.observe_time(1024, 1024, 2, 28, 3.0);
  e.save(path);
  auto back = sdxl::WorkEstimator::load(path, "cuda/fp16", "sdxl");
  EXPECT_EQ(back.peak_bytes(1024, 1024, 2), e.peak_bytes(1024, 1024, 2));
  EXPECT_EQ(back.peak_bytes(1024, 1024, 5), e.peak_bytes(1024, 1024, 5)) << "the sampling part came back too";
  ASSERT_TRUE(back.seconds_per_image(1024, 1024, 2, 28));
  std::string why;
  auto other = sdxl::WorkEstimator::load(path, "cuda/bf16", "sdxl", &why);
  EXPECT_TRUE(other.empty());
  EXPECT_NE(why.find("cuda/fp16"), std::string::npos) << why;
  std::filesystem::remove(path);
}

TEST(WorkEstimator, ControlNetBatchesAreKeptApart) {
  const auto path = std::filesystem::temp_directory_path() / ("sdxl_est_cn_" + std::to_string(::getpid()) + ".json");
  sdxl::WorkEstimator e("cuda/fp16", "sdxl");
  e.observe_memory(1024, 1024, 1, 1000);
  EXPECT_FALSE(e.peak_bytes(1024, 1024, 1, 1)) << "a ControlNet batch is not estimated from plain ones";
  EXPECT_EQ(e.max_batch(1024, 1024, 4, 1ull << 40, 1.2, 1), 1) << "it runs alone first and is measured";
  e.observe_memory(1024, 1024, 1, 1800, 0, 1);
  e.observe_time(1024, 1024, 1, 28, 1.4);
  e.observe_time(1024, 1024, 1, 28, 2.8, 1);
  EXPECT_EQ(*e.peak_bytes(1024, 1024, 2, 1), 3600u);
  EXPECT_EQ(*e.peak_bytes(1024, 1024, 2), 2000u);
  EXPECT_NEAR(e.seconds_per_image(1024, 1024, 1, 28, 1)->seconds_per_image, 2.8, 1e-9);
  EXPECT_NEAR(e.seconds_per_image(512, 512, 1, 28, 1)->seconds_per_image, 0.7, 1e-9) << "scaled from its own kind";
  e.save(path);
  const auto back = sdxl::WorkEstimator::load(path, "cuda/fp16", "sdxl");
  EXPECT_EQ(back.peak_bytes(1024, 1024, 2, 1), e.peak_bytes(1024, 1024, 2, 1));
  EXPECT_EQ(back.peak_bytes(1024, 1024, 2), e.peak_bytes(1024, 1024, 2));
  std::filesystem::remove(path);
}

TEST(WorkEstimator, FiguresFromAnotherFolderFillOnlyTheGaps) {
  // A fresh output folder with run --estimates FILE: the 1024x1024 peak measured elsewhere means no
  // image runs alone to be measured; this folder's own figures come first.
  sdxl::WorkEstimator shared("cuda/fp16", "sdxl");
  shared.observe_memory(1024, 1024, 1, 4000, 400);
  shared.observe_memory(832, 1216, 1, 3000);
  shared.observe_time(1024, 1024, 1, 28, 28 * 0.05);
  shared.observe_detailer_regions("face", 3);
  sdxl::WorkEstimator fresh("cuda/fp16", "sdxl");
  EXPECT_EQ(fresh.max_batch(1024, 1024, 8, 1ull << 40, 1.2), 1) << "unmeasured: a probe";
  fresh.fill_from(shared);
  EXPECT_EQ(fresh.max_batch(1024, 1024, 8, 1ull << 40, 1.2), 8) << "measured elsewhere: batches at once";
  EXPECT_EQ(*fresh.peak_bytes(1024, 1024, 2), 4400u);
  sdxl::WorkEstimator own("cuda/fp16", "sdxl");
  own.observe_memory(832, 1216, 1, 3500);
  own.observe_time(1024, 1024, 1, 28, 28 * 0.04);
  own.observe_detailer_regions("face", 1);
  own.fill_from(shared);
  EXPECT_EQ(*own.peak_bytes(832, 1216, 1), 3500u) << "the larger peak of the two";
  EXPECT_EQ(*own.peak_bytes(1024, 1024, 1), 4000u) << "a size only the other measured";
  EXPECT_NEAR(own.seconds_per_image(1024, 1024, 1, 28)->seconds_per_image, 28 * 0.04, 1e-9) << "its own time first";
  EXPECT_NEAR(*own.detailer_regions_per_image("face"), 1.0, 1e-9) << "its own detailer counts first";
}

TEST(WorkEstimator, ReadTellsMissingOtherAndInvalidFilesApart) {
  const auto dir = std::filesystem::temp_directory_path() / ("sdxl_est_read_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  sdxl::WorkEstimator e("cuda/fp16", "sdxl");
  e.observe_memory(1024, 1024, 1, 1000);
  e.save(dir / "est.json");
  using Saved = sdxl::WorkEstimator::Saved;
  sdxl::WorkEstimator into("cuda/fp16", "sdxl");
  EXPECT_EQ(sdxl::WorkEstimator::read(dir / "est.json", "cuda/fp16", "sdxl", into), Saved::ok);
  EXPECT_EQ(into.peak_bytes(1024, 1024, 1), 1000u);
  sdxl::WorkEstimator other("cuda/bf16", "sdxl");
  EXPECT_EQ(sdxl::WorkEstimator::read(dir / "est.json", "cuda/bf16", "sdxl", other), Saved::other_device_or_model);
  EXPECT_TRUE(other.empty());
  sdxl::WorkEstimator none("cuda/fp16", "sdxl");
  EXPECT_EQ(sdxl::WorkEstimator::read(dir / "absent.json", "cuda/fp16", "sdxl", none), Saved::missing);
  for (const char* text : {"shopping list\n", "{\"device\": \"cuda/fp16\", \"model\": \"sdxl\"}", "[1, 2]"}) {
    std::ofstream(dir / "bad.json") << text;
    sdxl::WorkEstimator bad("cuda/fp16", "sdxl");
    std::string why;
    EXPECT_EQ(sdxl::WorkEstimator::read(dir / "bad.json", "cuda/fp16", "sdxl", bad, &why), Saved::invalid) << text;
    EXPECT_TRUE(bad.empty());
    EXPECT_NE(why.find("bad.json"), std::string::npos) << why;
  }
  std::filesystem::remove_all(dir);
}

TEST(Units, SizesAndDeadlines) {
  EXPECT_EQ(sdxl::parse_size_bytes("24GiB"), 24ull << 30);
  EXPECT_EQ(sdxl::parse_size_bytes("12G"), 12ull << 30);
  EXPECT_EQ(sdxl::parse_size_bytes("800MiB"), 800ull << 20);
  EXPECT_EQ(sdxl::parse_size_bytes("1.5gb"), 3ull << 29);
  EXPECT_EQ(sdxl::parse_size_bytes("4096"), 4096u);
  EXPECT_THROW(sdxl::parse_size_bytes("lots"), sdxl::UsageError);
  EXPECT_THROW(sdxl::parse_size_bytes("12 parsecs"), sdxl::UsageError);
  EXPECT_DOUBLE_EQ(sdxl::parse_deadline_unix("1970-01-01T01:00:00Z", 0), 3600.0);
  EXPECT_DOUBLE_EQ(sdxl::parse_deadline_unix("1970-01-01T02:00:00+01:00", 0), 3600.0);
  EXPECT_DOUBLE_EQ(sdxl::parse_deadline_unix("1970-01-01T00:00:00.250-00:30", 0), 1800.0);
  EXPECT_THROW(sdxl::parse_deadline_unix("2026-12-01T06:00:00", 0), sdxl::UsageError) << "no time zone";
  EXPECT_THROW(sdxl::parse_deadline_unix("tomorrow", 0), sdxl::UsageError);
  EXPECT_THROW(sdxl::parse_deadline_unix("25:00", 0), sdxl::UsageError);
  const double now = 1.7e9;
  const double t = sdxl::parse_deadline_unix("06:00", now);
  EXPECT_GT(t, now);
  EXPECT_LE(t, now + 86400 + 3600);
}

TEST(TaskQueue, FileOrderIsTheBaseline) {
  sdxl::QueuePolicy pol;
  pol.file_order = true;
  pol.max_batch = 4;
  TaskQueue q(pol);
  q.push(img(0, Priority::kLow, "A"));
  q.push(img(1, Priority::kHigh, "A", 5));
  q.push(img(2, Priority::kMid, "B"));
  q.push(img(3, Priority::kMid, "A"));
  auto b = q.pop_batch(0, "", nullptr);
  ASSERT_EQ(b.size(), 2u) << "consecutive compatible images only";
  EXPECT_EQ(b[0].handle, 0u);
  EXPECT_EQ(b[1].handle, 1u);
  EXPECT_EQ(drain(q), (std::vector<size_t>{2, 3}));
}

TEST(LruCache, LoadsOnceKeepsTheMostRecentAndSurvivesAFailedLoad) {
  sdxl::LruCache<int> cache(2);
  int made = 0;
  std::vector<std::string> evicted;
  auto get = [&](const std::string& key) {
    return cache.get(key, [&] { return std::make_shared<int>(++made); },
                     [&](const std::string& k) { evicted.push_back(k); });
  };
  const auto a = get("a");
  EXPECT_EQ(*get("a"), *a) << "a hit, not a second load";
  get("b");
  get("a");  // a is now the most recent
  get("c");  // so b goes
  EXPECT_EQ(evicted, std::vector<std::string>{"b"});
  EXPECT_EQ(*a, 1) << "an evicted value lives while held";
  EXPECT_THROW(cache.get("d", []() -> std::shared_ptr<int> { throw std::runtime_error("bad file"); },
                         [](const std::string&) {}),
               std::runtime_error);
  EXPECT_EQ(cache.size(), 2u) << "a failed load leaves the cache as it was";
  const sdxl::LruCacheStats s = cache.stats();
  EXPECT_EQ(s.loads, 3);
  EXPECT_EQ(s.hits, 2);
  EXPECT_EQ(s.evictions, 1);
  EXPECT_EQ(s.resident_bytes, 0u) << "an int has no weights";
}

// Values with weight_bytes() are counted by the cache itself (every model cache's resident MiB).
TEST(LruCache, CountsTheWeightsOfTheValuesItHolds) {
  struct Weights {
    std::uint64_t n;
    std::uint64_t weight_bytes() const { return n; }
  };
  sdxl::LruCache<Weights> cache(2);
  for (std::uint64_t n : {100u, 20u, 3u})
    cache.get(std::to_string(n), [&] { return std::make_shared<Weights>(Weights{n}); }, [](const std::string&) {});
  EXPECT_EQ(cache.stats().resident_bytes, 23u) << "the evicted 100 no longer counts";
}
