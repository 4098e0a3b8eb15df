// The task-key table (batch/task_keys.h) and what reads it: same_settings, batch_group_key, the
// manifest's "params", the A1111 writer, the parser's allowed keys.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "batch/batch_file.h"
#include "batch/task_keys.h"

namespace sdxl {
namespace {

// Every key set away from its default, with img2img, "Only masked" inpainting and the hires fix on.
GenerationParams all_set() {
  GenerationParams p;
  p.prompt = "a keeper";
  p.negative_prompt = "blurry";
  p.seed = 7;
  p.steps = 12;
  p.cfg = 5.5;
  p.width = 512;
  p.height = 768;
  p.sampler = "TCD";  // eta matters (is compared, recorded, grouped) only for TCD
  p.schedule = "Karras";
  p.guidance_rescale = 0.3;
  p.timesteps = {999, 749, 499, 249};
  p.eta = 0.5;
  p.clip_skip = 3;
  p.init_image = "/in/init.png";
  p.strength = 0.6;
  p.mask = "/in/mask.png";
  p.mask_sha256 = "ab12";
  p.mask_blur = 6;
  p.inpaint_area = "masked";
  p.inpaint_padding = 40;
  p.vae = "/vae";
  p.hires.scale = 1.5;
  p.hires.steps = 5;
  p.loras.push_back({"hero", "/l/hero.safetensors", 0.8});
  p.controlnets.push_back({"/cn/pose", "/in/pose.png", 0.9, 0.0, 0.8, "", false});
  p.ip_adapter.model = "/ip";
  p.ip_adapter.images = {"/in/ref.png"};
  p.upscale.model = "Lanczos";
  p.upscale.scale = 2;
  p.detailer.push_back({});
  p.detailer.back().detector = "/det/face";
  p.notes = "panel 3";
  p.regions.push_back({});
  p.regions.back().prompt = "the keeper";
  p.region_base = 0.3;
  return p;
}

// `p` with the plain key `k` moved to another value in its range.
GenerationParams moved(const TaskKey& k, GenerationParams p) {
  std::visit(
      [&](auto member) {
        using M = decltype(member);
        if constexpr (std::is_same_v<M, std::string GenerationParams::*>) {
          p.*member = k.choices.empty() ? p.*member + "x" : (p.*member == "whole" ? "masked" : "whole");
        } else if constexpr (std::is_same_v<M, double GenerationParams::*>) {
          p.*member = p.*member > k.lo ? k.lo : k.hi;
        } else if constexpr (!std::is_same_v<M, std::monostate>) {
          p.*member += k.multiple_of > 0 ? k.multiple_of : 1;
        }
      },
      k.field);
  return p;
}

TEST(TaskKeys, NamesAreUniqueAndEveryPlainKeyHasARange) {
  std::set<std::string_view> seen;
  for (const TaskKey& k : task_keys()) {
    EXPECT_TRUE(seen.insert(k.name).second) << k.name;
    EXPECT_FALSE(k.summary.empty()) << k.name;
    if (k.type == KeyType::kInteger || k.type == KeyType::kNumber) {
      EXPECT_LT(k.lo, k.hi) << k.name;
    }
  }
}

TEST(TaskKeys, EachComparedPlainKeyRemakesTheImageAndNotesDoNot) {
  const GenerationParams p = all_set();
  ASSERT_TRUE(same_settings(p, p));
  for (const TaskKey& k : task_keys()) {
    if (!k.plain()) continue;
    EXPECT_EQ(same_settings(p, moved(k, p)), !k.compared) << k.name;
  }
}

TEST(TaskKeys, TheManifestKeepsEveryRecordedKey) {
  const GenerationParams p = all_set();
  const nlohmann::json j = params_to_manifest(p);
  GenerationParams back;
  params_from_manifest(nlohmann::json::parse(j.dump()), back);
  back.seed = p.seed;  // the manifest line holds it beside "params"
  EXPECT_TRUE(same_settings(p, back)) << j.dump();
  EXPECT_EQ(back.notes, "panel 3");
  EXPECT_EQ(j.at("mask").at("padding"), 40);
}

// A Union ControlNet's types and its call of two images come back from the
// manifest (a rerun with other types makes the image again); a plain
// ControlNet's record has neither field.
TEST(TaskKeys, TheManifestKeepsUnionControlTypes) {
  GenerationParams p = all_set();
  p.controlnets.push_back({"/cn/union", "/in/a.png", 0.7, 0.0, 1.0, "openpose", false});
  p.controlnets.push_back({"/cn/union", "/in/b.png", 0.5, 0.2, 1.0, "depth", true});
  const nlohmann::json j = params_to_manifest(p);
  EXPECT_FALSE(j.at("controlnets").at(0).contains("type"));
  EXPECT_FALSE(j.at("controlnets").at(0).contains("same_call"));
  GenerationParams back;
  params_from_manifest(nlohmann::json::parse(j.dump()), back);
  back.seed = p.seed;
  EXPECT_TRUE(same_settings(p, back)) << j.dump();
  ASSERT_EQ(back.controlnets.size(), 3u);
  EXPECT_EQ(back.controlnets[2].type, "depth");
  EXPECT_TRUE(back.controlnets[2].same_call);
  GenerationParams other = p;
  other.controlnets[2].type = "canny";
  EXPECT_FALSE(same_settings(p, other));
}

TEST(TaskKeys, OnlySplittingKeysSplitABatch) {
  const GenerationParams p = all_set();
  for (const TaskKey& k : task_keys()) {
    if (!k.plain()) continue;
    GenerationParams other = moved(k, p);
    if (k.split == KeySplit::kPresence) other.*std::get<std::string GenerationParams::*>(k.field) = "";
    const bool split = batch_group_key(other) != batch_group_key(p);
    EXPECT_EQ(split, k.split != KeySplit::kNo) << k.name;
  }
}

TEST(TaskKeys, EachA1111FieldIsWritten) {
  const GenerationParams p = all_set();
  ImageSources src;
  src.model_name = "tiny";
  src.vae_name = "vae.safetensors";  // the task's VAE folder's file, as the generator names it
  src.lora_hashes = {{"hero", "0123456789ab"}};
  const std::string text = a1111_parameters(p, src);
  for (const TaskKey& k : task_keys()) {
    if (k.a1111.empty() || k.a1111 == "(the first line)") continue;
    EXPECT_NE(text.find(k.a1111), std::string::npos) << k.name << " in " << text;
  }
}

TEST(TaskKeys, TheParserAllowsExactlyTheTablesKeys) {
  nlohmann::json task = {{"id", "a"}, {"prompt", "x"}, {"notes", "n"}, {"colour", 1}};
  nlohmann::json defaults = {{"notes", "d"}, {"seed", 3}};
  const nlohmann::json file = {{"version", 1}, {"defaults", defaults}, {"tasks", {task}}};
  std::vector<BatchProblem> problems;
  parse_batch_text(file.dump(), "/tmp/keys.json", GenerationParams{}, &problems);
  std::set<std::string> at;
  for (const auto& pr : problems) at.insert(pr.pointer);
  EXPECT_EQ(at, (std::set<std::string>{"/tasks/0/colour", "/defaults/seed"}));
}

}  // namespace
}  // namespace sdxl
