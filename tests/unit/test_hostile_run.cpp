// Hostile conditions of a run, below the CLI (issue 46; each test names its
// rule): temporary files of shards on other hosts, durations that are not
// finite, a LoRA named twice, the queue's cost on a large plan, and where a
// problem of "defaults" is reported. tests/e2e/test_hostile_run.py runs the
// same rules through the real binary.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>

#include "batch/batch_file.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/units.h"
#include "batch/lora_ref.h"
#include "scheduler/output_folder.h"
#include "scheduler/task_queue.h"

#include "test_support.h"

namespace fs = std::filesystem;

namespace {

using sdxl::testing::TempDir;

void touch(const fs::path& p) { std::ofstream(p, std::ios::binary) << "half a file"; }

// A pid that ran on this host and is gone: a child that exited and was reaped.
long dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

}  // namespace

// Rule: a temporary name says which host (and PID namespace), process and shard wrote it,
// and always fits in a file name.
TEST(HostileRun, TempFileNamesCarryHostPidAndShard) {
  sdxl::set_temp_file_tag("shard-1-of-4");
  const sdxl::TempFileOwner me = sdxl::this_temp_file_owner();
  sdxl::set_temp_file_tag("");
  EXPECT_FALSE(me.host.empty());
  EXPECT_EQ(me.pid, ::getpid());
  EXPECT_EQ(me.tag, "shard-1-of-4");
  for (const std::string& target : {std::string("a~b.c.png"), std::string(250, 'x') + ".png"}) {
    const std::string name = sdxl::temp_file_name(target, me, 7);
    EXPECT_LE(name.size(), 255u) << name;
    EXPECT_EQ(name.front(), '.');
    const auto back = sdxl::parse_temp_file_name(name);
    ASSERT_TRUE(back) << name;
    EXPECT_EQ(back->host, me.host);
    EXPECT_EQ(back->pid, me.pid);
    EXPECT_EQ(back->tag, "shard-1-of-4");
  }
  EXPECT_FALSE(sdxl::parse_temp_file_name(".a.png.1234.0.tmp")) << "an older name has no host";
  EXPECT_FALSE(sdxl::parse_temp_file_name("a.png"));
  TempDir d("names");
  sdxl::write_file_atomic(d.root / "x.txt", std::string_view("whole"));
  EXPECT_EQ(std::distance(fs::directory_iterator(d.root), fs::directory_iterator()), 1) << "no temporary file left";
}

// Rule: start-up clean-up removes only temporary files it can prove dead: this
// host's (and PID namespace's) files of a process that is gone, or its own;
// never another host's file, a live process's, or a name without a host.
TEST(HostileRun, CleanupRemovesOnlyTempFilesProvablyDeadHere) {
  TempDir d("cleanup");
  fs::create_directories(d.root / "sub");
  const sdxl::TempFileOwner me = sdxl::this_temp_file_owner();
  const long dead = dead_pid();
  const sdxl::TempFileOwner other_host{"node7@4026531836", dead, "shard-1-of-2"};
  const sdxl::TempFileOwner here_dead{me.host, dead, "shard-0-of-2"};
  const sdxl::TempFileOwner here_live{me.host, static_cast<long>(::getppid()), ""};
  const std::vector<fs::path> keep{d.root / sdxl::temp_file_name("a.png", other_host, 0),
                                   d.root / sdxl::temp_file_name("b.png", here_live, 0),
                                   d.root / (".c.png." + std::to_string(dead) + ".0.tmp")};
  const std::vector<fs::path> gone{d.root / sdxl::temp_file_name("d.png", here_dead, 0),
                                   d.root / "sub" / sdxl::temp_file_name("e.png", here_dead, 1),
                                   d.root / sdxl::temp_file_name("f.png", me, 2)};
  for (const auto& p : keep) touch(p);
  for (const auto& p : gone) touch(p);
  EXPECT_FALSE(sdxl::temp_file_owner_is_gone(other_host, me)) << "another host's pid says nothing here";
  EXPECT_TRUE(sdxl::temp_file_owner_is_gone(here_dead, me));
  EXPECT_FALSE(sdxl::temp_file_owner_is_gone(here_live, me));
  EXPECT_EQ(sdxl::remove_stale_temp_files(d.root), static_cast<int>(gone.size()));
  for (const auto& p : keep) EXPECT_TRUE(fs::exists(p)) << p;
  for (const auto& p : gone) EXPECT_FALSE(fs::exists(p)) << p;
}

