// Story tools: wildcard syntax and modes (batch/wildcards.h), characters and
// styles (batch/story.h), their batch-file keys, and per-image expansion in
// the work list. The combinatorial order is also checked against the
// dynamicprompts package by tests/e2e/test_story.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "batch/batch_file.h"
#include "test_support.h"
#include "batch/manifest.h"
#include "batch/story.h"
#include "batch/wildcards.h"
#include "core/error.h"
#include "scheduler/work_list.h"

namespace fs = std::filesystem;
using sdxl::WildcardLibrary;

namespace {

std::vector<std::string> all_of(const std::string& t, const WildcardLibrary& lib = WildcardLibrary{}) {
  const std::uint64_t n = sdxl::count_combinations(t, lib, 100000);
  std::vector<std::string> out;
  for (std::uint64_t k = 0; k < n; ++k) out.push_back(sdxl::expand_combination(t, k, lib).text);
  return out;
}

// A wildcards folder in the test's temporary directory.
struct WildcardDir {
  fs::path root;
  // Per process: ctest runs the tests of this file side by side.
  explicit WildcardDir(const std::string& name)
      : root(fs::temp_directory_path() / ("sdxl-wc-" + name + "-" + std::to_string(::getpid()))) {
    fs::remove_all(root);
    fs::create_directories(root);
  }
  ~WildcardDir() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  void write(const std::string& rel, const std::string& text) const {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << text;
  }
};

std::string throws_usage(const std::function<void()>& f) {
  try {
    f();
  } catch (const sdxl::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Wildcards, CombinatorialOrderLeftmostSlowest) {
  EXPECT_EQ(all_of("{a|b} {c|d}"), (std::vector<std::string>{"a c", "a d", "b c", "b d"}));
  EXPECT_EQ(all_of("x {a|{b|c}} y"), (std::vector<std::string>{"x a y", "x b y", "x c y"}));
  EXPECT_EQ(all_of("{a|}"), (std::vector<std::string>{"a", ""}));
  EXPECT_EQ(all_of("{}"), (std::vector<std::string>{""}));
  EXPECT_EQ(all_of("no wildcards"), (std::vector<std::string>{"no wildcards"}));
}

TEST(Wildcards, PickSeveralDifferentOnes) {
  EXPECT_EQ(all_of("{2$$a|b|c}"), (std::vector<std::string>{"a, b", "a, c", "b, a", "b, c", "c, a", "c, b"}));
  EXPECT_EQ(all_of("{1-2$$ and $$a|b}"), (std::vector<std::string>{"a", "b", "a and b", "b and a"}));
  EXPECT_EQ(all_of("{5$$a|b}"), (std::vector<std::string>{"a, b", "b, a"}));  // at most every option once
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    const std::string s = sdxl::expand_random("{2$$a|b|c}", seed, WildcardLibrary{}).text;
    ASSERT_EQ(s.size(), 4u) << s;
    EXPECT_NE(s[0], s[3]) << "the same option twice: " << s;
  }
  EXPECT_NE(throws_usage([] { sdxl::check_template("{3-1$$a|b}", WildcardLibrary{}); }).find("backwards"),
            std::string::npos);
}

TEST(Wildcards, RandomModeFollowsTheSeedOnly) {
  const std::string t = "{red|green|blue|gold} {cat|dog|fox|owl} {day|night}";
  std::set<std::string> seen;
  for (std::uint64_t seed = 1000; seed < 1032; ++seed) {
    const auto a = sdxl::expand_random(t, seed, WildcardLibrary{});
    const auto b = sdxl::expand_random(t, seed, WildcardLibrary{});
    EXPECT_EQ(a.text, b.text);
    EXPECT_EQ(a.choices, b.choices);
    ASSERT_EQ(a.choices.size(), 3u);
    seen.insert(a.text);
  }
  EXPECT_GT(seen.size(), 16u) << "32 seeds should give many different prompts";
  // Pinned: a change of the generator would change the images of existing batch files on a rerun.
  EXPECT_EQ(sdxl::expand_random(t, 42, WildcardLibrary{}).text, "blue cat day");
  EXPECT_EQ(sdxl::expand_random(t, 7, WildcardLibrary{}).text, "green cat night");
  EXPECT_EQ(sdxl::expand_random(t, 123456789, WildcardLibrary{}).text, "red dog day");
}

TEST(Wildcards, WeightsSkewTheDraw) {
  int heavy = 0;
  for (std::uint64_t seed = 0; seed < 2000; ++seed)
    heavy += sdxl::expand_random("{9::a|b}", seed, WildcardLibrary{}).text == "a";
  EXPECT_GT(heavy, 1700);
  EXPECT_LT(heavy, 1900);
  EXPECT_EQ(all_of("{9::a|0.5::b}"), (std::vector<std::string>{"a", "b"}));  // "all" ignores weights
}

TEST(Wildcards, EscapesAndOtherBackslashes) {
  EXPECT_EQ(all_of(R"(\{a\|b\} {x|y})"), (std::vector<std::string>{"{a|b} x", "{a|b} y"}));
  // A1111's escaped parentheses and a plain '|' at the top level reach the prompt parser as written.
  EXPECT_EQ(all_of(R"(\(smile\) a|b {c|d})"), (std::vector<std::string>{R"(\(smile\) a|b c)", R"(\(smile\) a|b d)"}));
  EXPECT_FALSE(sdxl::has_wildcards(R"(\(smile\), [a|b], score_9)"));
  EXPECT_TRUE(sdxl::has_wildcards("a {b|c}"));
  EXPECT_TRUE(sdxl::has_wildcards("__hair__"));
}

TEST(Wildcards, SyntaxErrorsSayWhere) {
  const std::string open = throws_usage([] { sdxl::check_template("a {b|c", WildcardLibrary{}); });
  EXPECT_NE(open.find("never closed"), std::string::npos) << open;
  EXPECT_NE(open.find("character 3"), std::string::npos) << open;
  const std::string close = throws_usage([] { sdxl::check_template("a } b", WildcardLibrary{}); });
  EXPECT_NE(close.find("without its '{'"), std::string::npos) << close;
}

TEST(Wildcards, FilesFoldersSortingAndComments) {
  WildcardDir d("files");
  d.write("hair.txt", "# hair colours\nred\n\n  black  \nblond\r\n");
  d.write("places/inside.txt", "kitchen\nattic with __hair__ dust\n");
  const WildcardLibrary lib({d.root});
  EXPECT_EQ(lib.values("hair"), (std::vector<std::string>{"black", "blond", "red"}));
  EXPECT_EQ(all_of("__hair__ hair", lib), (std::vector<std::string>{"black hair", "blond hair", "red hair"}));
  EXPECT_EQ(all_of("__places/inside__", lib),
            (std::vector<std::string>{"attic with black dust", "attic with blond dust", "attic with red dust",
                                      "kitchen"}));
  const auto e = sdxl::expand_random("__places/inside__", 7, lib);
  ASSERT_FALSE(e.choices.empty());
  EXPECT_EQ(e.choices.back(), "__places/inside__=" + e.text);
  EXPECT_EQ(all_of("a__b c", lib), (std::vector<std::string>{"a__b c"}));  // not a __name__
}

TEST(Wildcards, FirstFolderWinsAndMissingFilesNameTheFolders) {
  WildcardDir a("first"), b("second");
  a.write("mood.txt", "calm\n");
  b.write("mood.txt", "angry\n");
  b.write("only.txt", "here\n");
  const WildcardLibrary lib({a.root, b.root});
  EXPECT_EQ(all_of("__mood__ __only__", lib), (std::vector<std::string>{"calm here"}));
  const std::string missing = throws_usage([&] { sdxl::check_template("__nope__", lib); });
  EXPECT_NE(missing.find("nope.txt"), std::string::npos) << missing;
  EXPECT_NE(missing.find(a.root.string()), std::string::npos) << missing;
  const std::string none = throws_usage([] { sdxl::check_template("__nope__", WildcardLibrary{}); });
  EXPECT_NE(none.find("--wildcards-dir"), std::string::npos) << none;
  const std::string outside = throws_usage([&] { sdxl::check_template("__../secret__", lib); });
  EXPECT_NE(outside.find("may not leave"), std::string::npos) << outside;
}

TEST(Wildcards, EmptyFilesAndDeepNestingAreRefused) {
  WildcardDir d("empty");
  d.write("none.txt", "# only a comment\n\n");
  const std::string empty = throws_usage([&] { sdxl::check_template("__none__", WildcardLibrary({d.root})); });
  EXPECT_NE(empty.find("has no values"), std::string::npos) << empty;
  const std::string deep = std::string(10000, '{') + "a" + std::string(10000, '}');
  const std::string why = throws_usage([&] { sdxl::check_template(deep, WildcardLibrary{}); });
  EXPECT_NE(why.find("nested deeper than 64"), std::string::npos) << why.substr(0, 200);
  EXPECT_EQ(all_of(std::string(60, '{') + "a|b" + std::string(60, '}')), (std::vector<std::string>{"a", "b"}));
}

TEST(Wildcards, CyclesAreRefused) {
  WildcardDir d("cycle");
  d.write("a.txt", "x __b__\n");
  d.write("b.txt", "y __a__\n");
  const std::string why = throws_usage([&] { sdxl::check_template("__a__", WildcardLibrary({d.root})); });
  EXPECT_NE(why.find("cycle: __a__ -> __b__ -> __a__"), std::string::npos) << why;
}

TEST(Wildcards, CountsSaturateAtTheLimit) {
  const std::string t = "{a|b|c|d|e|f|g|h|i|j}{a|b|c|d|e|f|g|h|i|j}{a|b|c|d|e|f|g|h|i|j}{a|b|c|d|e|f|g|h|i|j}";
  EXPECT_EQ(sdxl::count_combinations(t, WildcardLibrary{}, 1000), 1001u);
  EXPECT_EQ(sdxl::count_combinations(t, WildcardLibrary{}, 100000), 10000u);
  EXPECT_EQ(sdxl::expand_combination(t, 1234, WildcardLibrary{}).text, "bcde");
}

TEST(Story, StylesFollowA1111) {
  EXPECT_EQ(sdxl::apply_style_text("ink, {prompt}, halftone", "a cat"), "ink, a cat, halftone");
  EXPECT_EQ(sdxl::apply_style_text("ink drawing", "a cat"), "a cat, ink drawing");
  EXPECT_EQ(sdxl::apply_style_text("ink drawing", ""), "ink drawing");
  EXPECT_EQ(sdxl::apply_style_text("", "a cat"), "a cat");
}

TEST(Story, CharactersJoinPromptNegativeAndLoras) {
  sdxl::StoryBook book;
  book.characters["hero"] = {"Mara, red scarf", "extra fingers", {{"hero", "/l/hero.safetensors", 0.8, false}}, "", 1.0};
  book.characters["fox"] = {"Pip the fox", "", {{"ink", "/l/ink.safetensors", 0.5, false}}, "", 1.0};
  book.styles["ink"] = {"comic panel, {prompt}, ink", "photo"};
  sdxl::GenerationParams p;
  p.prompt = "at the harbour";
  p.negative_prompt = "blurry";
  p.loras = {{"ink", "/l/ink.safetensors", 0.5, false}};
  std::vector<std::pair<std::string, std::string>> problems;
  sdxl::apply_story(book, {"hero", "fox"}, "ink", p, problems);
  EXPECT_TRUE(problems.empty());
  EXPECT_EQ(p.prompt, "comic panel, at the harbour, Mara, red scarf, Pip the fox, ink");
  EXPECT_EQ(p.negative_prompt, "blurry, extra fingers, photo");
  ASSERT_EQ(p.loras.size(), 2u);  // ink named twice at the same weight counts once
  EXPECT_EQ(p.loras[1].name, "hero");

  sdxl::GenerationParams q;
  q.loras = {{"ink", "/l/ink.safetensors", 1.0, false}};
  sdxl::apply_story(book, {"fox", "ghost"}, "pencil", q, problems);
  ASSERT_EQ(problems.size(), 3u);
  EXPECT_EQ(problems[0].first, "/characters/0");
  EXPECT_NE(problems[0].second.find("weight 0.5"), std::string::npos) << problems[0].second;
  EXPECT_EQ(problems[1].first, "/characters/1");
  EXPECT_NE(problems[1].second.find("unknown character 'ghost'"), std::string::npos);
  EXPECT_NE(problems[1].second.find("fox, hero"), std::string::npos) << problems[1].second;
  EXPECT_EQ(problems[2].first, "/style");
}

namespace {

// Parses `text` as a batch file in a folder that holds l/hero.safetensors.
std::vector<sdxl::BatchProblem> story_problems(const std::string& text, sdxl::BatchFile* out = nullptr) {
  static const WildcardDir dir("batch");
  dir.write("l/hero.safetensors", "");
  std::vector<sdxl::BatchProblem> p;
  sdxl::BatchFile bf = sdxl::parse_batch_text(text, dir.root / "b.json", sdxl::GenerationParams{}, &p);
  if (out) *out = bf;
  return p;
}

using sdxl::testing::problem_at;

const char* kStoryHeader = R"("version": 1,
    "loras": {"hero": {"path": "l/hero.safetensors"}},
    "characters": {"mara": {"prompt": "Mara", "negative": "extra fingers", "loras": [{"name": "hero", "weight": 0.8}]},
                   "pip": {"prompt": "Pip the fox"}},
    "styles": {"ink": {"prompt": "comic, {prompt}, ink", "negative": "photo"}},
    "defaults": {"negative": "blurry", "characters": ["mara"], "style": "ink"},)";

}  // namespace

