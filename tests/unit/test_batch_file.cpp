#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "batch/batch_file.h"
#include "check/batch_check.h"
#include "pipeline/generator.h"
#include "image/png_writer.h"
#include "core/error.h"
#include "core/units.h"

namespace {

// The parser with the check layer's answers (folders, PNG sizes, sampler names),
// as validate and run use it.
sdxl::BatchFile parse_checked(const std::string& text, const std::filesystem::path& origin,
                              const sdxl::GenerationParams& fallback, std::vector<sdxl::BatchProblem>* problems,
                              const std::vector<std::filesystem::path>& wildcard_dirs = {}) {
  sdxl::FileInputChecks checks;
  return sdxl::parse_batch_text(text, origin, fallback, problems, wildcard_dirs, &checks);
}

std::vector<sdxl::BatchProblem> problems_of(const std::string& text) {
  std::vector<sdxl::BatchProblem> p;
  parse_checked(text, "b.json", sdxl::GenerationParams{}, &p);
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
  auto bf = parse_checked(R"({"version": 1, "defaults": {"negative": "blurry", "steps": 12, "width": 512},
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

TEST(BatchFile, NameTemplates) {
  EXPECT_EQ(sdxl::check_name_template(sdxl::kDefaultNameTemplate), "");
  EXPECT_EQ(sdxl::check_name_template("{date}/{id}-{index}.png"), "");
  EXPECT_NE(sdxl::check_name_template("/abs/{index}.png"), "");
  EXPECT_NE(sdxl::check_name_template("../{index}.png"), "");
  EXPECT_NE(sdxl::check_name_template("a/../../{index}.png"), "");
  EXPECT_NE(sdxl::check_name_template("{id}.png"), "");  // images of one task would collide
  EXPECT_NE(sdxl::check_name_template("{index}.jpg"), "");
  EXPECT_NE(sdxl::check_name_template("{bogus}-{index}.png"), "");
  sdxl::BatchTask t;
  t.id = "s 1";
  t.params.width = 832;
  t.params.height = 1216;
  t.params.cfg = 6.5;
  EXPECT_EQ(sdxl::output_file_name(t, 3, 99, "{date}/{id}_{index}_{seed}_{width}x{height}_{cfg}.png", "2026-11-29"),
            "2026-11-29/s_1_3_99_832x1216_6.5.png");
  // Found by the fuzzer: an unclosed brace used to loop forever.
  EXPECT_EQ(sdxl::output_file_name(t, 1, 2, "{index}-{seedm.png"), "1-{seedm.png");
  auto p = problems_of(R"({"version": 1, "output": {"template": "../x-{index}.png"}, "tasks": [{"id": "a", "prompt": "x"}]})");
  EXPECT_TRUE(has(p, "/output/template"));
}

namespace {
// A fake environment for --shard auto.
sdxl::EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

std::string shard_error(const std::string& text, std::map<std::string, std::string> vars) {
  try {
    sdxl::parse_shard(text, env_of(std::move(vars)));
  } catch (const sdxl::UsageError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(BatchFile, ShardAutoFromTheSchedulersEnvironment) {
  using P = std::pair<int, int>;
  // Slurm: --array=0-3 (COUNT and MIN/MAX agree), --array=1-4, --array=0-15:5, and COUNT alone.
  EXPECT_EQ(sdxl::parse_shard("auto", env_of({{"SLURM_ARRAY_TASK_ID", "2"}, {"SLURM_ARRAY_TASK_COUNT", "4"},
                                               {"SLURM_ARRAY_TASK_MIN", "0"}, {"SLURM_ARRAY_TASK_MAX", "3"}})), (P{2, 4}));
  EXPECT_EQ(sdxl::parse_shard("auto", env_of({{"SLURM_ARRAY_TASK_ID", "1"}, {"SLURM_ARRAY_TASK_MIN", "1"},
                                               {"SLURM_ARRAY_TASK_MAX", "4"}})), (P{0, 4}));
  EXPECT_EQ(sdxl::parse_shard("auto", env_of({{"SLURM_ARRAY_TASK_ID", "10"}, {"SLURM_ARRAY_TASK_MIN", "0"},
                                               {"SLURM_ARRAY_TASK_MAX", "15"}, {"SLURM_ARRAY_TASK_STEP", "5"}})),
            (P{2, 4}));
  EXPECT_EQ(sdxl::parse_shard("auto/4", env_of({{"SLURM_ARRAY_TASK_ID", "3"}, {"SLURM_ARRAY_TASK_COUNT", "4"}})),
            (P{3, 4}));
  // Kubernetes: the index from JOB_COMPLETION_INDEX, the count from auto/N.
  EXPECT_EQ(sdxl::parse_shard("auto/4", env_of({{"JOB_COMPLETION_INDEX", "1"}})), (P{1, 4}));
  // K/N ignores the environment.
  EXPECT_EQ(sdxl::parse_shard("0/2", env_of({{"JOB_COMPLETION_INDEX", "1"}})), (P{0, 2}));
  // Errors name what is wrong.
  EXPECT_NE(shard_error("auto", {}).find("no scheduler's index"), std::string::npos);
  EXPECT_NE(shard_error("auto", {{"JOB_COMPLETION_INDEX", "1"}}).find("auto/N"), std::string::npos);
  EXPECT_NE(shard_error("auto/2", {{"JOB_COMPLETION_INDEX", "2"}}).find("not below the count"), std::string::npos);
  EXPECT_NE(shard_error("auto/3", {{"SLURM_ARRAY_TASK_ID", "0"}, {"SLURM_ARRAY_TASK_COUNT", "4"}}).find("has 4 tasks"),
            std::string::npos);
  EXPECT_NE(shard_error("auto", {{"SLURM_ARRAY_TASK_ID", "3"}, {"SLURM_ARRAY_TASK_COUNT", "3"},
                                 {"SLURM_ARRAY_TASK_MIN", "1"}, {"SLURM_ARRAY_TASK_MAX", "7"}})
                .find("a list such as 1,3,7"),
            std::string::npos);
  EXPECT_NE(shard_error("auto", {{"SLURM_ARRAY_TASK_ID", "2"}}).find("gives no count"), std::string::npos);
  EXPECT_NE(shard_error("auto", {{"SLURM_ARRAY_TASK_ID", "x"}}).find("SLURM_ARRAY_TASK_ID='x'"), std::string::npos);
  EXPECT_NE(shard_error("auto", {{"SLURM_ARRAY_TASK_ID", "1"}, {"SLURM_ARRAY_TASK_COUNT", "4"},
                                 {"JOB_COMPLETION_INDEX", "2"}})
                .find("JOB_COMPLETION_INDEX says 2"),
            std::string::npos);
  EXPECT_NE(shard_error("auto/0", {{"JOB_COMPLETION_INDEX", "0"}}).find("N >= 1"), std::string::npos);
}

// Counts and indices beyond an int are refused, not narrowed into another shard (2^32 + 2 would
// become 2) or a plain run of every task (auto/2^32 + 1 would become 1); a Slurm variable that is
// wrong is named, not JOB_COMPLETION_INDEX.
TEST(BatchFile, ShardAutoRefusesCountsOutOfRange) {
  const std::string big_count =
      shard_error("auto", {{"SLURM_ARRAY_TASK_ID", "2"}, {"SLURM_ARRAY_TASK_COUNT", "4294967298"}});
  EXPECT_NE(big_count.find("SLURM_ARRAY_TASK_COUNT='4294967298' is out of range"), std::string::npos) << big_count;
  EXPECT_NE(shard_error("auto", {{"SLURM_ARRAY_TASK_ID", "0"}, {"SLURM_ARRAY_TASK_COUNT", "2147483648"}})
                .find("out of range"),
            std::string::npos);
  EXPECT_NE(shard_error("auto", {{"SLURM_ARRAY_TASK_ID", "99999999999999999999"}})
                .find("SLURM_ARRAY_TASK_ID='99999999999999999999' is out of range"),
            std::string::npos);
  const std::string k8s = shard_error("auto/4294967297", {{"JOB_COMPLETION_INDEX", "0"}});
  EXPECT_NE(k8s.find("N >= 1 (at most 2147483647)"), std::string::npos) << k8s;
  const std::string range = shard_error("auto", {{"SLURM_ARRAY_TASK_ID", "0"}, {"SLURM_ARRAY_TASK_MIN", "-2000000000"},
                                                 {"SLURM_ARRAY_TASK_MAX", "2000000000"}});
  EXPECT_NE(range.find("the Slurm job array's count 4000000001 is out of range"), std::string::npos) << range;
  const std::string zero = shard_error("auto", {{"SLURM_ARRAY_TASK_ID", "0"}, {"SLURM_ARRAY_TASK_COUNT", "0"}});
  EXPECT_NE(zero.find("SLURM_ARRAY_TASK_COUNT must be 1 or more"), std::string::npos) << zero;
  EXPECT_EQ(zero.find("JOB_COMPLETION_INDEX"), std::string::npos) << zero;
  const std::string past = shard_error("auto", {{"SLURM_ARRAY_TASK_ID", "5"}, {"SLURM_ARRAY_TASK_COUNT", "3"}});
  EXPECT_NE(past.find("the Slurm job array's index 5 is not below the count 3"), std::string::npos) << past;
  EXPECT_EQ(past.find("JOB_COMPLETION_INDEX"), std::string::npos) << past;
  EXPECT_EQ(sdxl::parse_shard("auto", env_of({{"SLURM_ARRAY_TASK_ID", "2147483646"},
                                               {"SLURM_ARRAY_TASK_COUNT", "2147483647"}})),
            (std::pair<int, int>{2147483646, 2147483647}));
}

TEST(BatchFile, ShardsAndDurations) {
  EXPECT_EQ(sdxl::parse_shard("0/4"), (std::pair<int, int>{0, 4}));
  EXPECT_EQ(sdxl::parse_shard("3/4"), (std::pair<int, int>{3, 4}));
  EXPECT_THROW(sdxl::parse_shard("4/4"), sdxl::UsageError);
  EXPECT_THROW(sdxl::parse_shard("1/0"), sdxl::UsageError);
  EXPECT_THROW(sdxl::parse_shard("x/2"), sdxl::UsageError);
  EXPECT_THROW(sdxl::parse_shard("1-2"), sdxl::UsageError);
  EXPECT_DOUBLE_EQ(sdxl::parse_duration_s("90"), 90);
  EXPECT_DOUBLE_EQ(sdxl::parse_duration_s("30m"), 1800);
  EXPECT_DOUBLE_EQ(sdxl::parse_duration_s("1h30m"), 5400);
  EXPECT_DOUBLE_EQ(sdxl::parse_duration_s("2.5s"), 2.5);
  EXPECT_THROW(sdxl::parse_duration_s("6d"), sdxl::UsageError);
  EXPECT_THROW(sdxl::parse_duration_s(""), sdxl::UsageError);
}

TEST(BatchFile, PointerLines) {
  const std::string text = "{\n  \"version\": 1,\n  \"tasks\": [\n    {\"id\": \"a\",\n     \"steps\": 500}\n  ]\n}\n";
  auto lines = sdxl::json_pointer_lines(text);
  EXPECT_EQ(lines[""], 1);
  EXPECT_EQ(lines["/version"], 2);
  EXPECT_EQ(lines["/tasks"], 3);
  EXPECT_EQ(lines["/tasks/0"], 4);
  EXPECT_EQ(lines["/tasks/0/steps"], 5);
}

TEST(BatchFile, SamplersScheduleAndHires) {
  std::vector<sdxl::BatchProblem> p;
  auto bf = parse_checked(R"J({"version": 1, "defaults": {"sampler": "dpm++ 2m karras", "guidance_rescale": 0.7,
      "hires": {"scale": 2, "upscaler": "latent (bicubic)", "steps": 10, "denoise": 0.5}},
      "tasks": [{"id": "a", "prompt": "cat"},
                {"id": "b", "prompt": "dog", "sampler": "Euler a", "schedule": "SGM Uniform"},
                {"id": "c", "prompt": "cow", "schedule": "Exponential"}]})J",
                                   "b.json", sdxl::GenerationParams{}, &p);
  ASSERT_TRUE(p.empty()) << p.front().pointer << ": " << p.front().message;
  EXPECT_EQ(bf.tasks[0].params.sampler, "DPM++ 2M");
  EXPECT_EQ(bf.tasks[0].params.schedule, "Karras");
  EXPECT_EQ(bf.tasks[0].params.guidance_rescale, 0.7);
  EXPECT_EQ(bf.tasks[0].params.hires.upscaler, "Latent (bicubic)");
  EXPECT_EQ(bf.tasks[0].params.hires.steps, 10);
  EXPECT_EQ(bf.tasks[1].params.sampler, "Euler a");
  EXPECT_EQ(bf.tasks[1].params.schedule, "SGM Uniform");
  EXPECT_EQ(bf.tasks[2].params.sampler, "DPM++ 2M");
  EXPECT_EQ(bf.tasks[2].params.schedule, "Exponential");

  auto ps = problems_of(R"({"version": 1, "tasks": [{"id": "a", "prompt": "x", "sampler": "Euler b"},
      {"id": "b", "prompt": "x", "sampler": "DDIM", "schedule": "Karras"},
      {"id": "c", "prompt": "x", "hires": {"upscaler": "ESRGAN"}},
      {"id": "d", "prompt": "x", "init_image": "does-not-exist.png"}]})");
  EXPECT_TRUE(has(ps, "/tasks/0/sampler"));
  EXPECT_TRUE(has(ps, "/tasks/1/sampler"));
  EXPECT_TRUE(has(ps, "/tasks/2/hires/scale"));
  EXPECT_TRUE(has(ps, "/tasks/2/hires/upscaler"));
  EXPECT_TRUE(has(ps, "/tasks/3/init_image"));
  for (const auto& pr : ps) {
    if (pr.pointer == "/tasks/1/sampler") {
      EXPECT_NE(pr.message.find("\"SGM Uniform\""), std::string::npos) << pr.message;
    }
  }
}

TEST(BatchFile, HiresAndImg2ImgParameters) {
  sdxl::GenerationParams p;
  p.prompt = "a cat";
  p.seed = 1;
  p.steps = 20;
  p.width = 1024;
  p.height = 1024;
  p.sampler = "DPM++ 2M";
  p.schedule = "Karras";
  p.hires.scale = 2;
  p.hires.steps = 10;
  p.hires.denoise = 0.5;
  EXPECT_EQ(sdxl::a1111_parameters(p, "m"),
            "a cat\nSteps: 20, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 7, Seed: 1, Size: 1024x1024, "
            "Model: m, Denoising strength: 0.5, Hires upscale: 2, Hires steps: 10, Hires upscaler: Latent, "
            "Version: sdxl-batch 0.1.0");
  EXPECT_EQ(p.hires_width(), 2048);
  p.hires = {};
  p.init_image = "/in/dir/start.png";
  p.strength = 0.6;
  p.guidance_rescale = 0.7;
  EXPECT_EQ(sdxl::a1111_parameters(p, "m"),
            "a cat\nSteps: 20, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 7, Guidance rescale: 0.7, Seed: 1, "
            "Size: 1024x1024, Model: m, Denoising strength: 0.6, Init image: start.png, Version: sdxl-batch 0.1.0");
}

// Every denoising pass leaves a sampler step (int(steps * strength) >= 1), checked before the run: img2img's
// strength, the hires fix's denoise, each detailer unit's denoise at its own steps; from /defaults too.
TEST(BatchFile, StrengthsThatLeaveNoStepAreProblems) {
  std::vector<sdxl::BatchProblem> p;
  sdxl::parse_batch_text(R"({"version": 1, "defaults": {"steps": 20, "detailer": [{"detector": "d", "denoise": 0.04}]},
      "tasks": [{"id": "a", "prompt": "x", "init_image": "i.png", "strength": 0.04, "detailer": null},
                {"id": "b", "prompt": "x", "hires": {"scale": 2, "denoise": 0.01}, "detailer": null},
                {"id": "c", "prompt": "x", "detailer": [{"detector": "d", "denoise": 0.4, "steps": 2}]},
                {"id": "d", "prompt": "x"},
                {"id": "e", "prompt": "x", "init_image": "i.png", "strength": 0.05, "detailer": null}]})",
                         "b.json", sdxl::GenerationParams{}, &p);
  EXPECT_TRUE(has(p, "/tasks/0/strength"));
  EXPECT_TRUE(has(p, "/tasks/1/hires/denoise"));
  EXPECT_TRUE(has(p, "/tasks/2/detailer/0/denoise")) << "int(2 * 0.4) = 0";
  EXPECT_TRUE(has(p, "/tasks/3")) << "the defaults' detailer, named at the task";
  EXPECT_FALSE(has(p, "/tasks/4/strength")) << "int(20 * 0.05) = 1 step";
  EXPECT_EQ(p.size(), 4u);
  for (const auto& q : p) EXPECT_NE(q.message.find("leaves no step"), std::string::npos) << q.pointer << ": " << q.message;
}

