// LoRA key mapping for each format against an SDXL-shaped parameter table,
// SD 1.5 refusal, unmatched keys; prompt tags, --lora arguments, sizes and the
// A1111 metadata line. torch-free.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "lora/lora_keys.h"
#include "batch/batch_file.h"
#include "core/error.h"
#include "batch/generation_params.h"
#include "batch/lora_ref.h"
#include "core/units.h"

namespace sdxl {
namespace {

// A miniature SDXL UNet layout (layers_per_block 2, up blocks of 3, attention in
// down 1..2 / up 0..1) plus two text encoders; only names and shapes matter.
ModelParamShapes sdxl_shapes() {
  ModelParamShapes s;
  auto& u = s.params[2];
  u["conv_in.weight"] = {32, 4, 3, 3};
  for (int b = 0; b < 3; ++b)
    for (int l = 0; l < 2; ++l) {
      const std::string r = "down_blocks." + std::to_string(b) + ".resnets." + std::to_string(l);
      u[r + ".conv1.weight"] = {32, 32, 3, 3};
      u[r + ".time_emb_proj.weight"] = {32, 128};
      if (b > 0) {
        const std::string a = "down_blocks." + std::to_string(b) + ".attentions." + std::to_string(l);
        u[a + ".proj_in.weight"] = {64, 64};
        u[a + ".transformer_blocks.0.attn1.to_q.weight"] = {64, 64};
        u[a + ".transformer_blocks.0.attn2.to_k.weight"] = {64, 2048};
        u[a + ".transformer_blocks.0.attn1.to_out.0.weight"] = {64, 64};
        u[a + ".transformer_blocks.0.ff.net.0.proj.weight"] = {512, 64};
      }
    }
  u["down_blocks.0.downsamplers.0.conv.weight"] = {32, 32, 3, 3};
  u["down_blocks.1.resnets.0.conv_shortcut.weight"] = {64, 32, 1, 1};
  for (int b = 0; b < 3; ++b)
    for (int l = 0; l < 3; ++l) {
      u["up_blocks." + std::to_string(b) + ".resnets." + std::to_string(l) + ".conv2.weight"] = {32, 32, 3, 3};
      if (b < 2) u["up_blocks." + std::to_string(b) + ".attentions." + std::to_string(l) + ".proj_out.weight"] = {64, 64};
    }
  u["up_blocks.0.upsamplers.0.conv.weight"] = {64, 64, 3, 3};
  u["mid_block.attentions.0.transformer_blocks.0.attn1.to_v.weight"] = {64, 64};
  u["mid_block.resnets.1.conv1.weight"] = {64, 64, 3, 3};
  u["time_embedding.linear_1.weight"] = {128, 32};
  for (int te = 0; te < 2; ++te) {
    s.params[te]["text_model.encoder.layers.0.self_attn.q_proj.weight"] = {32, 32};
    s.params[te]["text_model.encoder.layers.0.self_attn.out_proj.weight"] = {32, 32};
    s.params[te]["text_model.encoder.layers.0.mlp.fc1.weight"] = {64, 32};
  }
  s.params[1]["text_projection.weight"] = {32, 32};
  return s;
}

struct Spec {
  std::string name;
  std::vector<std::int64_t> shape;
};
std::vector<SafetensorsTensor> tensors(const std::vector<Spec>& specs) {
  std::vector<SafetensorsTensor> out;
  for (const auto& s : specs) {
    SafetensorsTensor t;
    t.name = s.name;
    t.dtype = "F32";
    t.shape = s.shape;
    out.push_back(t);
  }
  return out;
}
// down/up(/alpha) of one layer, rank 4.
std::vector<Spec> pair(const std::string& base, const std::string& down_sfx, const std::string& up_sfx,
                       std::vector<std::int64_t> w, bool alpha) {
  std::vector<std::int64_t> down = {4, w[1]}, up = {w[0], 4};
  if (w.size() == 4) {
    down = {4, w[1], w[2], w[3]};
    up = {w[0], 4, 1, 1};
  }
  std::vector<Spec> out = {{base + down_sfx, down}, {base + up_sfx, up}};
  if (alpha) out.push_back({base + ".alpha", {}});
  return out;
}
void append(std::vector<Spec>& a, const std::vector<Spec>& b) { a.insert(a.end(), b.begin(), b.end()); }

const LoraLayerKeys* find_layer(const LoraKeyMap& m, LoraTarget t, const std::string& param) {
  for (const auto& l : m.layers)
    if (l.target == t && l.param == param) return &l;
  return nullptr;
}

TEST(LoraKeys, SgmNamesFollowDiffusersBlockLayout) {
  const std::vector<bool> up_attn = {true, true, false};
  EXPECT_EQ(sgm_module_name("down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q", 2, 3, up_attn),
            "input_blocks.4.1.transformer_blocks.0.attn1.to_q");
  EXPECT_EQ(sgm_module_name("down_blocks.2.resnets.1.conv1", 2, 3, up_attn), "input_blocks.8.0.in_layers.2");
  EXPECT_EQ(sgm_module_name("down_blocks.0.downsamplers.0.conv", 2, 3, up_attn), "input_blocks.3.0.op");
  EXPECT_EQ(sgm_module_name("mid_block.attentions.0.proj_in", 2, 3, up_attn), "middle_block.1.proj_in");
  EXPECT_EQ(sgm_module_name("mid_block.resnets.1.conv2", 2, 3, up_attn), "middle_block.2.out_layers.3");
  EXPECT_EQ(sgm_module_name("up_blocks.1.attentions.2.proj_out", 2, 3, up_attn), "output_blocks.5.1.proj_out");
  EXPECT_EQ(sgm_module_name("up_blocks.0.upsamplers.0.conv", 2, 3, up_attn), "output_blocks.2.2.conv");
  EXPECT_EQ(sgm_module_name("up_blocks.2.resnets.0.time_emb_proj", 2, 3, up_attn), "output_blocks.6.0.emb_layers.1");
  EXPECT_EQ(sgm_module_name("down_blocks.1.resnets.0.conv_shortcut", 2, 3, up_attn), "input_blocks.4.0.skip_connection");
  EXPECT_EQ(sgm_module_name("time_embedding.linear_1", 2, 3, up_attn), "time_embed.0");
  EXPECT_EQ(sgm_module_name("conv_in", 2, 3, up_attn), "input_blocks.0.0");
  EXPECT_EQ(sgm_module_name("down_blocks.0.resnets.0.norm1.bogus", 2, 3, up_attn), "");
}

TEST(LoraKeys, KohyaSgmAndDiffusersNamesTextEncodersAndLoCon) {
  std::vector<Spec> s;
  append(s, pair("lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q", ".lora_down.weight", ".lora_up.weight", {64, 64}, true));
  append(s, pair("lora_unet_down_blocks_2_attentions_1_transformer_blocks_0_attn2_to_k", ".lora_down.weight", ".lora_up.weight", {64, 2048}, true));
  append(s, pair("lora_unet_output_blocks_2_2_conv", ".lora_down.weight", ".lora_up.weight", {64, 64, 3, 3}, true));
  append(s, pair("lora_unet_input_blocks_4_0_skip_connection", ".lora_down.weight", ".lora_up.weight", {64, 32, 1, 1}, false));
  append(s, pair("lora_unet_middle_block_1_transformer_blocks_0_attn1_to_v", ".lora_down.weight", ".lora_up.weight", {64, 64}, true));
  append(s, pair("lora_te1_text_model_encoder_layers_0_self_attn_q_proj", ".lora_down.weight", ".lora_up.weight", {32, 32}, true));
  append(s, pair("lora_te2_text_model_encoder_layers_0_mlp_fc1", ".lora_down.weight", ".lora_up.weight", {64, 32}, true));
  append(s, pair("lora_te2_text_projection", ".lora_down.weight", ".lora_up.weight", {32, 32}, true));
  s.push_back({"lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q.hada_w1_a", {4, 4}});  // LoHa: unsupported
  s.push_back({"lora_unet_no_such_layer.lora_down.weight", {4, 4}});
  const LoraKeyMap m = map_lora_keys(tensors(s), sdxl_shapes(), "k.safetensors");
  EXPECT_EQ(m.format, "kohya");
  ASSERT_EQ(m.layers.size(), 8u);
  const auto* q = find_layer(m, LoraTarget::kUnet, "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->alpha, "lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q.alpha");
  EXPECT_NE(find_layer(m, LoraTarget::kUnet, "down_blocks.2.attentions.1.transformer_blocks.0.attn2.to_k.weight"), nullptr);
  EXPECT_NE(find_layer(m, LoraTarget::kUnet, "up_blocks.0.upsamplers.0.conv.weight"), nullptr);
  const auto* sc = find_layer(m, LoraTarget::kUnet, "down_blocks.1.resnets.0.conv_shortcut.weight");
  ASSERT_NE(sc, nullptr);
  EXPECT_EQ(sc->alpha, "");
  EXPECT_NE(find_layer(m, LoraTarget::kUnet, "mid_block.attentions.0.transformer_blocks.0.attn1.to_v.weight"), nullptr);
  EXPECT_NE(find_layer(m, LoraTarget::kTextEncoder, "text_model.encoder.layers.0.self_attn.q_proj.weight"), nullptr);
  EXPECT_NE(find_layer(m, LoraTarget::kTextEncoder2, "text_model.encoder.layers.0.mlp.fc1.weight"), nullptr);
  EXPECT_NE(find_layer(m, LoraTarget::kTextEncoder2, "text_projection.weight"), nullptr);
  ASSERT_EQ(m.unmatched.size(), 2u);
}

TEST(LoraKeys, PeftAndOldDiffusersNames) {
  std::vector<Spec> s;
  append(s, pair("unet.down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q", ".lora_A.weight", ".lora_B.weight", {64, 64}, false));
  append(s, pair("unet.down_blocks.1.resnets.0.conv1", ".lora_A.weight", ".lora_B.weight", {32, 32, 3, 3}, false));
  append(s, pair("text_encoder.text_model.encoder.layers.0.self_attn.q_proj", ".lora_A.weight", ".lora_B.weight", {32, 32}, false));
  append(s, pair("text_encoder_2.text_projection", ".lora_A.weight", ".lora_B.weight", {32, 32}, false));
  append(s, pair("unet.down_blocks.2.attentions.0.transformer_blocks.0.attn1.processor.to_out_lora", ".down.weight", ".up.weight", {64, 64}, false));
  append(s, pair("unet.down_blocks.2.attentions.1.proj_in", ".lora.down.weight", ".lora.up.weight", {64, 64}, false));
  append(s, pair("text_encoder.text_model.encoder.layers.0.self_attn.to_out_lora", ".down.weight", ".up.weight", {32, 32}, false));
  append(s, pair("text_encoder_2.text_model.encoder.layers.0.mlp.fc1", ".lora_linear_layer.down.weight", ".lora_linear_layer.up.weight", {64, 32}, false));
  const LoraKeyMap m = map_lora_keys(tensors(s), sdxl_shapes(), "p.safetensors");
  EXPECT_EQ(m.format, "diffusers");
  EXPECT_TRUE(m.unmatched.empty()) << m.unmatched.front();
  EXPECT_EQ(m.layers.size(), 8u);
  EXPECT_NE(find_layer(m, LoraTarget::kUnet, "down_blocks.2.attentions.0.transformer_blocks.0.attn1.to_out.0.weight"), nullptr);
  EXPECT_NE(find_layer(m, LoraTarget::kTextEncoder, "text_model.encoder.layers.0.self_attn.out_proj.weight"), nullptr);
  EXPECT_NE(find_layer(m, LoraTarget::kTextEncoder2, "text_model.encoder.layers.0.mlp.fc1.weight"), nullptr);
}

TEST(LoraKeys, HalfPairsAreReportedNotApplied) {
  std::vector<Spec> s = {{"unet.down_blocks.1.attentions.0.proj_in.lora_A.weight", {4, 64}}};
  append(s, pair("unet.down_blocks.1.attentions.1.proj_in", ".lora_A.weight", ".lora_B.weight", {64, 64}, false));
  const LoraKeyMap m = map_lora_keys(tensors(s), sdxl_shapes(), "h.safetensors");
  EXPECT_EQ(m.layers.size(), 1u);
  ASSERT_EQ(m.unmatched.size(), 1u);
  EXPECT_NE(m.unmatched[0].find("no matching up"), std::string::npos);
}

void expect_refused(const std::vector<Spec>& s, const std::string& needle) {
  try {
    (void)map_lora_keys(tensors(s), sdxl_shapes(), "x.safetensors");
    FAIL() << "accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("x.safetensors"), std::string::npos) << e.what();
  }
}

TEST(LoraKeys, RefusesSd15LorasWithAHint) {
  expect_refused(pair("lora_te_text_model_encoder_layers_0_self_attn_q_proj", ".lora_down.weight", ".lora_up.weight", {32, 32}, true),
                 "another base model");
  expect_refused(pair("lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q", ".lora_down.weight", ".lora_up.weight", {64, 64}, true),
                 "SD 1.x");
  // A layer that exists in SDXL but with SD 1.5's 768-wide text input.
  expect_refused(pair("lora_unet_down_blocks_2_attentions_1_transformer_blocks_0_attn2_to_k", ".lora_down.weight", ".lora_up.weight", {64, 768}, true),
                 "768");
  // Any other misfit is refused naming the tensors.
  expect_refused(pair("unet.down_blocks.1.attentions.0.proj_in", ".lora_A.weight", ".lora_B.weight", {64, 32}, false), "do not fit");
}

TEST(LoraTags, ExtractsA1111TagsAndKeepsTheRest) {
  const PromptLoras p = extract_lora_tags("a knight <lora:hero:0.8>, in fog <lora:ink-style> <lora:x:1:0.5>, <hypernet:y:1>");
  EXPECT_EQ(p.text, "a knight , in fog  , <hypernet:y:1>");
  ASSERT_EQ(p.tags.size(), 3u);
  EXPECT_EQ(p.tags[0].name, "hero");
  EXPECT_DOUBLE_EQ(p.tags[0].weight, 0.8);
  EXPECT_EQ(p.tags[1].name, "ink-style");
  EXPECT_DOUBLE_EQ(p.tags[1].weight, 1.0);
  EXPECT_DOUBLE_EQ(p.tags[2].weight, 1.0);
  EXPECT_EQ(extract_lora_tags("unclosed <lora:a:1").text, "unclosed <lora:a:1");
  EXPECT_THROW((void)extract_lora_tags("<lora:a:heavy>"), UsageError);
  EXPECT_THROW((void)extract_lora_tags("<lora::1>"), UsageError);
}

TEST(LoraTags, LoraArgsSizesAndResolution) {
  LoraRef r = parse_lora_arg("styles/ink.safetensors:0.6");
  EXPECT_EQ(r.path, "styles/ink.safetensors");
  EXPECT_EQ(r.name, "ink");
  EXPECT_DOUBLE_EQ(r.weight, 0.6);
  EXPECT_DOUBLE_EQ(parse_lora_arg("a.safetensors").weight, 1.0);
  EXPECT_DOUBLE_EQ(parse_lora_arg("a.safetensors:-0.5").weight, -0.5);
  EXPECT_EQ(parse_lora_arg("C:lora.safetensors").path, "C:lora.safetensors");
  EXPECT_THROW((void)parse_lora_arg(":1"), UsageError);
  EXPECT_EQ(parse_size_bytes("512M"), 512ull << 20);
  EXPECT_EQ(parse_size_bytes("1.5G"), 3ull << 29);
  EXPECT_EQ(parse_size_bytes("100"), 100u);
  EXPECT_THROW((void)parse_size_bytes("12Q"), UsageError);
  EXPECT_THROW((void)parse_size_bytes("-1G"), UsageError);
  LoraRegistry reg = {{"hero", {"/loras/hero.safetensors", true}}};
  const LoraRef h = resolve_lora("hero", 0.5, reg, {});
  EXPECT_EQ(h.path, "/loras/hero.safetensors");
  EXPECT_TRUE(h.pin);
  try {
    (void)resolve_lora("villain", 1.0, reg, {"/no/such/dir", "/other"});
    FAIL();
  } catch (const UsageError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("villain"), std::string::npos);
    EXPECT_NE(w.find("/no/such/dir"), std::string::npos);
    EXPECT_NE(w.find("/other"), std::string::npos);
    EXPECT_NE(w.find("registry"), std::string::npos);
  }
}

TEST(LoraTags, A1111ParametersRecordLoraHashes) {
  GenerationParams p;
  p.prompt = "a knight <lora:hero:0.8>";
  p.seed = 1;
  const std::string s = a1111_parameters(p, "tiny", {{"hero", "0123456789ab"}, {"ink", "ba9876543210"}});
  EXPECT_NE(s.find("a knight <lora:hero:0.8>\n"), std::string::npos) << s;
  EXPECT_NE(s.find(", Lora hashes: \"hero: 0123456789ab, ink: ba9876543210\", Version:"), std::string::npos) << s;
  EXPECT_EQ(a1111_parameters(p, "tiny").find("Lora hashes"), std::string::npos);
}

}  // namespace
}  // namespace sdxl