// Rule: a duration is finite and 0 or more; NaN and infinities never mean "no limit".
TEST(HostileRun, DurationsAreFiniteAndNotNegative) {
  for (const std::string bad : {"nan", "inf", "infinity", "-nan", "-5", "1m-1s", "1e308h", "nanm"})
    EXPECT_THROW(sdxl::parse_duration_s(bad), sdxl::UsageError) << bad;
  EXPECT_EQ(sdxl::parse_duration_s("0"), 0.0);
  EXPECT_EQ(sdxl::parse_duration_s("1h30m"), 5400.0);
  std::vector<sdxl::BatchProblem> p;
  sdxl::parse_batch_text(R"({"version": 1, "tasks": [{"id": "a", "prompt": "x", "timeout": "0s"},
                                                       {"id": "b", "prompt": "x", "timeout": "nan"}]})",
                         "b.json", {}, &p);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].pointer, "/tasks/0/timeout");
  EXPECT_EQ(p[1].pointer, "/tasks/1/timeout");
}

// Rule: a LoRA named by the task (or a character) and by a prompt tag counts
// once at the same weight; at another weight it is an error naming both.
TEST(HostileRun, ALoraNamedTwiceAppliesOnce) {
  TempDir d("lora");
  touch(d.root / "ink.safetensors");
  const sdxl::LoraRegistry registry{{"ink", {d.root / "ink.safetensors", true}}};
  sdxl::LoraRef ink;
  ink.name = "ink";
  ink.path = d.root / "." / "ink.safetensors";  // the same file, spelled otherwise
  ink.weight = 0.5;
  const auto set = sdxl::merge_lora_tags({ink}, {{"ink", 0.5}}, registry, {});
  ASSERT_EQ(set.size(), 1u);
  EXPECT_EQ(set[0].weight, 0.5);
  EXPECT_TRUE(set[0].pin) << "pinned if either names it pinned";
  EXPECT_EQ(sdxl::merge_lora_tags({ink, ink}, {}, registry, {}).size(), 1u);
  try {
    sdxl::merge_lora_tags({ink}, {{"ink", 0.7}}, registry, {});
    FAIL() << "another weight must be an error";
  } catch (const sdxl::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("at weight 0.7"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("at weight 0.5"), std::string::npos) << e.what();
  }
}

// Rule: a brace error in the defaults' negative is reported at /defaults/negative, once.
TEST(HostileRun, DefaultsProblemsPointAtTheDefaults) {
  std::vector<sdxl::BatchProblem> p;
  sdxl::parse_batch_text(R"({"version": 1, "defaults": {"negative": "blurry, {ugly|bad"},
                             "tasks": [{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y {1|2}"}]})",
                         "b.json", {}, &p);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].pointer, "/defaults/negative");
  p.clear();
  sdxl::parse_batch_text(R"({"version": 1, "tasks": [{"id": "a", "prompt": "x", "negative": "{ugly|bad"}]})", "b.json",
                         {}, &p);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].pointer, "/tasks/0/negative");
}

namespace {

// The queue's order by its definition: everything left sorted for each batch.
// The reference the kept order must match batch for batch.
class ReferenceQueue {
 public:
  explicit ReferenceQueue(sdxl::QueuePolicy p) : policy_(p), probe_(p) {}
  void push(sdxl::QueuedImage q) {
    q.sequence = next_++;
    items_.push_back(q);
  }
  void requeue(const std::vector<sdxl::QueuedImage>& qs) { items_.insert(items_.end(), qs.begin(), qs.end()); }
  bool empty() const { return items_.empty(); }
  std::vector<sdxl::QueuedImage> pop_batch(double now, const std::string& lora, int want) {
    auto before = [&](const sdxl::QueuedImage& a, const sdxl::QueuedImage& b) {
      if (policy_.file_order) return a.sequence < b.sequence;
      const int ca = probe_.effective_class(a, now), cb = probe_.effective_class(b, now);
      if (ca != cb) return ca < cb;
      if ((a.deadline_s >= 0) != (b.deadline_s >= 0)) return a.deadline_s >= 0;
      if (a.deadline_s >= 0 && a.deadline_s != b.deadline_s) return a.deadline_s < b.deadline_s;
      if ((a.lora_set == lora) != (b.lora_set == lora)) return a.lora_set == lora;
      return a.sequence < b.sequence;
    };
    std::vector<sdxl::QueuedImage> v = items_;
    std::sort(v.begin(), v.end(), before);
    std::vector<sdxl::QueuedImage> c{v[0]};
    for (size_t k = 1; k < v.size(); ++k) {
      if (v[k].group != v[0].group) {
        if (policy_.file_order) break;
        continue;
      }
      if (!policy_.fill_lower && probe_.effective_class(v[k], now) != probe_.effective_class(v[0], now)) continue;
      c.push_back(v[k]);
    }
    c.resize(std::min<size_t>({c.size(), static_cast<size_t>(policy_.max_batch), static_cast<size_t>(want)}));
    for (const auto& q : c)
      items_.erase(std::find_if(items_.begin(), items_.end(), [&](const auto& x) { return x.sequence == q.sequence; }));
    return c;
  }