TEST(StoryBatchFile, CharactersAndStylesFromDefaultsAndTasks) {
  sdxl::BatchFile bf;
  const auto p = story_problems(std::string("{") + kStoryHeader + R"(
    "tasks": [{"id": "a", "prompt": "at sea", "seed": 1},
              {"id": "b", "prompt": "on land", "characters": ["pip"], "style": "", "seed": 2}]})", &bf);
  ASSERT_TRUE(p.empty()) << p[0].pointer << ": " << p[0].message;
  ASSERT_EQ(bf.tasks.size(), 2u);
  EXPECT_EQ(bf.tasks[0].params.prompt, "comic, at sea, Mara, ink");
  EXPECT_EQ(bf.tasks[0].params.negative_prompt, "blurry, extra fingers, photo");
  ASSERT_EQ(bf.tasks[0].params.loras.size(), 1u);
  EXPECT_EQ(bf.tasks[0].params.loras[0].weight, 0.8);
  EXPECT_EQ(bf.tasks[0].source_prompt, "at sea");
  EXPECT_EQ(bf.tasks[0].characters, (std::vector<std::string>{"mara"}));
  EXPECT_EQ(bf.tasks[0].style, "ink");
  EXPECT_EQ(bf.tasks[1].params.prompt, "on land, Pip the fox");
  EXPECT_TRUE(bf.tasks[1].params.loras.empty());
}

