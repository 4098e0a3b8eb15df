// LoRA patching on the tiny model (CPU): the merge math, the LRU cache, and the
// issue's drift test: after 1000 random apply/restore cycles every parameter is
// bit-identical to before. Needs the tiny model and tests/reference/make_test_loras.py's
// files (SDXL_FIXTURES_DIR); skips without them.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>

#include "lora/lora_cache.h"
#include "lora/lora_patcher.h"
#include "model/sdxl_model.h"
#include "core/error.h"
#include "core/sha256.h"

namespace sdxl {
namespace {

namespace fs = std::filesystem;

fs::path fixtures() {
  const char* d = std::getenv("SDXL_FIXTURES_DIR");
  return d ? fs::path(d) : fs::path();
}

class LoraPatcherTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const fs::path dir = fixtures();
    if (dir.empty() || !fs::exists(dir / "tiny-model" / "model.json") || !fs::exists(dir / "loras" / "kohya_unet.safetensors"))
      return;
    model_ = SdxlModel::load(load_model_config(dir / "tiny-model"), torch::kCPU, "").release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "no tiny model / test LoRAs under SDXL_FIXTURES_DIR";
  }
  static LoraRef ref(const std::string& name, double w = 1.0) {
    LoraRef r;
    r.name = name;
    r.path = fixtures() / "loras" / (name + ".safetensors");
    r.weight = w;
    return r;
  }
  // SHA-256 over the raw bytes of every parameter of every module, in name order.
  static std::string checksum() {
    std::string all;
    for (auto* m : {&model_->text_encoder, &model_->text_encoder_2, &model_->unet, &model_->vae_decoder})
      for (const auto& p : m->named_parameters(true)) {
        const torch::Tensor t = p.value.contiguous();
        all += p.name + ":" +
               sha256_hex({static_cast<const std::uint8_t*>(t.data_ptr()), static_cast<size_t>(t.nbytes())}) + "\n";
      }
    return sha256_hex({reinterpret_cast<const std::uint8_t*>(all.data()), all.size()});
  }
  static torch::Tensor param(torch::jit::Module& m, const std::string& name) {
    for (const auto& p : m.named_parameters(true))
      if (p.name == name) return p.value;
    throw std::runtime_error("no parameter " + name);
  }
  static SdxlModel* model_;
};
SdxlModel* LoraPatcherTest::model_ = nullptr;

// A 24 or 12 GB card, real or simulated with --vram-limit, keeps the originals
// in host memory; an H200 (or a cap of 32 GiB and more) and the CPU beside the weights.
TEST(LoraOriginals, InHostMemoryOnCudaBudgetsUnder32GiB) {
  EXPECT_TRUE(lora_originals_on_host(true, 24ull << 30));
  EXPECT_TRUE(lora_originals_on_host(true, 12ull << 30));
  EXPECT_TRUE(lora_originals_on_host(true, (32ull << 30) - 1));
  EXPECT_FALSE(lora_originals_on_host(true, 32ull << 30));
  EXPECT_FALSE(lora_originals_on_host(true, 140ull << 30));
  EXPECT_FALSE(lora_originals_on_host(false, 0));
  EXPECT_FALSE(lora_originals_on_host(false, 12ull << 30));
}

TEST_F(LoraPatcherTest, MergeIsBasePlusScaledProduct) {
  LoraPatcher patcher(*model_);
  LoraCache cache(patcher.shapes(), torch::kCPU, 1ull << 30, /*strict=*/true);
  const auto lora = cache.get(ref("kohya_unet"));
  const LoraFactor& f = lora->factors.front();
  EXPECT_DOUBLE_EQ(f.scale, 0.5);  // alpha = rank / 2 in make_test_loras.py
  const torch::Tensor w = param(model_->unet, f.param);
  const torch::Tensor before = w.clone();
  patcher.apply({{lora, 0.7}});
  const torch::Tensor expect =
      before + 0.7 * f.scale * torch::mm(f.up.to(torch::kFloat32).flatten(1), f.down.to(torch::kFloat32).flatten(1)).view(w.sizes());
  EXPECT_TRUE(torch::allclose(w, expect, 1e-5, 1e-6));
  // Bit for bit: the sum is formed in fp32 in one addmm per factor, cast back once.
  torch::Tensor sum = before.to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
  sum.view({sum.size(0), -1}).addmm_(f.up.to(torch::kFloat32).flatten(1), f.down.to(torch::kFloat32).flatten(1), 1.0,
                                     0.7 * f.scale);
  EXPECT_TRUE(torch::equal(w, sum.to(w.scalar_type())));
  EXPECT_FALSE(torch::equal(w, before));
  // A second apply of the same set starts again from the kept original.
  patcher.apply({{lora, 0.7}});
  EXPECT_TRUE(torch::equal(w, sum.to(w.scalar_type())));
  patcher.restore_all();
  EXPECT_TRUE(torch::equal(w, before));
  EXPECT_EQ(patcher.patched_weights(), 0u);
}

