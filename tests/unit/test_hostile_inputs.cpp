// Hostile inputs and faults at the file-system and parser level (issue-style
// cases, each with the rule it checks): links planted in a shared output
// folder, lock files, torn and short manifest appends, FIFOs and devices as
// inputs, deep or duplicate-keyed JSON, names that leave their folders,
// damaged model files. tests/e2e/test_hostile.py runs the same cases through
// the real binary.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "batch/batch_file.h"
#include "batch/manifest.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/json_shape.h"
#include "core/run_lock.h"
#include "core/sha256.h"
#include "batch/lora_ref.h"
#include "lora/safetensors.h"
#include "model/model_config.h"

#include "test_support.h"

namespace fs = std::filesystem;

namespace {

using sdxl::testing::slurp;
using sdxl::testing::TempDir;
using sdxl::testing::error_of;
using sdxl::testing::spit;

}  // namespace

// Rule: appends never follow a link; a torn last line never swallows the next record.
TEST(HostileFiles, AppendRefusesLinksAndRepairsTornLines) {
  TempDir d("append");
  spit(d.root / "victim", "precious\n");
  fs::create_symlink(d.root / "victim", d.root / "manifest.jsonl");
  EXPECT_NE(error_of([&] { sdxl::append_line_durable(d.root / "manifest.jsonl", "{}\n"); }).find("symbolic link"),
            std::string::npos);
  EXPECT_EQ(slurp(d.root / "victim"), "precious\n");

  spit(d.root / "m.jsonl", "{\"a\":1}\n{\"torn\":");
  sdxl::append_line_durable(d.root / "m.jsonl", "{\"b\":2}\n");
  EXPECT_EQ(slurp(d.root / "m.jsonl"), "{\"a\":1}\n{\"torn\":\n{\"b\":2}\n");
}