TEST(StoryBatchFile, ProblemsNameTheTaskAndKey) {
  const auto p = story_problems(std::string("{") + kStoryHeader + R"(
    "tasks": [{"id": "a", "prompt": "x", "characters": ["ghost"]},
              {"id": "b", "prompt": "x", "style": "oil"},
              {"id": "c", "prompt": "x", "loras": [{"name": "hero", "weight": 1.0}]},
              {"id": "d", "prompt": "{a|b", "expand": "everything"},
              {"id": "e", "prompt": "__hair__"}]})");
  EXPECT_NE(problem_at(p, "/tasks/0/characters/0").find("unknown character 'ghost'"), std::string::npos);
  EXPECT_NE(problem_at(p, "/tasks/1/style").find("unknown style 'oil'"), std::string::npos);
  EXPECT_NE(problem_at(p, "/tasks/2/characters/0").find("already has it at 1"), std::string::npos);
  EXPECT_NE(problem_at(p, "/tasks/3/expand").find("not random or all"), std::string::npos);
  EXPECT_NE(problem_at(p, "/tasks/3/prompt").find("never closed"), std::string::npos);
  EXPECT_NE(problem_at(p, "/tasks/4/prompt").find("hair.txt"), std::string::npos);
  const auto top = story_problems(R"({"version": 1, "characters": [1], "styles": {"ink": "x"},
    "tasks": [{"id": "a", "prompt": "x"}]})");
  EXPECT_FALSE(problem_at(top, "/characters").empty());
  EXPECT_FALSE(problem_at(top, "/styles/ink").empty());
}

