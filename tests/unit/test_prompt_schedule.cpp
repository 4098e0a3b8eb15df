// A1111 prompt editing and alternation (text/prompt_schedule.h) against the goldens
// that tests/reference/prompt_schedule_reference.py wrote with lark and A1111's grammar
// (tests/reference/prompt_schedule_goldens.json, committed: lark is not a requirement),
// and the refusals and step lookups A1111 reads the same way.
#include <gtest/gtest.h>

#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/prompt_schedule.h"

namespace sdxl {
namespace {

nlohmann::json load_goldens() {
  std::ifstream in(std::string(SDXL_REFERENCE_DIR) + "/prompt_schedule_goldens.json");
  EXPECT_TRUE(in.good()) << "tests/reference/prompt_schedule_goldens.json";
  return nlohmann::json::parse(in);
}

TEST(PromptSchedule, Goldens) {
  const nlohmann::json g = load_goldens();
  ASSERT_GE(g.at("cases").size(), 40u);
  for (const auto& c : g.at("cases")) {
    const std::string prompt = c.at("prompt").get<std::string>();
    const int steps = c.at("steps").get<int>();
    std::optional<int> hires;
    if (!c.at("hires_steps").is_null()) hires = c.at("hires_steps").get<int>();
    if (c.contains("error")) {
      EXPECT_THROW(prompt_schedule(prompt, steps, hires), UsageError) << prompt;
      continue;
    }
    std::vector<std::pair<int, std::string>> want, got;
    for (const auto& e : c.at("schedule")) want.emplace_back(e.at(0).get<int>(), e.at(1).get<std::string>());
    try {
      for (const auto& e : prompt_schedule(prompt, steps, hires).entries) got.emplace_back(e.end_at_step, e.text);
    } catch (const UsageError& e) {
      // The one refusal A1111 does not make: "[from:to:when]" with a `when` that is no number.
      EXPECT_NE(std::string(e.what()).find("is not a number"), std::string::npos) << prompt << ": " << e.what();
      EXPECT_EQ(want.size(), 1u) << prompt;
      continue;
    }
    EXPECT_EQ(got, want) << prompt << " steps " << steps << (hires ? " hires " + std::to_string(*hires) : "");
  }
}

// reconstruct_cond_batch: the sampler's step k (from 0) takes the first entry with k <= end_at_step,
// so "[a:b:3]" of 10 steps holds "a" through steps 0..3, and "[a|b]" starts "a", "a", "b", "a".
TEST(PromptSchedule, EntryOfEachStep) {
  const PromptSchedule s = prompt_schedule("[a:b:3]", 10);
  ASSERT_EQ(s.entries.size(), 2u);
  std::vector<size_t> got;
  for (int k = 0; k < 10; ++k) got.push_back(s.index_at(k));
  EXPECT_EQ(got, (std::vector<size_t>{0, 0, 0, 0, 1, 1, 1, 1, 1, 1}));
  const PromptSchedule alt = prompt_schedule("[a|b]", 4);
  std::vector<std::string> texts;
  for (int k = 0; k < 4; ++k) texts.push_back(alt.entries[alt.index_at(k)].text);
  EXPECT_EQ(texts, (std::vector<std::string>{"a", "a", "b", "a"}));
}

TEST(PromptSchedule, PlainPromptsAreOneEntry) {
  for (const char* p : {"a lighthouse, (storm:1.2) [misty] BREAK gulls", "", "a | b", "[a:b]", "x]y"}) {
    const PromptSchedule s = prompt_schedule(p, 7);
    ASSERT_EQ(s.entries.size(), 1u) << p;
    EXPECT_EQ(s.entries[0].text, p);
    EXPECT_EQ(s.entries[0].end_at_step, 7);
    EXPECT_FALSE(prompt_has_schedule(p)) << p;
  }
  EXPECT_TRUE(prompt_has_schedule("a [b|c]"));
  EXPECT_TRUE(prompt_has_schedule("a [b:c:0.5]"));
}

TEST(PromptSchedule, RefusesWhenThatIsNoNumber) {
  for (const char* p : {"a [cat:dog:abc]", "[cat:dog:0.5x]", "[a:b:1,5]", "x [a:[b|c]:half] y"}) {
    try {
      (void)prompt_schedule(p, 10);
      ADD_FAILURE() << p << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("is not a number"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW((void)prompt_schedule("[a:b:1e999]", 10), UsageError);     // A1111: int(inf) fails
  EXPECT_THROW((void)prompt_schedule("[a:b:-1.5e308]", 10), UsageError);  // (v * steps) is -inf
  EXPECT_THROW((void)prompt_schedule("a", 0), UsageError);
  EXPECT_EQ(prompt_schedule("[a:b]", 4).entries.size(), 1u);    // "[to:from]" without a number: text
  EXPECT_EQ(prompt_schedule("[a:b:]", 4).entries.size(), 1u);   // an empty when: text
}

// Deep nests: no recursion beyond kMaxScheduleNesting, and an edit inside is read as text there.
TEST(PromptSchedule, DeepNestingIsBounded) {
  const std::string deep = std::string(5000, '[') + "a:b:2" + std::string(5000, ']');
  const PromptSchedule s = prompt_schedule(deep, 4);
  ASSERT_FALSE(s.entries.empty());
  const std::string shallow = std::string(50, '[') + "a:b:2" + std::string(50, ']');
  EXPECT_EQ(prompt_schedule(shallow, 4).entries.size(), 2u);
  EXPECT_EQ(prompt_schedule(std::string(20000, '('), 4).entries.size(), 1u);
}

}  // namespace
}  // namespace sdxl
