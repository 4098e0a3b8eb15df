// Euler schedules vs goldens written by tests/reference/gen_schedule_goldens.py from diffusers.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "sampling/sampler_plan.h"
#include "sampling/schedule.h"

namespace {

nlohmann::json load_goldens() {
  const char* dir = std::getenv("SDXL_FIXTURES_DIR");
  if (!dir) throw std::runtime_error("SDXL_FIXTURES_DIR is not set (run through ctest)");
  std::ifstream in(std::string(dir) + "/goldens/schedule.json");
  if (!in) throw std::runtime_error(std::string("missing ") + dir + "/goldens/schedule.json");
  return nlohmann::json::parse(in);
}

}  // namespace

TEST(EulerSchedule, MatchesDiffusers) {
  const auto g = load_goldens();
  sdxl::SchedulerConfig cfg;  // SDXL defaults; check against the golden's config
  const auto& gc = g.at("config");
  cfg.beta_start = gc.at("beta_start").get<double>();
  cfg.beta_end = gc.at("beta_end").get<double>();
  cfg.beta_schedule = gc.at("beta_schedule").get<std::string>();
  cfg.timestep_spacing = gc.at("timestep_spacing").get<std::string>();
  cfg.steps_offset = gc.at("steps_offset").get<int>();
  cfg.num_train_timesteps = gc.at("num_train_timesteps").get<int>();
  int checked = 0;
  for (const auto& c : g.at("schedules")) {
    const int steps = c.at("steps").get<int>();
    const auto s = sdxl::euler_discrete_schedule(cfg, steps);
    const auto ts = c.at("timesteps").get<std::vector<double>>();
    const auto sig = c.at("sigmas").get<std::vector<double>>();
    ASSERT_EQ(s.timesteps.size(), ts.size()) << steps;
    ASSERT_EQ(s.sigmas.size(), sig.size()) << steps;
    for (size_t i = 0; i < ts.size(); ++i) EXPECT_EQ(s.timesteps[i], ts[i]) << "steps " << steps << " i " << i;
    for (size_t i = 0; i < sig.size(); ++i)
      EXPECT_NEAR(s.sigmas[i], sig[i], 2e-6 * std::max(1.0, sig[i])) << "steps " << steps << " i " << i;
    EXPECT_NEAR(s.init_noise_sigma, c.at("init_noise_sigma").get<double>(), 1e-5);
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

TEST(EulerSchedule, OtherSpacingsAndErrors) {
  sdxl::SchedulerConfig cfg;
  cfg.timestep_spacing = "trailing";
  cfg.steps_offset = 0;
  auto s = sdxl::euler_discrete_schedule(cfg, 10);
  EXPECT_EQ(s.timesteps.front(), 999.0);
  EXPECT_EQ(s.timesteps.back(), 99.0);
  EXPECT_DOUBLE_EQ(s.init_noise_sigma, s.sigmas.front());
  EXPECT_THROW(sdxl::euler_discrete_schedule(cfg, 0), sdxl::UsageError);
  EXPECT_THROW(sdxl::euler_discrete_schedule(cfg, 1001), sdxl::UsageError);
}

// Every sampler x schedule plan vs the diffusers scheduler's set_timesteps
// (tests/reference/gen_schedule_goldens.py "plans": Karras, exponential, SGM uniform...).
TEST(SamplerPlan, MatchesDiffusersSetTimesteps) {
  const auto g = load_goldens();
  ASSERT_TRUE(g.contains("plans")) << "schedule.json predates the sampler plans; rerun gen_schedule_goldens.py";
  sdxl::SchedulerConfig cfg;  // SDXL's config (same as export_sdxl.py SDXL_SCHEDULER)
  int checked = 0;
  for (const auto& c : g.at("plans")) {
    const auto sampler = c.at("sampler").get<std::string>();
    const auto schedule = c.at("schedule").get<std::string>();
    const int steps = c.at("steps").get<int>();
    const std::string where = sampler + " / " + schedule + " / " + std::to_string(steps) + " steps";
    const sdxl::SamplerPlan p = sdxl::make_sampler_plan(cfg, sdxl::parse_sampler_choice(sampler, schedule), steps);
    const auto ts = c.at("timesteps").get<std::vector<double>>();
    const auto sig = c.at("sigmas").get<std::vector<double>>();
    ASSERT_EQ(p.timesteps.size(), ts.size()) << where;
    for (size_t i = 0; i < ts.size(); ++i) EXPECT_NEAR(p.timesteps[i], ts[i], 1e-3) << where << " t[" << i << "]";
    if (!sig.empty()) {
      ASSERT_EQ(p.sigmas.size(), sig.size()) << where;
      for (size_t i = 0; i < sig.size(); ++i)
        EXPECT_NEAR(p.sigmas[i], sig[i], 2e-6 * std::max(1.0, sig[i])) << where << " sigma[" << i << "]";
    }
    EXPECT_NEAR(p.init_noise_sigma, c.at("init_noise_sigma").get<double>(), 1e-5) << where;
    ++checked;
  }
  EXPECT_GE(checked, 150);
}

TEST(SamplerPlan, NamesAndErrors) {
  auto c = sdxl::parse_sampler_choice("dpm++ 2m  karras", "Automatic");
  EXPECT_EQ(c.sampler_name, "DPM++ 2M");
  EXPECT_EQ(c.schedule_name, "Karras");
  c = sdxl::parse_sampler_choice("DPM++ 2M SDE Exponential", "exponential");
  EXPECT_EQ(c.sampler_name, "DPM++ 2M SDE");
  EXPECT_EQ(c.schedule_name, "Exponential");
  c = sdxl::parse_sampler_choice("Euler a", "sgm_uniform");
  EXPECT_EQ(c.schedule_name, "SGM Uniform");
  try {
    sdxl::parse_sampler_choice("Euler b", "Automatic");
    FAIL();
  } catch (const sdxl::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("\"DPM++ 2M SDE\""), std::string::npos) << e.what();
  }
  try {
    sdxl::parse_sampler_choice("DDIM", "Karras");
    FAIL();
  } catch (const sdxl::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("valid: \"Automatic\", \"SGM Uniform\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(sdxl::parse_sampler_choice("DPM++ 2M Karras", "Exponential"), sdxl::UsageError);
  EXPECT_THROW(sdxl::parse_sampler_choice("Euler", "Polyexponential"), sdxl::UsageError);
  sdxl::SchedulerConfig cfg;
  EXPECT_THROW(sdxl::make_sampler_plan(cfg, sdxl::parse_sampler_choice("LCM", ""), 51), sdxl::UsageError);
}

TEST(SamplerPlan, Img2ImgStrengthSkipsLikeGetTimesteps) {
  sdxl::SchedulerConfig cfg;
  auto p = sdxl::make_sampler_plan(cfg, sdxl::parse_sampler_choice("Heun", ""), 10);
  sdxl::plan_apply_strength(p, 0.55);  // int(10 * 0.55) = 5 steps run -> t_start 5, order 2
  EXPECT_EQ(p.begin, 10);
  EXPECT_EQ(sdxl::plan_model_calls(p), 9);
  auto q = sdxl::make_sampler_plan(cfg, sdxl::parse_sampler_choice("Euler", ""), 4);
  EXPECT_THROW(sdxl::plan_apply_strength(q, 0.2), sdxl::UsageError);  // int(0.8) = 0 steps
  EXPECT_THROW(sdxl::plan_apply_strength(q, 0.0), sdxl::UsageError);
}