TEST(BatchFile, ClipSkipFromTheFallbackDefaultsAndTasks) {
  sdxl::GenerationParams fallback;
  fallback.clip_skip = 4;  // run --clip-skip 4: below the file's defaults and tasks
  std::vector<sdxl::BatchProblem> p;
  auto bf = parse_checked(R"({"version": 1, "defaults": {"clip_skip": 3},
      "tasks": [{"id": "a", "prompt": "cat"}, {"id": "b", "prompt": "dog", "clip_skip": 2}]})",
                                   "b.json", fallback, &p);
  ASSERT_TRUE(p.empty()) << p.front().pointer << ": " << p.front().message;
  EXPECT_EQ(bf.tasks[0].params.clip_skip, 3);
  EXPECT_EQ(bf.tasks[1].params.clip_skip, 2);
  bf = parse_checked(R"({"version": 1, "tasks": [{"id": "a", "prompt": "cat"}]})", "b.json", fallback, &p);
  ASSERT_TRUE(p.empty());
  EXPECT_EQ(bf.tasks[0].params.clip_skip, 4);
  bf = parse_checked(R"({"version": 1, "tasks": [{"id": "a", "prompt": "cat"}]})", "b.json",
                              sdxl::GenerationParams{}, &p);
  EXPECT_EQ(bf.tasks[0].params.clip_skip, 0) << "not set";

  auto ps = problems_of(R"({"version": 1, "defaults": {"clip_skip": 0}, "tasks": [
      {"id": "a", "prompt": "x", "clip_skip": "3"},
      {"id": "b", "prompt": "x", "clip_skip": 1.5},
      {"id": "c", "prompt": "x", "clip_skip": 257}]})");
  EXPECT_TRUE(has(ps, "/defaults/clip_skip"));
  EXPECT_TRUE(has(ps, "/tasks/0/clip_skip"));
  EXPECT_TRUE(has(ps, "/tasks/1/clip_skip"));
  EXPECT_TRUE(has(ps, "/tasks/2/clip_skip"));
  for (const auto& pr : ps) {
    if (pr.pointer == "/tasks/2/clip_skip") {
      EXPECT_EQ(pr.message, "257 is out of range 1..256");
    }
  }
}