// An FP8 weight (--precision fp8): dequantised with its export weight_scale, the
// product added in fp32, quantised again with that scale, or with amax / 448 where
// the sum reaches beyond 464 scales; restoring brings back the original bytes and scale.
TEST_F(LoraPatcherTest, Fp8WeightIsDequantisedMergedAndQuantisedAgainWithAScaleThatHoldsIt) {
  const ModelConfig cfg = load_model_config(fixtures() / "tiny-model");
  if (cfg.unet_fp8.file.empty()) GTEST_SKIP() << "the tiny model was exported without --fp8";
  auto fp8 = SdxlModel::load(with_unet_precision(cfg, "fp8", ""), torch::kCPU, "");
  LoraPatcher patcher(*fp8);
  LoraCache cache(patcher.shapes(), torch::kCPU, 1ull << 30, /*strict=*/true);
  const auto lora = cache.get(ref("kohya_unet"));
  std::map<std::string, torch::Tensor> scales;
  for (const auto& b : fp8->unet.named_buffers(true)) scales.emplace(b.name, b.value);
  const auto scale_of = [&](const LoraFactor& g) { return scales.at(g.param.substr(0, g.param.size() - 7) + ".weight_scale"); };
  // The FP8 weights kohya_unet patches, with what each becomes at a weight w.
  struct Case {
    const LoraFactor* f;
    torch::Tensor w, before, scale_before;
  };
  std::vector<Case> cases;
  for (const auto& g : lora->factors)
    if (g.target == LoraTarget::kUnet && scales.count(g.param.substr(0, g.param.size() - 7) + ".weight_scale")) {
      const torch::Tensor w = param(fp8->unet, g.param);
      cases.push_back({&g, w, w.clone(), scale_of(g).clone()});
    }
  ASSERT_FALSE(cases.empty()) << "kohya_unet patches no FP8 weight";
  ASSERT_EQ(cases[0].w.scalar_type(), torch::kFloat8_e4m3fn);
  int grown = 0, kept = 0;
  for (const double weight : {0.7, 0.01}) {  // strong: some scales grow; weak: each stays
    patcher.apply({{lora, weight}});
    for (const Case& c : cases) {
      torch::Tensor sum = c.before.to(torch::kFloat32).mul(c.scale_before);
      sum.view({sum.size(0), -1}).addmm_(c.f->up.to(torch::kFloat32).flatten(1),
                                         c.f->down.to(torch::kFloat32).flatten(1), 1.0, weight * c.f->scale);
      const torch::Tensor amax = sum.abs().max();
      const torch::Tensor want_scale = torch::where(amax.gt(c.scale_before.mul(464.0)), amax.div(448.0), c.scale_before);
      const torch::Tensor expect = sum.div(want_scale).clamp(-448.0, 448.0).to(torch::kFloat8_e4m3fn);
      EXPECT_TRUE(torch::equal(scale_of(*c.f), want_scale)) << c.f->param;
      EXPECT_TRUE(torch::equal(c.w.view(torch::kUInt8), expect.view(torch::kUInt8))) << c.f->param;
      EXPECT_FALSE(torch::equal(c.w.view(torch::kUInt8), c.before.view(torch::kUInt8))) << c.f->param;
      (torch::equal(want_scale, c.scale_before) ? kept : grown) += 1;
    }
  }
  EXPECT_GT(grown, 0) << "at 0.7 the test LoRA should reach beyond some export ranges";
  EXPECT_GT(kept, 0);
  patcher.restore_all();
  for (const Case& c : cases) {
    EXPECT_TRUE(torch::equal(c.w.view(torch::kUInt8), c.before.view(torch::kUInt8))) << c.f->param;
    EXPECT_TRUE(torch::equal(scale_of(*c.f), c.scale_before)) << c.f->param;
  }
}

