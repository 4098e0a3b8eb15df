// Euler schedules vs goldens written by scripts/gen_schedule_goldens.py from diffusers.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sdxl/error.h"
#include "sdxl/schedule.h"

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
