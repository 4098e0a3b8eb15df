// VAE decode dtype (--vae-dtype) on the tiny model (CPU, exported in fp32):
// the traced decoder retyped to bf16 runs and agrees with fp32; a decode with
// NaN/Inf output is logged with the image's name and redone in fp32; bad
// options and non-finite latents give clear errors.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdlib>
#include <limits>

#include "image/vae_decode.h"
#include "tiny_model_test.h"
#include "model/sdxl_model.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace {

class VaeDtype : public sdxl::testing::TinyModelTest<> {
 protected:
  void SetUp() override {
    TinyModelTest::SetUp();
    if (IsSkipped()) return;
    cfg_ = sdxl::load_model_config(model_);
    ASSERT_EQ(cfg_.vae_dtype, "fp32");
    // Smooth latents (like a sampled image's), 16x12 latent pixels = 128x96 px.
    torch::manual_seed(5);
    z_ = at::upsample_bilinear2d(torch::randn({1, 4, 4, 3}), {16, 12}, false) * 3.0;
  }
  std::unique_ptr<sdxl::SdxlModel> load() { return sdxl::SdxlModel::load(cfg_, torch::Device(torch::kCPU), ""); }

  sdxl::ModelConfig cfg_;
  torch::Tensor z_;
};

// A decoder that returns `value` everywhere, with the real output's shape.
torch::jit::Module constant_decoder(const std::string& value) {
  torch::jit::Module m("ConstantDecoder");
  m.define("def forward(self, z):\n"
           "    return torch.full([z.size(0), 3, z.size(2) * 8, z.size(3) * 8], " + value + ", dtype=z.dtype)\n");
  return m;
}

// Logs of a scope, kept in memory.
struct CapturedLog {
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  std::shared_ptr<spdlog::logger> saved = spdlog::default_logger();
  CapturedLog() { spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink)); }
  ~CapturedLog() { spdlog::set_default_logger(saved); }
  std::string text() const {
    std::string all;
    for (const auto& line : sink->last_formatted()) all += line;
    return all;
  }
};

double psnr_8bit(const torch::Tensor& x, const torch::Tensor& y) {
  const torch::Tensor a = (x / 2 + 0.5).clamp(0, 1) * 255, b = (y / 2 + 0.5).clamp(0, 1) * 255;
  const double mse = (a - b).pow(2).mean().item<double>();
  return 10 * std::log10(255.0 * 255.0 / std::max(mse, 1e-12));
}

}  // namespace

TEST_F(VaeDtype, Bf16DecodeRunsInBf16AndAgreesWithFp32) {
  c10::InferenceMode guard;
  auto model = load();
  EXPECT_EQ(model->vae_decode_dtype, torch::kFloat32);
  sdxl::set_vae_decode_dtype(*model, "auto");  // as exported (fp32 for the tiny model): nothing changes
  EXPECT_EQ(model->vae_decode_dtype, torch::kFloat32);
  const torch::Tensor fp32 = sdxl::vae_decode_image(*model, z_);

  sdxl::set_vae_decode_dtype(*model, "bf16");
  EXPECT_EQ(model->vae_decode_dtype, torch::kBFloat16);
  for (const at::Tensor& p : model->vae_decoder.parameters()) ASSERT_EQ(p.scalar_type(), torch::kBFloat16);
  const torch::Tensor bf16 = sdxl::vae_decode_image(*model, z_);
  ASSERT_EQ(bf16.sizes(), fp32.sizes());
  ASSERT_EQ(bf16.scalar_type(), torch::kFloat32);  // handed on in fp32
  const double psnr = psnr_8bit(bf16, fp32);
  const double max_diff = ((bf16 - fp32).abs().max().item<double>());
  RecordProperty("psnr_db", std::to_string(psnr));
  std::printf("bf16 vs fp32 decode: PSNR %.1f dB, max |diff| %.4f (output range ±%.2f)\n", psnr, max_diff,
              fp32.abs().max().item<double>());
  EXPECT_FALSE(torch::equal(bf16, fp32)) << "the decode did not run in bf16";
  EXPECT_GT(psnr, 30.0);
  EXPECT_LT(max_diff, 0.1 * std::max(1.0, fp32.abs().max().item<double>()));
  // Nothing was redone in fp32 for finite output.
  const auto rgb = sdxl::vae_decode_rgb8(*model, z_);
  EXPECT_EQ(rgb.size(), static_cast<size_t>(128 * 96 * 3));
  EXPECT_EQ(model->vae_fp32_redecodes, 0);
  EXPECT_FALSE(model->vae_decoder_fp32.has_value());
}

