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

// Issue 61: diffusers' set_timesteps(timesteps=...) for the samplers whose scheduler takes a list;
// the others, and a list that is empty, out of range or not strictly decreasing, refused by name.
TEST(SamplerPlan, TimestepListReplacesTheSpacing) {
  sdxl::SchedulerConfig cfg;
  const std::vector<int> dmd2{999, 749, 499, 249};
  for (const char* s : {"Euler", "Heun", "DPM++ 2M", "DPM++ 2M SDE", "DPM++ SDE", "LCM", "TCD"}) {
    const sdxl::SamplerPlan p = sdxl::make_sampler_plan(cfg, sdxl::parse_sampler_choice(s, ""), 8, dmd2);
    EXPECT_EQ(p.steps, 4) << s;
    EXPECT_EQ(p.timesteps.front(), 999.0) << s;
    EXPECT_EQ(p.timesteps.back(), 249.0) << s;
    EXPECT_EQ(p.timesteps.size(), std::string(s) == "Heun" ? 7u : 4u) << s;
  }
  const auto why = [&](const char* sampler, const char* schedule, const std::vector<int>& ts) -> std::string {
    try {
      (void)sdxl::make_sampler_plan(cfg, sdxl::parse_sampler_choice(sampler, schedule), 4, ts);
    } catch (const sdxl::UsageError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(why("DDIM", "", dmd2).find("sampler 'DDIM' takes no timestep list"), std::string::npos) << why("DDIM", "", dmd2);
  EXPECT_NE(why("Euler a", "", dmd2).find("'Euler a'"), std::string::npos);
  EXPECT_NE(why("UniPC", "", dmd2).find("'UniPC'"), std::string::npos);
  EXPECT_NE(why("Euler", "Karras", dmd2).find("not 'Karras'"), std::string::npos) << why("Euler", "Karras", dmd2);
  EXPECT_NE(why("LCM", "", {999, 999}).find("strictly decreasing: item 1 (999)"), std::string::npos);
  EXPECT_NE(why("LCM", "", {1000, 10}).find("item 0 (1000) is out of range"), std::string::npos);
  EXPECT_NE(why("LCM", "", {10, -1}).find("item 1 (-1) is out of range"), std::string::npos);
  EXPECT_EQ(sdxl::timesteps_problem(sdxl::parse_sampler_choice("TCD", ""), {}, 1000).rfind("must hold at least one", 0), 0u);
}

// rescale_zero_terminal_snr: alphas_cumprod keeps its first value and ends at 0 (DDIM, LCM, TCD);
// the sigma schedulers clamp it to 2**-24, so the first sigma is 4096 and trailing starts there.
TEST(SamplerPlan, ZeroTerminalSnr) {
  sdxl::SchedulerConfig plain, z;
  z.rescale_betas_zero_snr = true;
  z.timestep_spacing = "trailing";
  const std::vector<float> a = sdxl::train_alphas_cumprod(plain), b = sdxl::train_alphas_cumprod(z);
  EXPECT_NEAR(b.front(), a.front(), 1e-6);
  EXPECT_EQ(b.back(), 0.0f);
  EXPECT_GT(a.back(), 0.004f);
  const std::vector<float> sig = sdxl::train_sigmas(z);
  EXPECT_NEAR(sig.back(), 4096.0f, 0.01f);
  const sdxl::SamplerPlan p = sdxl::make_sampler_plan(z, sdxl::parse_sampler_choice("Euler", ""), 4);
  EXPECT_EQ(p.timesteps.front(), 999.0);
  EXPECT_NEAR(p.sigmas.front(), 4096.0, 0.01);
  EXPECT_DOUBLE_EQ(p.init_noise_sigma, p.sigmas.front());
  EXPECT_FALSE(p.v_prediction);
  z.prediction_type = "v_prediction";
  EXPECT_TRUE(sdxl::make_sampler_plan(z, sdxl::parse_sampler_choice("DDIM", ""), 4).v_prediction);
}