TEST(GenerationParams, ClipSkipAndHashesInA1111Order) {
  sdxl::GenerationParams p;
  p.prompt = "a cat, easynegative";
  p.seed = 1;
  p.steps = 20;
  p.clip_skip = 3;
  sdxl::ImageSources src;
  src.model_name = "juggernaut";
  src.model_hash = "31e35c80fc";
  src.vae_name = "sdxl_vae.safetensors";
  src.vae_hash = "235745af8d";
  src.lora_hashes = {{"ink", "0123456789ab"}};
  src.ti_hashes = {{"easynegative", "c74b4e810b03"}, {"badhands", "ba9876543210"}};
  EXPECT_EQ(sdxl::a1111_parameters(p, src),
            "a cat, easynegative\nSteps: 20, Sampler: Euler, Schedule type: Automatic, CFG scale: 7, Seed: 1, "
            "Size: 1024x1024, Model hash: 31e35c80fc, Model: juggernaut, VAE hash: 235745af8d, "
            "VAE: sdxl_vae.safetensors, Clip skip: 3, Lora hashes: \"ink: 0123456789ab\", "
            "TI hashes: \"easynegative: c74b4e810b03, badhands: ba9876543210\", Version: sdxl-batch 0.1.0");
  p.init_image = "/in/start.png";
  p.strength = 0.6;
  src = {};
  src.model_name = "m";
  EXPECT_EQ(sdxl::a1111_parameters(p, src),
            "a cat, easynegative\nSteps: 20, Sampler: Euler, Schedule type: Automatic, CFG scale: 7, Seed: 1, "
            "Size: 1024x1024, Model: m, Denoising strength: 0.6, Clip skip: 3, Init image: start.png, "
            "Version: sdxl-batch 0.1.0");
  p.clip_skip = 0;
  EXPECT_EQ(sdxl::a1111_parameters(p, src).find("Clip skip"), std::string::npos);
}