// Rule: a full disk mid-append says "short write" (no stale errno), and the next append is whole.
TEST(HostileFiles, ShortWriteOnAFullDiskIsNamedAndRecovered) {
  TempDir d("short");
  const fs::path m = d.root / "m.jsonl";
  spit(m, "{\"a\":1}\n");
  const std::string line = "{\"long\":\"" + std::string(200, 'x') + "\"}\n";
  const pid_t child = ::fork();
  if (child == 0) {  // the file may grow by 50 bytes: a disk that fills mid-line
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{static_cast<rlim_t>(fs::file_size(m) + 50), RLIM_INFINITY};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    const std::string why = error_of([&] { sdxl::append_line_durable(m, line); });
    ::_exit(why.find("short write, 50 of") != std::string::npos && why.find("disk full") != std::string::npos ? 0 : 1);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the error should say: short write, 50 of N bytes (is the disk full?)";
  sdxl::append_line_durable(m, "{\"b\":2}\n");
  const std::string text = slurp(m);
  EXPECT_EQ(text.substr(text.size() - 9), "\n{\"b\":2}\n") << text;
}

// Rule: a lock file is never followed through a link and never truncated unless it is a lock file.
TEST(HostileFiles, LockFilesAreNotFollowedOrTruncated) {
  TempDir d("lock");
  spit(d.root / "victim", "precious\n");
  fs::create_symlink(d.root / "victim", d.root / ".sdxl-batch.lock");
  EXPECT_NE(error_of([&] { sdxl::RunLock l(d.root / ".sdxl-batch.lock"); }).find("symbolic link"), std::string::npos);
  EXPECT_EQ(slurp(d.root / "victim"), "precious\n");

  spit(d.root / "mine.txt", "a user's notes\n");
  { sdxl::RunLock l(d.root / "mine.txt"); }
  EXPECT_EQ(slurp(d.root / "mine.txt"), "a user's notes\n") << "--lock FILE must not replace the file";

  { sdxl::RunLock l(d.root / "new.lock"); }
  EXPECT_EQ(slurp(d.root / "new.lock"), std::to_string(::getpid()) + "\n");
}

// Rule: plain runs and shard runs of one folder exclude each other; shards coexist.
TEST(HostileFiles, PlainAndShardRunsExcludeEachOther) {
  TempDir d("modes");
  const fs::path lock = d.root / ".sdxl-batch.lock";
  {
    sdxl::RunLock a(lock, sdxl::LockMode::kShared);
    sdxl::RunLock b(lock, sdxl::LockMode::kShared);
    sdxl::RunLock shard(d.root / sdxl::shard_lock_name(0, 2));
    EXPECT_NE(error_of([&] { sdxl::RunLock plain(lock); }).find("holds the lock"), std::string::npos);
    EXPECT_EQ(sdxl::held_shard_locks(d.root), std::vector<std::string>{"0/2"});
  }
  EXPECT_TRUE(sdxl::held_shard_locks(d.root).empty());
  sdxl::RunLock plain(lock);
  EXPECT_NE(error_of([&] { sdxl::RunLock s(lock, sdxl::LockMode::kShared); }).find("holds the lock"),
            std::string::npos);
}

// Rule: only regular files are read as inputs; nothing blocks or reads without bound.
TEST(HostileFiles, FifosDevicesAndFoldersAreRefusedWithoutBlocking) {
  TempDir d("fifo");
  const fs::path fifo = d.root / "pipe.png";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(sdxl::InputFile(fifo, 1 << 20).error().find("FIFO"), std::string::npos);
  EXPECT_NE(error_of([&] { sdxl::SafetensorsFile::open(fifo); }).find("FIFO"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_NE(sdxl::InputFile("/dev/zero", 1 << 20).error().find("device"), std::string::npos);
  EXPECT_NE(sdxl::InputFile(d.root, 1 << 20).error().find("folder"), std::string::npos);
  spit(d.root / "big", std::string(2000, 'x'));
  EXPECT_NE(sdxl::input_file_problem(d.root / "big", 1000).find("larger than 1000 bytes"), std::string::npos);
  EXPECT_EQ(sdxl::read_input_file(d.root / "big", "file", 4000).size(), 2000u);
}

// Rule: JSON is checked for depth before anything walks it, and a key written twice is an error.
TEST(HostileFiles, DeepAndDuplicateKeyedJson) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const auto shape = sdxl::check_json_shape(deep);
  EXPECT_TRUE(shape.too_deep);
  EXPECT_TRUE(sdxl::json_pointer_lines(deep).size() < 100u);  // no stack overflow
  std::vector<sdxl::BatchProblem> p;
  sdxl::parse_batch_text("{\"version\": 1, \"tasks\": " + deep + "}", "b.json", {}, &p);
  ASSERT_FALSE(p.empty());
  EXPECT_NE(p[0].message.find("nested deeper than 64"), std::string::npos);

  p.clear();
  sdxl::parse_batch_text(R"({"version": 1, "tasks": [{"id": "a", "prompt": "x", "steps": 10, "steps": 20}]})", "b.json",
                         {}, &p);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].pointer, "/tasks/0/steps");
  EXPECT_NE(p[0].message.find("written twice"), std::string::npos);
}

// Rule: validate refuses what run would fail on: control characters in names, names too long.
TEST(HostileFiles, NamesThatCannotBeFilesAreRefused) {
  EXPECT_NE(sdxl::check_name_template(std::string("{id}-") + '\0' + "{index}.png").find("control character"),
            std::string::npos);
  EXPECT_NE(sdxl::check_name_template("{id}\n{index}.png").find("control character"), std::string::npos);
  std::vector<sdxl::BatchProblem> p;
  sdxl::parse_batch_text(R"({"version": 1, "tasks": [{"id": ")" + std::string(5000, 'a') + R"(", "prompt": "x"}]})",
                         "b.json", {}, &p);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].pointer, "/tasks/0/id");
  EXPECT_NE(p[0].message.find("255"), std::string::npos);
}