 private:
  sdxl::QueuePolicy policy_;
  sdxl::TaskQueue probe_;  // its effective_class only
  std::vector<sdxl::QueuedImage> items_;
  std::uint64_t next_ = 0;
};

std::vector<size_t> handles(const std::vector<sdxl::QueuedImage>& b) {
  std::vector<size_t> h;
  for (const auto& q : b) h.push_back(q.handle);
  return h;
}

}  // namespace

// Rule: the queue that keeps its order pops exactly the batches of a full sort
// per batch: classes, aging over time, deadlines, LoRA affinity, groups,
// admission, requeues, file order and fill_lower.
TEST(HostileRun, KeptOrderMatchesASortPerBatch) {
  for (unsigned seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
    sdxl::QueuePolicy policy;
    policy.aging_s = pick(3) == 0 ? 0 : 5 + pick(20);
    policy.max_batch = 1 + pick(4);
    policy.fill_lower = pick(2) == 0;
    policy.file_order = pick(5) == 0;
    sdxl::TaskQueue fast(policy);
    ReferenceQueue ref(policy);
    for (size_t h = 0; h < 150; ++h) {
      sdxl::QueuedImage q;
      q.handle = h;
      q.priority = static_cast<sdxl::Priority>(pick(3));
      q.deadline_s = pick(3) == 0 ? 10.0 * pick(10) : -1;
      q.group = "g" + std::to_string(pick(3));
      q.lora_set = pick(2) == 0 ? "" : "l" + std::to_string(pick(3));
      q.enqueued_s = pick(4) == 0 ? pick(30) : 0;
      fast.push(q);
      ref.push(q);
    }
    double now = 0;
    std::string lora;
    while (!ref.empty()) {
      ASSERT_FALSE(fast.empty());
      now += pick(4) == 0 ? 0 : pick(7) * 1.5;
      const int want = 1 + pick(4);
      const auto a = fast.pop_batch(now, lora, [&](const sdxl::QueuedImage&, int) { return want; });
      const auto b = ref.pop_batch(now, lora, want);
      ASSERT_EQ(handles(a), handles(b)) << "seed " << seed << " at " << now;
      lora = a.front().lora_set;
      if (pick(10) == 0) {  // a batch that failed comes back
        fast.requeue(a);
        ref.requeue(b);
      }
    }
    EXPECT_TRUE(fast.empty());
  }
}

// Rule: planning is n log n: 100k images popped one by one (aging on, the clock
// moving, two groups, three classes) take well under seconds, not minutes.
TEST(HostileRun, PoppingALargeQueueIsNotQuadratic) {
  sdxl::QueuePolicy policy;
  policy.max_batch = 1;
  sdxl::TaskQueue q(policy);
  constexpr size_t kImages = 100000;
  for (size_t h = 0; h < kImages; ++h) {
    sdxl::QueuedImage im;
    im.handle = h;
    im.priority = static_cast<sdxl::Priority>(h % 3);
    im.group = h % 2 ? "1024x1024" : "832x1216";
    q.push(im);
  }
  const auto t0 = std::chrono::steady_clock::now();
  size_t popped = 0;
  for (double now = 0; !q.empty(); now += 0.05) popped += q.pop_batch(now, "", nullptr).size();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(popped, kImages);
  EXPECT_LT(s, 5.0) << "100k pops took " << s << " s";
}