TEST(GenerationParams, ModelHashesComeFromModelJson) {
  const std::string model_json = R"({
    "format_version": 1, "name": "juggernaut", "architecture": "sdxl-base", "dtype": "fp16",
    "export_device": "cuda", "vae_scaling_factor": 0.13025, "vae_downsample": 8, "latent_channels": 4,
    "text_encoders": [
      {"file": "text_encoder.ts", "tokenizer": "tokenizer", "pad_token": "<|endoftext|>", "hidden_dim": 768},
      {"file": "text_encoder_2.ts", "tokenizer": "tokenizer_2", "pad_token": "!", "hidden_dim": 1280,
       "pooled_dim": 1280}],
    "unet": {"file": "unet.ts", "context_dim": 2048, "pooled_dim": 1280},
    "vae_decoder": {"file": "vae_decoder.ts"},
    "scheduler": {"num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012,
                  "beta_schedule": "scaled_linear", "timestep_spacing": "leading", "prediction_type": "epsilon"},
    "source_file": {"name": "juggernautXL_v9.safetensors",
                    "sha256": "c9e3e68f89b8e38689e1097d4be4573cf308de4e3fd044c64ca697bdb4aa8bca"},
    "vae_file": {"name": "sdxl_vae_fp16_fix.safetensors",
                 "sha256": "235745af8d86bf4a4c1b5b4f529868b37019a10f7c0b2e79ad0abca3a22bc6e1"}})";
  const sdxl::ModelConfig mc = sdxl::parse_model_config(model_json, "/m", "/m/model.json", false);
  sdxl::GenerationParams p;
  p.prompt = "x";
  const std::string s = sdxl::a1111_parameters(p, sdxl::model_sources(mc));
  EXPECT_NE(s.find(", Size: 1024x1024, Model hash: c9e3e68f89, Model: juggernaut, VAE hash: 235745af8d, "
                   "VAE: sdxl_vae_fp16_fix.safetensors, Version:"),
            std::string::npos)
      << s;
  auto without = nlohmann::json::parse(model_json);
  without.erase("source_file");
  without.erase("vae_file");
  const std::string plain = sdxl::a1111_parameters(
      p, sdxl::model_sources(sdxl::parse_model_config(without.dump(), "/m", "/m/model.json", false)));
  EXPECT_NE(plain.find(", Size: 1024x1024, Model: juggernaut, Version:"), std::string::npos) << plain;
}

TEST(BatchFile, ControlNetsAreCheckedAndRelativeToTheBatchFile) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("sdxl_cn_batch_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "cn" / "pose");
  fs::create_directories(dir / "poses");
  std::ofstream(dir / "cn" / "pose" / "controlnet.ts") << "not read by the parser";
  std::ofstream(dir / "cn" / "pose" / "model.json") << R"({"format_version": 1, "kind": "controlnet", "name": "pose",
    "dtype": "fp16", "export_device": "cuda", "controlnet": {"file": "controlnet.ts", "in_channels": 4,
    "context_dim": 64, "pooled_dim": 32, "cond_channels": 3, "downscale": 8, "residuals": 1,
    "channels": [8, 8], "downscales": [1, 1]}})";
  const std::vector<std::uint8_t> px(16 * 8 * 3, 200);
  sdxl::write_png((dir / "poses" / "p01.png").string(), 16, 8, 3, px.data(), {});
  std::vector<sdxl::BatchProblem> p;
  const auto bf = parse_checked(R"({"version": 1,
      "defaults": {"controlnets": [{"model": "cn/pose", "image": "poses/p01.png", "strength": 0.8}]},
      "tasks": [{"id": "a", "prompt": "x"},
                {"id": "b", "prompt": "y", "controlnets": [{"model": "cn/pose", "image": "poses/p01.png",
                                                            "start": 0.2, "end": 0.7}]},
                {"id": "c", "prompt": "z", "controlnets": []}]})",
                                         dir / "b.json", sdxl::GenerationParams{}, &p);
  ASSERT_TRUE(p.empty()) << p[0].pointer << " " << p[0].message;
  ASSERT_EQ(bf.tasks[0].params.controlnets.size(), 1u);
  EXPECT_EQ(bf.tasks[0].params.controlnets[0].model, (dir / "cn" / "pose").string());
  EXPECT_EQ(bf.tasks[0].params.controlnets[0].image, (dir / "poses" / "p01.png").string());
  EXPECT_EQ(bf.tasks[0].params.controlnets[0].strength, 0.8);
  EXPECT_EQ(bf.tasks[1].params.controlnets[0].strength, 1.0) << "a task's list replaces the defaults'";
  EXPECT_EQ(bf.tasks[1].params.controlnets[0].start, 0.2);
  EXPECT_TRUE(bf.tasks[2].params.controlnets.empty());
  p.clear();
  parse_checked(R"({"version": 1, "tasks": [
      {"id": "a", "prompt": "x", "controlnets": [{"model": "cn/none", "image": "poses/p01.png"}]},
      {"id": "b", "prompt": "x", "controlnets": [{"model": "cn/pose", "image": "poses/missing.png"}]},
      {"id": "c", "prompt": "x", "controlnets": [{"model": "cn/pose"}]},
      {"id": "d", "prompt": "x", "controlnets": [{"model": "poses", "image": "poses/p01.png", "start": 0.5, "end": 0.5}]},
      {"id": "e", "prompt": "x", "controlnets": {"model": "cn/pose"}}]})",
                         dir / "b.json", sdxl::GenerationParams{}, &p);
  EXPECT_TRUE(has(p, "/tasks/0/controlnets/0/model"));
  EXPECT_TRUE(has(p, "/tasks/1/controlnets/0/image"));
  EXPECT_TRUE(has(p, "/tasks/2/controlnets/0/image"));
  EXPECT_TRUE(has(p, "/tasks/3/controlnets/0/model")) << "a folder without a ControlNet's model.json";
  EXPECT_TRUE(has(p, "/tasks/3/controlnets/0/start"));
  EXPECT_TRUE(has(p, "/tasks/4/controlnets"));
  fs::remove_all(dir);
}

