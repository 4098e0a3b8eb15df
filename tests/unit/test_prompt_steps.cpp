// Prompt editing in the UNet calls (pipeline/prompt_steps.h): each row takes its own
// schedule's text at each model call, rows in CFG order [negatives, positives], and the
// conditioning is rebuilt only when some row's text changes.
#include <gtest/gtest.h>

#include <vector>

#include "pipeline/prompt_steps.h"

namespace sdxl {
namespace {

// One embedding whose every value is `v` (context [1, 3, 2], pooled [1, 2]).
PromptEmbeds constant(float v) { return {torch::full({1, 3, 2}, v), torch::full({1, 2}, v)}; }

// The value of each row of a selection (rows are constant).
std::vector<float> rows_of(const torch::Tensor& t) {
  std::vector<float> out;
  for (int64_t r = 0; r < t.size(0); ++r) out.push_back(t[r].flatten()[0].item<float>());
  return out;
}

TEST(PromptSteps, EachRowTakesItsOwnTextPerCall) {
  StepConditioning steps;
  ImageTextSteps a;  // "[one:two:1]": "one" through call 1, then "two"; negative "[n1|n2]"
  a.pos_schedules = pass_schedules("[one:two:1]", 4, 0);
  a.pos = {constant(1), constant(2)};
  a.neg_schedules = pass_schedules("[n1|n2]", 4, 0);
  a.neg = {constant(-1), constant(-2)};
  ImageTextSteps b;  // no edit; an empty negative: one zero embedding throughout
  b.pos_schedules = pass_schedules("three", 4, 0);
  b.pos = {constant(3)};
  b.neg_schedules = pass_schedules("", 4, 0);
  b.neg = {constant(0)};
  steps.add_image(std::move(a));
  steps.add_image(std::move(b));
  torch::Tensor ctx, pooled;
  ASSERT_TRUE(steps.select(0, 0, /*cfg=*/true, ctx, pooled));
  EXPECT_EQ(rows_of(ctx), (std::vector<float>{-1, 0, 1, 3}));
  EXPECT_EQ(rows_of(pooled), (std::vector<float>{-1, 0, 1, 3}));
  EXPECT_FALSE(steps.select(0, 1, true, ctx, pooled)) << "call 1: every row's text as at call 0";
  ASSERT_TRUE(steps.select(0, 2, true, ctx, pooled));
  EXPECT_EQ(rows_of(ctx), (std::vector<float>{-2, 0, 2, 3}));
  ASSERT_TRUE(steps.select(0, 3, true, ctx, pooled));
  EXPECT_EQ(rows_of(ctx), (std::vector<float>{-1, 0, 2, 3}));
  ASSERT_TRUE(steps.select(0, 3, /*cfg=*/false, ctx, pooled));
  EXPECT_EQ(rows_of(ctx), (std::vector<float>{2, 3}));
  EXPECT_EQ(steps.tensors().size(), 12u);
}

// The hires pass has its own schedule: "[one:two:1.5]" over a first pass of 4 steps and a hires
// pass of 4 holds "one" through the first pass (1.5 of its steps is past its end) and switches
// halfway through the hires pass: (1.5 - 1) * 4 = step 2 is its last "one" (calls 0..2).
TEST(PromptSteps, TheHiresPassHasItsOwnSchedule) {
  ImageTextSteps a;
  a.pos_schedules = pass_schedules("[one:two:1.5]", 4, 4);
  ASSERT_EQ(a.pos_schedules.texts, (std::vector<std::string>{"one", "two"}));
  a.pos = {constant(1), constant(2)};
  StepConditioning steps;
  steps.add_image(std::move(a));
  torch::Tensor ctx, pooled;
  std::vector<float> first, second;
  for (int call = 0; call < 4; ++call) {
    (void)steps.select(0, call, false, ctx, pooled);
    first.push_back(rows_of(ctx)[0]);
  }
  for (int call = 0; call < 4; ++call) {
    (void)steps.select(1, call, false, ctx, pooled);
    second.push_back(rows_of(ctx)[0]);
  }
  EXPECT_EQ(first, (std::vector<float>{1, 1, 1, 1}));
  EXPECT_EQ(second, (std::vector<float>{1, 1, 1, 2}));
}

}  // namespace
}  // namespace sdxl
