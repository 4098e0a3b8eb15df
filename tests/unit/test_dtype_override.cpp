// --dtype on a model exported in another dtype (the tiny model is exported in
// fp32): the modules are retyped, floating weights only (integer buffers such
// as the text encoders' position ids stay integer: a plain Module::to(dtype)
// cast them and every text encode failed), and the trace's baked dtype
// constants follow, so a whole image runs in bf16. The reference for the
// pixels is diffusers in bf16: on this random tiny model bf16 vs fp32 is about
// 13 dB in diffusers and in sdxl-batch alike, so only that the image runs and
// differs from fp32 is asserted here.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "model/sdxl_model.h"
#include "pipeline/generator.h"
#include "model/model_config.h"
#include "tiny_model_test.h"

namespace {

using DtypeOverride = sdxl::testing::TinyModelTest<>;

TEST_F(DtypeOverride, Bf16OnAnFp32ExportCastsFloatingWeightsOnly) {
  const sdxl::ModelConfig cfg = sdxl::load_model_config(model_);
  ASSERT_EQ(cfg.dtype, "fp32");
  const auto m = sdxl::SdxlModel::load(cfg, torch::Device(torch::kCPU), "bf16");
  EXPECT_EQ(m->dtype, torch::kBFloat16);
  for (const torch::jit::Module* mod : {&m->text_encoder, &m->text_encoder_2, &m->unet}) {
    int floating = 0, integer = 0;
    for (const at::Tensor& p : mod->parameters()) {
      ASSERT_EQ(p.scalar_type(), torch::kBFloat16);
      ++floating;
    }
    for (const at::Tensor& b : mod->buffers()) {
      if (b.is_floating_point()) {
        EXPECT_EQ(b.scalar_type(), torch::kBFloat16);
      } else {
        ++integer;
      }
    }
    EXPECT_GT(floating, 0);
    if (mod != &m->unet) {
      EXPECT_GT(integer, 0) << "the text encoders' position ids must stay integer";
    }
  }
  // The VAE keeps its exported dtype (its decode dtype is --vae-dtype's business).
  for (const at::Tensor& p : m->vae_decoder.parameters()) ASSERT_EQ(p.scalar_type(), torch::kFloat32);
}

TEST_F(DtypeOverride, AWholeImageRunsInBf16) {
  sdxl::GenerationParams p;
  p.prompt = "a red fox on a train";
  p.negative_prompt = "blurry";
  p.seed = 1;
  p.steps = 3;
  p.width = p.height = 256;
  sdxl::RuntimeOptions bf16;
  bf16.dtype = "bf16";
  sdxl::Generator gen_bf16(model_, bf16);
  const sdxl::GeneratedImage a = gen_bf16.generate(p);
  sdxl::Generator gen_fp32(model_, sdxl::RuntimeOptions{});
  const sdxl::GeneratedImage b = gen_fp32.generate(p);
  ASSERT_EQ(a.rgb.size(), 256u * 256u * 3u);
  ASSERT_EQ(a.rgb.size(), b.rgb.size());
  EXPECT_NE(a.rgb, b.rgb);  // really computed in another dtype
  for (float v : a.latents) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
