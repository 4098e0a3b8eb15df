// The public API as a client uses it: built against include/ and sdxl_api
// alone (tests/CMakeLists.txt checks that its include path holds nothing
// else). Opens the tiny model, submits two tasks in code, plans and runs them
// into a fresh folder, checks through the events that two PNGs were written,
// then runs again: the second run resumes and makes nothing.
//
//   example_api MODEL_DIR WORK_DIR     exit 0 when every check holds
#include <sdxl_batch/sdxl_batch.h>

#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

namespace {

// Collects the run's events (they arrive on the run's threads).
class Collect final : public sdxl_batch::EventSink {
 public:
  void on_image(const sdxl_batch::ImageWritten& e) override {
    std::lock_guard lk(mu);
    images.push_back(e);
  }
  void on_task_failed(const sdxl_batch::TaskFailed& e) override {
    std::lock_guard lk(mu);
    failures.push_back(e);
  }
  std::mutex mu;
  std::vector<sdxl_batch::ImageWritten> images;
  std::vector<sdxl_batch::TaskFailed> failures;
};

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

sdxl_batch::Task tiny_task(const std::string& id, const std::string& prompt, std::int64_t seed) {
  sdxl_batch::Task t;
  t.id = id;
  t.prompt = prompt;
  t.seed = seed;
  t.steps = 2;
  t.width = 64;
  t.height = 64;
  return t;
}

int run_example(const std::string& model_dir, const std::filesystem::path& work) {
  std::filesystem::remove_all(work);
  sdxl_batch::Session session({.model_dir = model_dir, .threads = 2});
  session.submit(tiny_task("harbour", "a misty harbour at dawn", 11));
  session.submit(tiny_task("lighthouse", "a lighthouse in a storm, (bold ink:1.2)", 12));
  try {
    session.submit(tiny_task("harbour", "the same id again", 13));
    expect(false, "a second task 'harbour' is refused");
  } catch (const sdxl_batch::UsageError& e) {
    expect(e.exit_code() == 2, std::string("a second task 'harbour' is refused: ") + e.what());
  }
  sdxl_batch::Task wrong = tiny_task("wrong", "too few pixels", 1);
  wrong.width = 60;  // not a multiple of 8
  try {
    session.submit(wrong);
    expect(false, "a task 60 pixels wide is refused");
  } catch (const sdxl_batch::InvalidInputError& e) {
    expect(e.exit_code() == 2 && !e.problems().empty() && e.problems()[0].pointer.rfind("/tasks/2", 0) == 0,
           "a task 60 pixels wide is refused with its problem at /tasks/2 (" + e.problems()[0].pointer + ")");
  }

  sdxl_batch::RunOptions run;
  run.out_dir = (work / "out").string();
  const sdxl_batch::Plan plan = session.plan(run);
  expect(plan.to_make == 2 && plan.skipped == 0 && !plan.batches.empty(), "the plan makes 2 images");
  expect(!std::filesystem::exists(work / "out"), "planning writes nothing");

  Collect first;
  const sdxl_batch::RunResult r1 = session.run(run, &first);
  expect(r1.done == 2 && r1.failed == 0 && r1.exit_code() == sdxl_batch::ExitCode::kOk, "the first run makes 2 images");
  expect(first.images.size() == 2 && first.failures.empty(), "the sink saw 2 images written and no failure");
  for (const auto& img : first.images)
    expect(std::filesystem::is_regular_file(img.path) && std::filesystem::path(img.path).extension() == ".png" &&
               (img.seed == 11 || img.seed == 12),
           "image of task " + img.task_id + " seed " + std::to_string(img.seed) + " is a PNG at " + img.path);

  Collect second;
  const sdxl_batch::RunResult r2 = session.run(run, &second);
  expect(r2.done == 0 && r2.skipped == 2 && second.images.empty(), "the second run resumes: makes nothing, skips 2");
  expect(session.plan(run).to_make == 0, "the plan after the run makes nothing");
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s MODEL_DIR WORK_DIR\n", argv[0]);
    return 2;
  }
  try {
    return run_example(argv[1], argv[2]);
  } catch (const sdxl_batch::Error& e) {
    std::fprintf(stderr, "FAIL %s (exit code %d)\n", e.what(), e.exit_code());
    return 1;
  }
}