TEST(GenerationParams, ControlNetUnitsAsTheA1111Extension) {
  sdxl::GenerationParams p;
  p.prompt = "a cat";
  p.seed = 1;
  p.controlnets = {{"/cn/openpose-sdxl", "/p/a.png", 0.8, 0.0, 1.0, "", false}, {"/cn/depth", "/p/b.png", 0.5, 0.25, 0.75, "", false}};
  sdxl::ImageSources src;
  src.model_name = "m";
  src.controlnets = {{"openpose-sdxl", "2b69fca4"}, {"depth", ""}};
  const std::string text = sdxl::a1111_parameters(p, src);
  EXPECT_NE(text.find(", ControlNet 0: \"Module: none, Model: openpose-sdxl [2b69fca4], Weight: 0.8, Resize Mode: "
                      "Just Resize, Guidance Start: 0, Guidance End: 1\", ControlNet 1: \"Module: none, Model: "
                      "depth, Weight: 0.5, Resize Mode: Just Resize, Guidance Start: 0.25, Guidance End: 0.75\", "
                      "Version:"),
            std::string::npos)
      << text;
}

TEST(BatchFile, IpAdapterIsCheckedAndRelativeToTheBatchFile) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("sdxl_ip_batch_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "ip" / "plus");
  fs::create_directories(dir / "refs");
  std::ofstream(dir / "ip" / "plus" / "image_encoder.ts") << "not read by the parser";
  std::ofstream(dir / "ip" / "plus" / "ip_adapter.ts") << "not read by the parser";
  std::ofstream(dir / "ip" / "plus" / "model.json") << R"({"format_version": 1, "kind": "ip_adapter",
    "name": "plus", "variant": "plus", "dtype": "fp16", "export_device": "cuda",
    "image_encoder": {"file": "image_encoder.ts", "image_size": 32, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5],
                      "resample": "bicubic", "output": "hidden_states[-2]", "negative": "zero_image"},
    "adapter": {"file": "ip_adapter.ts", "tokens": 16, "cross_attention_dim": 64, "layers": [32]}})";
  const std::vector<std::uint8_t> px(16 * 8 * 3, 90);
  sdxl::write_png((dir / "refs" / "hero.png").string(), 16, 8, 3, px.data(), {});
  sdxl::write_png((dir / "refs" / "sheet.png").string(), 16, 8, 3, px.data(), {});
  std::vector<sdxl::BatchProblem> p;
  const auto bf = parse_checked(R"({"version": 1,
      "defaults": {"ip_adapter": {"model": "ip/plus", "images": ["refs/hero.png"], "scale": 0.6}},
      "tasks": [{"id": "a", "prompt": "x"},
                {"id": "b", "prompt": "y", "ip_adapter": {"model": "ip/plus", "images": ["refs/hero.png", "refs/sheet.png"]}},
                {"id": "c", "prompt": "z", "ip_adapter": null}]})",
                                         dir / "b.json", sdxl::GenerationParams{}, &p);
  ASSERT_TRUE(p.empty()) << p[0].pointer << " " << p[0].message;
  const sdxl::IpAdapterUse& a = bf.tasks[0].params.ip_adapter;
  EXPECT_EQ(a.model, (dir / "ip" / "plus").string());
  EXPECT_EQ(a.images, std::vector<std::string>{(dir / "refs" / "hero.png").string()});
  EXPECT_EQ(a.scale, 0.6);
  EXPECT_EQ(bf.tasks[1].params.ip_adapter.images.size(), 2u);
  EXPECT_EQ(bf.tasks[1].params.ip_adapter.scale, 1.0) << "a task's adapter replaces the defaults'";
  EXPECT_FALSE(bf.tasks[2].params.ip_adapter.on()) << "null turns the defaults' off";
  p.clear();
  parse_checked(R"({"version": 1, "tasks": [
      {"id": "a", "prompt": "x", "ip_adapter": {"model": "ip/none", "images": ["refs/hero.png"]}},
      {"id": "b", "prompt": "x", "ip_adapter": {"model": "ip/plus", "images": ["refs/missing.png"]}},
      {"id": "c", "prompt": "x", "ip_adapter": {"model": "ip/plus", "images": []}},
      {"id": "d", "prompt": "x", "ip_adapter": {"model": "ip/plus", "images": ["refs/hero.png"], "scale": -1}},
      {"id": "e", "prompt": "x", "ip_adapter": ["ip/plus"]},
      {"id": "f", "prompt": "x", "ip_adapter": {"images": ["refs/hero.png"], "weight": 1}}]})",
                         dir / "b.json", sdxl::GenerationParams{}, &p);
  EXPECT_TRUE(has(p, "/tasks/0/ip_adapter/model"));
  EXPECT_TRUE(has(p, "/tasks/1/ip_adapter/images/0"));
  EXPECT_TRUE(has(p, "/tasks/2/ip_adapter/images"));
  EXPECT_TRUE(has(p, "/tasks/3/ip_adapter/scale"));
  EXPECT_TRUE(has(p, "/tasks/4/ip_adapter"));
  EXPECT_TRUE(has(p, "/tasks/5/ip_adapter/model"));
  EXPECT_TRUE(has(p, "/tasks/5/ip_adapter/weight"));
  fs::remove_all(dir);
}