// Rule: a prompt tag reads only inside the LoRA folders; model.json only inside the model folder.
TEST(HostileFiles, NamesMayNotLeaveTheirFolders) {
  TempDir d("leave");
  fs::create_directories(d.root / "loras" / "sub");
  spit(d.root / "outside.safetensors", "x");
  spit(d.root / "loras" / "sub" / "in.safetensors", "x");
  const std::vector<fs::path> dirs{d.root / "loras"};
  for (const std::string& name : std::vector<std::string>{"../outside", (d.root / "outside").string(), "sub/../../outside"})
    EXPECT_NE(error_of([&] { sdxl::resolve_lora(name, 1.0, {}, dirs); }).find("not an absolute path or one with '..'"),
              std::string::npos)
        << name;
  EXPECT_EQ(sdxl::resolve_lora("sub/in", 1.0, {}, dirs).path, d.root / "loras" / "sub" / "in.safetensors");
}

// Rule: --verify-model finds a flipped byte in a file of the right size.
TEST(HostileFiles, VerifyModelFindsAFlippedByte) {
  TempDir d("verify");
  spit(d.root / "unet.ts", std::string(4096, 'w'));
  sdxl::ModelConfig mc;
  mc.dir = d.root;
  mc.file_sha256["unet.ts"] = *sdxl::sha256_file_hex(d.root / "unet.ts");
  EXPECT_EQ(sdxl::verify_model_files(mc), 1);
  std::string bytes = slurp(d.root / "unet.ts");
  bytes[2000] ^= 0x01;
  spit(d.root / "unet.ts", bytes);
  EXPECT_NE(error_of([&] { sdxl::verify_model_files(mc); }).find("unet.ts' has sha256"), std::string::npos);
}

// Rule: a random seed is recorded before its images are made, and read back by a rerun.
TEST(HostileFiles, DrawnSeedsAreRecordedBeforeImages) {
  TempDir d("seeds");
  {
    sdxl::Manifest m(d.root / "manifest.jsonl");
    EXPECT_FALSE(m.task_base_seed("a"));
    m.record_base_seed("a", 1234);
  }
  const sdxl::Manifest again(d.root / "manifest.jsonl");
  EXPECT_EQ(again.task_base_seed("a"), 1234);
  EXPECT_FALSE(fs::exists(d.root / "manifest.jsonl")) << "no image yet, so no manifest line";
}

// Rule: each shard appends to its own manifest and seeds file (no file is appended to by two hosts),
// and every run reads them all; the newest record of an image or a task wins.
TEST(HostileFiles, ShardManifestsAreSeparateAndReadTogether) {
  TempDir d("shards");
  EXPECT_EQ(sdxl::manifest_file_name(0, 1), "manifest.jsonl");
  EXPECT_EQ(sdxl::manifest_file_name(1, 3), "manifest-shard-1-of-3.jsonl");
  auto entry = [](const std::string& task, std::int64_t seed, const std::string& finished) {
    sdxl::ManifestEntry e;
    e.task = task;
    e.seed = seed;
    e.file = task + ".png";
    e.finished = finished;
    return e;
  };
  {
    sdxl::Manifest s0(d.root / sdxl::manifest_file_name(0, 2));
    s0.append(entry("a", 1, "2026-12-01T00:00:00Z"));
    s0.record_base_seed("r", 11);
    sdxl::Manifest s1(d.root / sdxl::manifest_file_name(1, 2));
    s1.append(entry("b", 2, "2026-12-01T00:00:00Z"));
  }
  EXPECT_TRUE(fs::exists(d.root / "seeds-shard-0-of-2.jsonl"));
  sdxl::Manifest plain(d.root / "manifest.jsonl");
  EXPECT_EQ(plain.size(), 2u);
  EXPECT_EQ(plain.task_base_seed("r"), 11);
  plain.append(entry("a", 7, "2026-12-02T00:00:00Z"));
  plain.record_base_seed("r", 99);
  const sdxl::Manifest again(d.root / sdxl::manifest_file_name(0, 2));
  EXPECT_EQ(again.find("a", 0)->seed, 7) << "the newer record of image a#0 wins";
  EXPECT_EQ(again.task_base_seed("r"), 99) << "the newer seed of task r wins";
}
