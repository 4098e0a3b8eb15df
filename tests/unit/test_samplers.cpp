// Samplers on a batch: with one CPU generator per image, every sampler gives
// each image exactly what it gives that image alone (the batching contract),
// and the same seed gives the same result. A fake model stands in for the UNet.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "sampling/samplers.h"
#include "sampling/sampler_plan.h"

namespace {

// eps depends on the input and the timestep, element-wise (no mixing across the batch).
torch::Tensor fake_eps(const torch::Tensor& x, double t) { return torch::tanh(x * 0.3) + 0.001 * t * torch::cos(x); }

torch::Tensor run(const sdxl::SamplerPlan& plan, const std::vector<std::int64_t>& seeds, double strength_init = 0) {
  std::vector<at::Generator> gens = sdxl::cpu_generators(seeds);
  torch::Tensor x = sdxl::randn_per_image(gens, {static_cast<int64_t>(seeds.size()), 4, 8, 8}, torch::kFloat32,
                                          torch::kCPU);
  if (strength_init > 0) {
    const torch::Tensor noise = sdxl::randn_per_image(gens, x.sizes(), torch::kFloat32, torch::kCPU);
    x = sdxl::add_noise(plan, x * 0.5, noise);
  } else {
    x = x * plan.init_noise_sigma;
  }
  int calls = 0;
  const sdxl::StepHook hook = [&](int step, int total) {
    ++calls;
    EXPECT_EQ(step, calls);
    EXPECT_EQ(total, sdxl::plan_model_calls(plan));
  };
  torch::Tensor out = sdxl::sample(plan, x, fake_eps, gens, hook);
  EXPECT_EQ(calls, sdxl::plan_model_calls(plan));
  return out;
}

}  // namespace

TEST(Samplers, BatchIndependentAndDeterministic) {
  c10::InferenceMode guard;
  sdxl::SchedulerConfig cfg;
  for (const std::string& name : sdxl::sampler_names()) {
    for (const std::string& sched : sdxl::schedule_names(sdxl::parse_sampler_choice(name, "").sampler)) {
      for (double strength : {0.0, 0.6}) {
        sdxl::SamplerPlan plan = sdxl::make_sampler_plan(cfg, sdxl::parse_sampler_choice(name, sched), 6);
        if (strength > 0) sdxl::plan_apply_strength(plan, strength);
        const torch::Tensor both = run(plan, {11, 12}, strength);
        const torch::Tensor a = run(plan, {11}, strength);
        const torch::Tensor b = run(plan, {12}, strength);
        const std::string where = name + " / " + sched + " / strength " + std::to_string(strength);
        ASSERT_TRUE(torch::isfinite(both).all().item<bool>()) << where;
        EXPECT_TRUE(torch::equal(both[0], a[0])) << where;
        EXPECT_TRUE(torch::equal(both[1], b[0])) << where;
        EXPECT_FALSE(torch::equal(both[0], both[1])) << where;
        EXPECT_TRUE(torch::equal(run(plan, {11}, strength), a)) << where;
      }
    }
  }
}