TEST(GenerationParams, IpAdapterInTheParameters) {
  sdxl::GenerationParams p;
  p.prompt = "a cat";
  p.seed = 1;
  p.ip_adapter = {"/ip/plus", {"/refs/hero.png", "/refs/sheet.png"}, 0.6};
  sdxl::ImageSources src;
  src.model_name = "m";
  src.ip_adapter_name = "ip-adapter-plus_sdxl_vit-h";
  src.ip_adapter_hash = "3f9a1c2b";
  src.ip_images = {{"hero.png", "0123456789"}, {"sheet.png", "abcdefabcd"}};
  const std::string text = sdxl::a1111_parameters(p, src);
  EXPECT_NE(text.find(", IP-Adapter: \"Model: ip-adapter-plus_sdxl_vit-h [3f9a1c2b], Weight: 0.6, Images: hero.png "
                      "[0123456789], sheet.png [abcdefabcd]\", Version:"),
            std::string::npos)
      << text;
}

// batch/ alone: without the check layer the parser reads no folder or PNG and
// keeps sampler names as written, so it can be fuzzed and tested on its own.
TEST(BatchFile, PureParseTakesNamesAsWritten) {
  std::vector<sdxl::BatchProblem> p;
  const auto bf = sdxl::parse_batch_text(
      R"({"version": 1, "tasks": [{"id": "a", "prompt": "cat", "sampler": "dpm++ 2m karras",
          "vae": "no-such-vae", "init_image": "no-such.png", "width": 512, "height": 768,
          "controlnets": [{"model": "no-such-cn", "image": "no-such-pose.png"}]}]})",
      "/tmp/b.json", sdxl::GenerationParams{}, &p);
  ASSERT_TRUE(p.empty()) << p.front().pointer << ": " << p.front().message;
  EXPECT_EQ(bf.tasks[0].params.sampler, "dpm++ 2m karras");
  EXPECT_EQ(bf.tasks[0].params.width, 512);
  EXPECT_EQ(bf.tasks[0].params.init_image, "/tmp/no-such.png");
  // The same file through the check layer: every file it names is a problem.
  std::vector<sdxl::BatchProblem> checked;
  (void)parse_checked(R"({"version": 1, "tasks": [{"id": "a", "prompt": "cat", "sampler": "dpm++ 2m karras",
          "vae": "no-such-vae", "init_image": "no-such.png",
          "controlnets": [{"model": "no-such-cn", "image": "no-such-pose.png"}]}]})",
                      "/tmp/b.json", sdxl::GenerationParams{}, &checked);
  std::set<std::string> pointers;
  for (const auto& c : checked) pointers.insert(c.pointer);
  EXPECT_TRUE(pointers.count("/tasks/0/vae"));
  EXPECT_TRUE(pointers.count("/tasks/0/init_image"));
  EXPECT_TRUE(pointers.count("/tasks/0/controlnets/0/model"));
  EXPECT_TRUE(pointers.count("/tasks/0/controlnets/0/image"));
}

// Inpainting masks: resolved against the batch file, their sha256 recorded;
// a mask without an init image, an empty or unreadable mask, one of another
// aspect ratio and one with the hires fix are problems of the task's "mask".
TEST(BatchFile, InpaintingMasksAreChecked) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("sdxl_mask_batch_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "masks");
  const std::vector<std::uint8_t> init(16 * 8 * 3, 90), white(32 * 16 * 3, 255), black(16 * 8 * 3, 0),
      square(8 * 8 * 3, 255);
  sdxl::write_png((dir / "init.png").string(), 16, 8, 3, init.data(), {});
  sdxl::write_png((dir / "masks" / "big.png").string(), 32, 16, 3, white.data(), {});
  sdxl::write_png((dir / "masks" / "empty.png").string(), 16, 8, 3, black.data(), {});
  sdxl::write_png((dir / "masks" / "square.png").string(), 8, 8, 3, square.data(), {});
  std::ofstream(dir / "masks" / "broken.png") << "not a png";
  std::vector<sdxl::BatchProblem> p;
  const auto bf = parse_checked(R"({"version": 1, "defaults": {"mask_blur": 2},
      "tasks": [{"id": "a", "prompt": "x", "init_image": "init.png", "mask": "masks/big.png"},
                {"id": "b", "prompt": "x", "init_image": "init.png", "mask": "masks/big.png", "mask_blur": 0,
                 "inpaint_area": "masked", "inpaint_padding": 16}]})",
                                dir / "b.json", sdxl::GenerationParams{}, &p);
  ASSERT_TRUE(p.empty()) << p[0].pointer << " " << p[0].message;
  EXPECT_EQ(bf.tasks[0].params.mask, (dir / "masks" / "big.png").string());
  EXPECT_EQ(bf.tasks[0].params.mask_sha256.size(), 64u);
  EXPECT_EQ(bf.tasks[0].params.mask_blur, 2);
  EXPECT_EQ(bf.tasks[1].params.mask_blur, 0);
  const std::string params = sdxl::a1111_parameters(bf.tasks[0].params, "m");
  EXPECT_NE(params.find(", Init image: init.png, Mask blur: 2,"), std::string::npos) << params;
  const std::string masked = sdxl::a1111_parameters(bf.tasks[1].params, "m");
  EXPECT_NE(masked.find(", Mask blur: 0, Inpaint area: Only masked, Masked area padding: 16,"), std::string::npos)
      << masked;

  const auto bad = parse_checked(R"({"version": 1, "tasks": [
      {"id": "a", "prompt": "x", "mask": "masks/big.png"},
      {"id": "b", "prompt": "x", "init_image": "init.png", "mask": "masks/empty.png"},
      {"id": "c", "prompt": "x", "init_image": "init.png", "mask": "masks/broken.png"},
      {"id": "d", "prompt": "x", "init_image": "init.png", "mask": "masks/square.png"},
      {"id": "e", "prompt": "x", "init_image": "init.png", "mask": "masks/big.png", "hires": {"scale": 2}},
      {"id": "f", "prompt": "x", "init_image": "init.png", "mask": "masks/big.png", "mask_blur": 65},
      {"id": "g", "prompt": "x", "init_image": "init.png", "mask": "masks/big.png", "inpaint_area": "only"}]})",
                                 dir / "b.json", sdxl::GenerationParams{}, &p);
  std::map<std::string, std::string> by;
  for (const auto& pr : p) by[pr.pointer] = pr.message;
  EXPECT_NE(by["/tasks/0/mask"].find("no init image"), std::string::npos) << by["/tasks/0/mask"];
  EXPECT_NE(by["/tasks/1/mask"].find("empty mask"), std::string::npos) << by["/tasks/1/mask"];
  EXPECT_NE(by["/tasks/2/mask"].find("broken.png"), std::string::npos) << by["/tasks/2/mask"];
  EXPECT_NE(by["/tasks/3/mask"].find("aspect ratio"), std::string::npos) << by["/tasks/3/mask"];
  EXPECT_NE(by["/tasks/4/mask"].find("hires"), std::string::npos) << by["/tasks/4/mask"];
  EXPECT_TRUE(by.count("/tasks/5/mask_blur"));
  EXPECT_TRUE(by.count("/tasks/6/inpaint_area"));
  fs::remove_all(dir);
}