namespace sdxl {
namespace {

TEST(LoraBatch, RegistryDefaultsTasksAndProblemsWithPointers) {
  const auto dir = std::filesystem::temp_directory_path() / ("sdxl-lora-batch-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "loras");
  std::ofstream(dir / "loras" / "hero.safetensors") << "x";
  std::ofstream(dir / "ink.safetensors") << "x";
  const std::string good = R"({"version": 1,
    "loras": {"hero": {"path": "loras/hero.safetensors", "pin": true}},
    "defaults": {"loras": [{"name": "hero", "weight": 0.8}]},
    "tasks": [{"id": "a", "prompt": "x"},
              {"id": "b", "prompt": "y", "loras": [{"path": "ink.safetensors"}, {"name": "hero", "weight": -0.5}]}]})";
  std::vector<BatchProblem> problems;
  const BatchFile bf = parse_batch_text(good, dir / "b.json", GenerationParams{}, &problems);
  ASSERT_TRUE(problems.empty()) << problems.front().pointer << ": " << problems.front().message;
  ASSERT_EQ(bf.lora_registry.count("hero"), 1u);
  EXPECT_TRUE(bf.lora_registry.at("hero").pin);
  ASSERT_EQ(bf.tasks[0].params.loras.size(), 1u);
  EXPECT_EQ(bf.tasks[0].params.loras[0].path, (dir / "loras" / "hero.safetensors").lexically_normal());
  EXPECT_DOUBLE_EQ(bf.tasks[0].params.loras[0].weight, 0.8);
  EXPECT_TRUE(bf.tasks[0].params.loras[0].pin);
  ASSERT_EQ(bf.tasks[1].params.loras.size(), 2u);  // the task's list replaces the defaults'
  EXPECT_EQ(bf.tasks[1].params.loras[0].name, "ink");
  EXPECT_DOUBLE_EQ(bf.tasks[1].params.loras[1].weight, -0.5);

  const std::string bad = R"({"version": 1,
    "loras": {"gone": {"path": "nope.safetensors"}, "odd": {"path": "ink.safetensors", "pin": "yes"}},
    "tasks": [{"id": "a", "prompt": "x", "loras": [{"name": "villain"}, {"name": "gone", "path": "ink.safetensors"},
                                                   {"path": "missing.safetensors", "weight": 99}, 3]}]})";
  (void)parse_batch_text(bad, dir / "b.json", GenerationParams{}, &problems);
  std::set<std::string> pointers;
  for (const auto& p : problems) pointers.insert(p.pointer);
  for (const char* want : {"/loras/gone/path", "/loras/odd/pin", "/tasks/0/loras/0/name", "/tasks/0/loras/1",
                           "/tasks/0/loras/2/weight", "/tasks/0/loras/2/path", "/tasks/0/loras/3"})
    EXPECT_EQ(pointers.count(want), 1u) << want;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sdxl