TEST(StoryBatchFile, ExpandAllMakesOneImagePerCombinationWithinMaxImages) {
  sdxl::BatchFile bf;
  auto p = story_problems(R"({"version": 1, "tasks": [
      {"id": "a", "prompt": "{red|blue} {cat|dog|owl}", "expand": "all", "seed": 5}]})", &bf);
  ASSERT_TRUE(p.empty());
  EXPECT_TRUE(bf.tasks[0].expand_all);
  EXPECT_EQ(bf.tasks[0].count, 6);
  p = story_problems(R"({"version": 1, "defaults": {"expand": "all", "max_images": 5}, "tasks": [
      {"id": "a", "prompt": "{red|blue} {cat|dog|owl}"},
      {"id": "b", "prompt": "{red|blue}", "count": 3}]})");
  EXPECT_NE(problem_at(p, "/tasks/0/expand").find("more than 5 images"), std::string::npos);
  EXPECT_NE(problem_at(p, "/tasks/1/count").find("cannot be combined"), std::string::npos);
}

TEST(StoryBatchFile, WorkListExpandsEachImageFromItsSeedAndShardsAgree) {
  sdxl::BatchFile bf;
  const auto p = story_problems(R"({"version": 1, "tasks": [
      {"id": "a", "prompt": "{red|green|blue|gold} {cat|dog|fox|owl}", "negative": "{dark|pale}", "seed": 10, "count": 8},
      {"id": "b", "prompt": "{x|y} z", "expand": "all", "seed": 3},
      {"id": "c", "prompt": "plain", "seed": 4}]})", &bf);
  ASSERT_TRUE(p.empty());
  const fs::path dir = fs::temp_directory_path() / ("sdxl-story-work-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const sdxl::Manifest m(dir / "manifest.jsonl");
  const auto all = sdxl::build_work(bf, {}, m, dir, "2026-12-02", 0);
  ASSERT_EQ(all.work.size(), 11u);
  std::map<std::pair<std::string, int>, std::string> prompts;
  for (const auto& w : all.work) {
    prompts[{w.task->id, w.index}] = w.params.prompt + " / " + w.params.negative_prompt;
    if (w.task->id == "a") {
      const auto e = sdxl::expand_image_prompt(w.task->params, false, w.index, w.params.seed, sdxl::WildcardLibrary{});
      EXPECT_EQ(w.params.prompt, e.prompt);
      EXPECT_EQ(w.params.negative_prompt, e.negative);
      EXPECT_EQ(w.wildcard_choices.size(), 3u);
    }
  }
  EXPECT_EQ((prompts[{"b", 0}]), "x z / ");
  EXPECT_EQ((prompts[{"b", 1}]), "y z / ");
  EXPECT_EQ((prompts[{"c", 0}]), "plain / ");
  std::set<std::string> distinct;
  for (int i = 0; i < 8; ++i) distinct.insert(prompts[std::make_pair(std::string("a"), i)]);
  EXPECT_GT(distinct.size(), 3u) << "the images of a task should not all get the same expansion";
  // Shards make the same prompts as one run.
  for (int k = 0; k < 2; ++k)
    for (const auto& w : sdxl::build_work(bf, {false, k, 2, ""}, m, dir, "2026-12-02", 0).work)
      EXPECT_EQ((prompts[{w.task->id, w.index}]), w.params.prompt + " / " + w.params.negative_prompt);
}