TEST(BatchFile, UpscaleIsCheckedAgainstTheTaskAndRelativeToTheBatchFile) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("sdxl_upscale_batch_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "up" / "anime");
  fs::create_directories(dir / "notup");
  std::ofstream(dir / "up" / "anime" / "upscaler.ts") << "0123456789";
  const std::string sha(64, 'a');
  std::ofstream(dir / "up" / "anime" / "model.json") << R"({"format_version": 1, "kind": "upscaler",
    "name": "anime", "dtype": "fp16", "export_device": "cpu", "scale": 4,
    "files": {"upscaler.ts": {"bytes": 10, "sha256": ")" << sha << R"("}},
    "upscaler": {"file": "upscaler.ts"}, "architecture": {"id": "ESRGAN"}, "tile": {"fixed": false}})";
  std::ofstream(dir / "notup" / "model.json") << R"({"format_version": 1, "kind": "vae"})";
  std::vector<sdxl::BatchProblem> p;
  const auto bf = parse_checked(R"({"version": 1,
      "defaults": {"width": 768, "height": 1344, "upscale": {"model": "up/anime", "size": "1080x1920", "fit": "crop"}},
      "tasks": [{"id": "a", "prompt": "x"},
                {"id": "b", "prompt": "y", "upscale": {"model": "lanczos", "scale": 1.5}},
                {"id": "c", "prompt": "z", "upscale": null}]})",
                                dir / "b.json", sdxl::GenerationParams{}, &p);
  ASSERT_TRUE(p.empty()) << p[0].pointer << " " << p[0].message;
  const sdxl::UpscaleUse& a = bf.tasks[0].params.upscale;
  EXPECT_EQ(a.model, (dir / "up" / "anime").string());
  EXPECT_EQ(a.width, 1080);
  EXPECT_EQ(a.height, 1920);
  EXPECT_EQ(a.fit, "crop");
  EXPECT_EQ(a.weights_sha256, sha) << "the sha256 model.json records, for the manifest";
  EXPECT_EQ(bf.tasks[1].params.upscale.model, "Lanczos");
  EXPECT_EQ(bf.tasks[1].params.upscale.scale, 1.5);
  EXPECT_FALSE(bf.tasks[2].params.upscale.on()) << "null turns the defaults' off";
  p.clear();
  parse_checked(R"({"version": 1, "defaults": {"width": 512, "height": 512}, "tasks": [
      {"id": "a", "prompt": "x", "upscale": {"model": "up/none", "scale": 2}},
      {"id": "b", "prompt": "x", "upscale": {"model": "notup", "scale": 2}},
      {"id": "c", "prompt": "x", "upscale": {"model": "Lanczos", "scale": 0}},
      {"id": "d", "prompt": "x", "upscale": {"model": "Lanczos", "scale": 2, "size": "100x100"}},
      {"id": "e", "prompt": "x", "upscale": {"model": "Lanczos", "size": "100x100", "fit": "zoom"}},
      {"id": "f", "prompt": "x", "upscale": {"model": "Lanczos", "size": "20000x100"}},
      {"id": "g", "prompt": "x", "upscale": {"model": "Lanczos", "scale": 16}, "width": 2048},
      {"id": "h", "prompt": "x", "upscale": {"model": "Lanczos", "size": "1080 x 1920"}},
      {"id": "i", "prompt": "x", "upscale": {"model": "Lanczos"}},
      {"id": "j", "prompt": "x", "upscale": {"scale": 2, "tile": 64}},
      {"id": "k", "prompt": "x", "upscale": "Lanczos"},
      {"id": "l", "prompt": "x", "upscale": {"model": "Lanczos", "size": "9999999999x1"}}]})",
                dir / "b.json", sdxl::GenerationParams{}, &p);
  EXPECT_TRUE(has(p, "/tasks/0/upscale/model"));
  EXPECT_TRUE(has(p, "/tasks/1/upscale/model"));
  EXPECT_TRUE(has(p, "/tasks/2/upscale/scale"));
  EXPECT_TRUE(has(p, "/tasks/3/upscale/scale"));
  EXPECT_TRUE(has(p, "/tasks/4/upscale/fit"));
  EXPECT_TRUE(has(p, "/tasks/5/upscale/size"));
  EXPECT_TRUE(has(p, "/tasks/6/upscale/scale")) << "2048 x 16 is beyond the largest frame";
  EXPECT_TRUE(has(p, "/tasks/7/upscale/size"));
  EXPECT_TRUE(has(p, "/tasks/8/upscale/size"));
  EXPECT_TRUE(has(p, "/tasks/9/upscale/model"));
  EXPECT_TRUE(has(p, "/tasks/9/upscale/tile"));
  EXPECT_TRUE(has(p, "/tasks/10/upscale"));
  EXPECT_TRUE(has(p, "/tasks/11/upscale/size")) << "digits beyond int's range are a problem, not an exception";
  fs::remove_all(dir);
}