TEST_F(LoraPatcherTest, ThousandRandomSwitchesLeaveBaseWeightsBitIdentical) {
  const std::string base = checksum();
  LoraPatcher patcher(*model_);
  LoraCache cache(patcher.shapes(), torch::kCPU, 1ull << 30, /*strict=*/true);
  const std::vector<std::string> names = {"kohya_unet", "kohya_unet_dn", "kohya_te", "peft", "diffusers_old", "locon"};
  std::mt19937 rng(1234);
  std::uniform_real_distribution<double> weight(-1.5, 1.5);
  int patched_cycles = 0;
  bool checked_change = false;
  for (int cycle = 0; cycle < 1000; ++cycle) {
    LoraPatcher::Applied set;
    for (const auto& n : names) {
      if (rng() % 3 == 0) set.emplace_back(cache.get(ref(n)), weight(rng));
    }
    patcher.apply(set);  // a switch: from whatever was applied to this set
    if (!set.empty()) ++patched_cycles;
    if (!set.empty() && cycle >= 500 && !checked_change) {
      EXPECT_NE(checksum(), base) << "a LoRA set should change the weights";
      checked_change = true;
    }
    if (rng() % 4 == 0) patcher.restore_all();
  }
  EXPECT_TRUE(checked_change);
  patcher.restore_all();
  EXPECT_GT(patched_cycles, 900);
  EXPECT_EQ(checksum(), base);
  EXPECT_EQ(cache.stats().misses, names.size());
}

// Keeping a set's originals ahead (while the batch before still samples)
// changes no weight, and the merge that follows is the one without it; a set
// kept ahead but never applied leaves nothing behind.
TEST_F(LoraPatcherTest, OriginalsKeptAheadChangeNothing) {
  const std::string base = checksum();
  LoraCache cache(LoraPatcher(*model_).shapes(), torch::kCPU, 1ull << 30, /*strict=*/true);
  const LoraPatcher::Applied a = {{cache.get(ref("kohya_unet")), 0.8}, {cache.get(ref("kohya_te")), 0.5}};
  const LoraPatcher::Applied b = {{cache.get(ref("locon")), 1.2}};
  std::string merged_a, merged_b;
  {
    LoraPatcher plain(*model_);
    plain.apply(a);
    merged_a = checksum();
    plain.apply(b);
    merged_b = checksum();
    plain.restore_all();
  }
  ASSERT_EQ(checksum(), base);
  LoraPatcher ahead(*model_);
  ahead.keep_originals(a);
  EXPECT_EQ(checksum(), base);
  EXPECT_GT(ahead.patched_weights(), 0u);
  ahead.apply(a);
  EXPECT_EQ(checksum(), merged_a);
  ahead.keep_originals(b);  // beside a set applied now: b's weights that a patched stay kept as they were
  EXPECT_EQ(checksum(), merged_a);
  ahead.apply(b);
  EXPECT_EQ(checksum(), merged_b);
  ahead.keep_originals(a);  // kept for a set that does not come
  ahead.restore_all();
  EXPECT_EQ(ahead.patched_weights(), 0u);
  EXPECT_EQ(checksum(), base);
}

TEST_F(LoraPatcherTest, CacheEvictsLeastRecentlyUsedButNeverPinned) {
  LoraPatcher patcher(*model_);
  LoraCache probe(patcher.shapes(), torch::kCPU, 1ull << 30, true);
  const std::uint64_t a = probe.get(ref("kohya_unet"))->bytes, b = probe.get(ref("kohya_unet_dn"))->bytes,
                      c = probe.get(ref("locon"))->bytes;
  LoraCache cache(patcher.shapes(), torch::kCPU, a + b + c - 1, true);  // room for two of three
  LoraRef pinned = ref("kohya_unet");
  pinned.pin = true;
  (void)cache.get(pinned);
  (void)cache.get(ref("kohya_unet_dn"));
  (void)cache.get(ref("locon"));  // evicts kohya_unet_dn (pinned kohya_unet is older but kept)
  EXPECT_EQ(cache.stats().evictions, 1u);
  (void)cache.get(ref("kohya_unet"));
  EXPECT_EQ(cache.stats().hits, 1u);
  (void)cache.get(ref("kohya_unet_dn"));  // a miss again
  EXPECT_EQ(cache.stats().misses, 4u);
  EXPECT_LE(cache.stats().bytes_held, a + b + c);
}

TEST_F(LoraPatcherTest, RefusesSd15AndBrokenFiles) {
  LoraPatcher patcher(*model_);
  LoraCache cache(patcher.shapes(), torch::kCPU, 1ull << 30, false);
  try {
    (void)cache.get(ref("sd15"));
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("another base model"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)cache.get(ref("nan")), UsageError);
}

}  // namespace
}  // namespace sdxl