TEST_F(VaeDtype, RetypedModuleIsACopyWithItsOwnGraphs) {
  c10::InferenceMode guard;
  auto model = load();
  const torch::Tensor before = sdxl::vae_decode_image(*model, z_);
  int rewritten = -1;
  torch::jit::Module bf16 = sdxl::retyped_module(model->vae_decoder, torch::kFloat32, torch::kBFloat16, &rewritten);
  EXPECT_GE(rewritten, 1) << "the export's `z.to(float32)` should have been rewritten";
  EXPECT_EQ(bf16.forward({z_.to(torch::kBFloat16)}).toTensor().scalar_type(), torch::kBFloat16);
  // The original still runs in fp32, bit for bit as before.
  for (const at::Tensor& p : model->vae_decoder.parameters()) ASSERT_EQ(p.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(sdxl::vae_decode_image(*model, z_), before));
}

TEST_F(VaeDtype, NanOrInfOutputIsDecodedAgainInFp32) {
  c10::InferenceMode guard;
  auto reference = load();
  const auto want = sdxl::image_to_rgb8(sdxl::vae_decode_image(*reference, z_), "reference");
  const sdxl::TileGrid grid{8, 2};
  const auto want_tiled = sdxl::image_to_rgb8(sdxl::vae_decode_image_tiled(*reference, z_, grid), "reference, tiled");
  ASSERT_NE(want, want_tiled);
  for (const std::string value : {"float('nan')", "float('inf')"}) {
    auto model = load();
    sdxl::set_vae_decode_dtype(*model, "bf16");
    model->vae_decoder = constant_decoder(value);  // a low-precision decoder that overflows
    CapturedLog log;
    const auto got = sdxl::vae_decode_rgb8(*model, z_, sdxl::VaeTiling::kAuto, {}, "seed 1207");
    EXPECT_EQ(model->vae_fp32_redecodes, 1) << value;
    ASSERT_TRUE(model->vae_decoder_fp32.has_value());
    EXPECT_EQ(got, want) << value << ": the image must be the fp32 decode's";
    const std::string text = log.text();
    EXPECT_NE(text.find("NaN/Inf"), std::string::npos) << text;
    EXPECT_NE(text.find("seed 1207"), std::string::npos) << "the warning names the image: " << text;
    // Tiled decodes fall back the same way; the fp32 decoder is loaded once and reused.
    const auto again = sdxl::vae_decode_rgb8(*model, z_, sdxl::VaeTiling::kAlways, grid, "seed 1208");
    EXPECT_EQ(model->vae_fp32_redecodes, 2);
    EXPECT_EQ(again, want_tiled) << value << ": the tiled image must be the tiled fp32 decode's";
  }
}

TEST_F(VaeDtype, NonFiniteLatentsFailClearlyAfterTheFallback) {
  c10::InferenceMode guard;
  torch::Tensor bad = z_.clone();
  bad.index_put_({0, 0, 3, 3}, std::numeric_limits<float>::quiet_NaN());
  auto model = load();
  sdxl::set_vae_decode_dtype(*model, "bf16");
  try {
    sdxl::vae_decode_rgb8(*model, bad, sdxl::VaeTiling::kNever, {}, "seed 9");
    FAIL() << "NaN latents must fail";
  } catch (const sdxl::TaskError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("seed 9"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fp32 after NaN/Inf in bf16"), std::string::npos) << msg;
  }
  EXPECT_EQ(model->vae_fp32_redecodes, 1);
  // In fp32 there is nothing to fall back to: one decode, then the error.
  auto fp32 = load();
  EXPECT_THROW(sdxl::vae_decode_rgb8(*fp32, bad), sdxl::TaskError);
  EXPECT_EQ(fp32->vae_fp32_redecodes, 0);
}

TEST_F(VaeDtype, UnknownOptionIsAUsageError) {
  auto model = load();
  try {
    sdxl::set_vae_decode_dtype(*model, "fp8");
    FAIL() << "fp8 must be refused";
  } catch (const sdxl::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("expected auto, fp32, fp16 or bf16"), std::string::npos) << e.what();
  }
  EXPECT_EQ(model->vae_decode_dtype, torch::kFloat32);
}