// The hires fix's upscaler: an A1111 name in any case, else an upscaler folder relative to the batch
// file (its weights' sha256 kept for the manifest); a task's keys (its own "scale" required) replace
// the defaults' one by one.
TEST(BatchFile, HiresUpscalerFolderOrName) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("sdxl_hires_up_batch_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "up" / "4x-anime");
  fs::create_directories(dir / "notup");
  std::ofstream(dir / "up" / "4x-anime" / "upscaler.ts") << "0123456789";
  const std::string sha(64, 'b');
  std::ofstream(dir / "up" / "4x-anime" / "model.json") << R"({"format_version": 1, "kind": "upscaler",
    "name": "4x-anime", "dtype": "fp16", "export_device": "cpu", "scale": 4,
    "files": {"upscaler.ts": {"bytes": 10, "sha256": ")" << sha << R"("}},
    "upscaler": {"file": "upscaler.ts"}, "architecture": {"id": "ESRGAN"}, "tile": {"fixed": false}})";
  std::ofstream(dir / "notup" / "model.json") << R"({"format_version": 1, "kind": "vae"})";
  std::vector<sdxl::BatchProblem> p;
  const auto bf = parse_checked(R"({"version": 1,
      "defaults": {"hires": {"scale": 1.5, "upscaler": "up/4x-anime", "steps": 4, "denoise": 0.4}},
      "tasks": [{"id": "a", "prompt": "x"},
                {"id": "b", "prompt": "y", "hires": {"scale": 1.5, "upscaler": "lanczos"}},
                {"id": "c", "prompt": "z", "hires": {"scale": 2}}]})",
                                dir / "b.json", sdxl::GenerationParams{}, &p);
  ASSERT_TRUE(p.empty()) << p[0].pointer << " " << p[0].message;
  const sdxl::GenerationParams& a = bf.tasks[0].params;
  EXPECT_EQ(a.hires.upscaler, (dir / "up" / "4x-anime").string());
  EXPECT_EQ(a.hires.weights_sha256, sha) << "the sha256 model.json records, for the manifest";
  EXPECT_TRUE(a.hires_uses_model());
  EXPECT_NE(sdxl::a1111_parameters(a, "m").find("Hires upscale: 1.5, Hires steps: 4, Hires upscaler: 4x-anime, "),
            std::string::npos)
      << sdxl::a1111_parameters(a, "m");
  const sdxl::GenerationParams& b = bf.tasks[1].params;
  EXPECT_EQ(b.hires.upscaler, "Lanczos");
  EXPECT_FALSE(b.hires_uses_model());
  EXPECT_EQ(b.hires.weights_sha256, "") << "a name has no weights";
  EXPECT_EQ(b.hires.steps, 4) << "the defaults' other keys stay";
  EXPECT_EQ(bf.tasks[2].params.hires.upscaler, a.hires.upscaler);
  EXPECT_EQ(bf.tasks[2].params.hires.scale, 2);
  p.clear();
  parse_checked(R"({"version": 1, "tasks": [
      {"id": "a", "prompt": "x", "hires": {"scale": 2, "upscaler": "up/nowhere"}},
      {"id": "b", "prompt": "x", "hires": {"scale": 2, "upscaler": "notup"}},
      {"id": "c", "prompt": "x", "hires": {"scale": 2, "upscaler": "Latnet"}}]})",
                dir / "b.json", sdxl::GenerationParams{}, &p);
  std::map<std::string, std::string> by;
  for (const auto& pr : p) by[pr.pointer] = pr.message;
  ASSERT_EQ(by.size(), 3u) << (p.empty() ? "" : p[0].message);
  for (const char* ptr : {"/tasks/0/hires/upscaler", "/tasks/1/hires/upscaler", "/tasks/2/hires/upscaler"}) {
    ASSERT_TRUE(by.count(ptr)) << ptr;
    EXPECT_NE(by[ptr].find("not a hires upscaler name"), std::string::npos) << by[ptr];
    EXPECT_NE(by[ptr].find("nor an upscaler folder"), std::string::npos) << by[ptr];
  }
  EXPECT_NE(by["/tasks/0/hires/upscaler"].find("nowhere"), std::string::npos) << by["/tasks/0/hires/upscaler"];
  EXPECT_NE(by["/tasks/1/hires/upscaler"].find("upscaler"), std::string::npos) << by["/tasks/1/hires/upscaler"];
  fs::remove_all(dir);
}

TEST(GenerationParams, UpscaleAddsThePostprocessFieldsAfterVersion) {
  sdxl::GenerationParams p;
  p.prompt = "a cat";
  p.upscale.model = "/up/4x-anime";
  p.upscale.width = 1080;
  p.upscale.height = 1920;
  p.upscale.fit = "crop";
  sdxl::ImageSources src;
  src.model_name = "m";
  src.upscaler_name = "RealESRGAN_x4plus_anime_6B";
  const std::string text = sdxl::a1111_parameters(p, src);
  const std::string tail = ", Postprocess upscale to: 1080x1920, Postprocess upscale fit: crop, "
                           "Postprocess upscaler: RealESRGAN_x4plus_anime_6B";
  ASSERT_GE(text.size(), tail.size());
  EXPECT_EQ(text.substr(text.size() - tail.size()), tail) << text;
  EXPECT_NE(text.find("Size: 1024x1024"), std::string::npos) << "Size stays the generated image's";
  p.upscale = {"Lanczos", 2, 0, 0, "stretch", ""};
  src.upscaler_name = "Lanczos";
  EXPECT_NE(sdxl::a1111_parameters(p, src).find("Version: sdxl-batch 0.1.0, Postprocess upscale by: 2, "
                                                "Postprocess upscaler: Lanczos"),
            std::string::npos);
  EXPECT_EQ(sdxl::upscale_frame_size(p.upscale, 768, 1344), std::make_pair(1536, 2688));
}

namespace sdxl {
namespace {

// A mask is resized to the task's size: one within a pixel of its aspect along either side is fine
// (1024x1023 for 1024x1024 was refused: its width at the task's height is 1025.0).
TEST(BatchFile, AMaskAPixelOffEitherWayIsFine) {
  GenerationParams p;
  p.init_image = "init.png";
  p.width = p.height = 1024;
  EXPECT_EQ(mask_settings_problem(p, 1024, 1023), "");
  EXPECT_EQ(mask_settings_problem(p, 1023, 1024), "");
  EXPECT_NE(mask_settings_problem(p, 1024, 1020), "");
  EXPECT_NE(mask_settings_problem(p, 1000, 1024), "");
}

}  // namespace
}  // namespace sdxl

// An init image's size is the task's unless the task or /defaults sets one: a /defaults size it does not
// have is a problem at the task's init_image, not silently replaced by the image's.
TEST(BatchFile, ADefaultsSizeAnInitImageLacksIsAProblem) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("sdxl_init_defaults_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::vector<std::uint8_t> px(16 * 8 * 3, 128);
  sdxl::write_png((dir / "i.png").string(), 16, 8, 3, px.data(), {});
  std::vector<sdxl::BatchProblem> ps;
  const auto bf = parse_checked(R"({"version": 1, "defaults": {"width": 64, "height": 64},
      "tasks": [{"id": "a", "prompt": "x", "init_image": "i.png"},
                {"id": "b", "prompt": "x", "init_image": "i.png", "width": 16, "height": 8}]})",
                                dir / "b.json", sdxl::GenerationParams{}, &ps);
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].pointer, "/tasks/0/init_image");
  EXPECT_NE(ps[0].message.find("/defaults"), std::string::npos) << ps[0].message;
  ps.clear();
  const auto plain = parse_checked(R"({"version": 1, "tasks": [{"id": "a", "prompt": "x", "init_image": "i.png"}]})",
                                   dir / "b.json", sdxl::GenerationParams{}, &ps);
  EXPECT_TRUE(ps.empty());
  EXPECT_EQ(plain.tasks[0].params.width, 16);
  fs::remove_all(dir);
}
