#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "core/error.h"
#include "model/detector_config.h"
#include "model/model_config.h"

namespace {

nlohmann::json valid() {
  return nlohmann::json::parse(R"({
    "format_version": 1, "name": "t", "source": "tiny", "architecture": "sdxl-base",
    "dtype": "fp32", "vae_dtype": "fp32", "export_device": "cpu",
    "vae_scaling_factor": 0.13025, "vae_downsample": 8, "latent_channels": 4,
    "text_encoders": [
      {"file": "text_encoder.ts", "tokenizer": "tokenizer", "pad_token": "<|endoftext|>", "hidden_dim": 32},
      {"file": "text_encoder_2.ts", "tokenizer": "tokenizer_2", "pad_token": "!", "hidden_dim": 32, "pooled_dim": 32}],
    "unet": {"file": "unet.ts", "in_channels": 4, "context_dim": 64, "pooled_dim": 32, "time_ids_dim": 6},
    "vae_decoder": {"file": "vae_decoder.ts"},
    "scheduler": {"num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012,
                  "beta_schedule": "scaled_linear", "timestep_spacing": "leading", "steps_offset": 1,
                  "prediction_type": "epsilon"},
    "defaults": {"width": 256, "height": 256, "steps": 8, "cfg": 5.0},
    "limits": {"batch_max": 8, "width_min": 64, "width_max": 1536, "height_min": 64, "height_max": 1536,
               "size_multiple": 8, "context_chunks_max": 4}
  })");
}

std::string error_of(const nlohmann::json& j) {
  try {
    sdxl::parse_model_config(j.dump(), "/m", "/m/model.json", false);
  } catch (const sdxl::ModelError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ModelConfig, ParsesAValidFile) {
  auto c = sdxl::parse_model_config(valid().dump(), "/m", "/m/model.json", false);
  EXPECT_EQ(c.name, "t");
  EXPECT_EQ(c.text_encoders.at(1).pad_token, "!");
  EXPECT_EQ(c.unet_context_dim, 64);
  EXPECT_EQ(c.scheduler.timestep_spacing, "leading");
  EXPECT_EQ(c.limits.width_max, 1536);
  EXPECT_EQ(c.defaults.steps, 8);
}

TEST(ModelConfig, InpaintingUnetTakesNineChannels) {
  auto j = valid();
  EXPECT_FALSE(sdxl::parse_model_config(j.dump(), "/m", "/m/model.json", false).inpainting_unet());
  j["unet"]["in_channels"] = 9;  // latents, mask, masked image latents
  const auto c = sdxl::parse_model_config(j.dump(), "/m", "/m/model.json", false);
  EXPECT_TRUE(c.inpainting_unet());
  EXPECT_EQ(c.unet_in_channels, 9);
  EXPECT_EQ(c.latent_channels, 4);
  j["unet"]["in_channels"] = 8;
  EXPECT_NE(error_of(j).find("/unet/in_channels must be /latent_channels (4) or, for an inpainting UNet"),
            std::string::npos) << error_of(j);
  j["unet"].erase("in_channels");  // exports before inpainting models: the latents only
  EXPECT_FALSE(sdxl::parse_model_config(j.dump(), "/m", "/m/model.json", false).inpainting_unet());
}

TEST(ModelConfig, ErrorsNameFileAndPointer) {
  auto j = valid();
  j.erase("unet");
  EXPECT_NE(error_of(j).find("/m/model.json: /unet is missing"), std::string::npos) << error_of(j);

  j = valid();
  j["dtype"] = "fp8";
  EXPECT_NE(error_of(j).find("/dtype is 'fp8', expected one of: fp32, fp16, bf16"), std::string::npos) << error_of(j);

  j = valid();
  j["format_version"] = 2;
  EXPECT_NE(error_of(j).find("/format_version"), std::string::npos);

  j = valid();
  j["unet"]["context_dim"] = 100;
  EXPECT_NE(error_of(j).find("/unet/context_dim must equal"), std::string::npos);

  j = valid();
  j["text_encoders"][1].erase("pooled_dim");
  EXPECT_NE(error_of(j).find("/text_encoders/1/pooled_dim"), std::string::npos);

  j = valid();
  j["scheduler"]["steps_offset"] = "one";
  EXPECT_NE(error_of(j).find("/scheduler/steps_offset must be an integer"), std::string::npos);

  j = valid();
  j["limits"]["width_min"] = 2048;
  EXPECT_NE(error_of(j).find("width_min is larger"), std::string::npos);

  EXPECT_NE(error_of(nlohmann::json::array()).find("must be a JSON object"), std::string::npos);
}

TEST(ModelConfig, BrokenJsonIsReported) {
  try {
    sdxl::parse_model_config("{\"format_version\": 1,", "/m", "/m/model.json", false);
    FAIL();
  } catch (const sdxl::ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("/m/model.json: not valid JSON"), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, MissingDirectoryAndFilesAreNamed) {
  try {
    sdxl::load_model_config("/nonexistent/model-dir");
    FAIL();
  } catch (const sdxl::ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model-dir"), std::string::npos);
  }
  // check_files: the first missing module is named.
  try {
    sdxl::parse_model_config(valid().dump(), "/nonexistent", "/nonexistent/model.json", true);
    FAIL();
  } catch (const sdxl::ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/text_encoder.ts"), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, SizeLimits) {
  auto c = sdxl::parse_model_config(valid().dump(), "/m", "/m/model.json", false);
  EXPECT_NO_THROW(sdxl::check_generation_size(c, 256, 512, 1));
  EXPECT_THROW(sdxl::check_generation_size(c, 260, 512, 1), sdxl::UsageError);
  EXPECT_THROW(sdxl::check_generation_size(c, 256, 256, 9), sdxl::UsageError);
  EXPECT_EQ(sdxl::unchecked_size_note(c, 256, 512), "");
  // Past the checked range: runs, with a note that names the size and the range.
  EXPECT_NO_THROW(sdxl::check_generation_size(c, 2048, 512, 1));
  const std::string note = sdxl::unchecked_size_note(c, 2048, 512);
  EXPECT_NE(note.find("2048x512 is outside the sizes model"), std::string::npos) << note;
  EXPECT_NE(note.find("it runs"), std::string::npos) << note;
  // The hard bounds still refuse.
  EXPECT_THROW(sdxl::check_generation_size(c, sdxl::kSizeHardMax + 8, 512, 1), sdxl::UsageError);
  EXPECT_THROW(sdxl::check_generation_size(c, 56, 512, 1), sdxl::UsageError);
}

TEST(ModelConfig, AotiPackageIsOptionalAndValidated) {
  auto c = sdxl::parse_model_config(valid().dump(), "/m", "/m/model.json", false);
  EXPECT_TRUE(c.unet_aoti.file.empty());  // model.json files from before --aoti stay valid

  auto j = valid();
  j["unet"]["aoti"] = nlohmann::json::parse(R"({"file": "unet.pt2", "device": "cpu", "dtype": "fp32",
      "rows": [1, 16], "tokens": [77, 308], "latent_height": [32, 192], "latent_width": [40, 128]})");
  c = sdxl::parse_model_config(j.dump(), "/m", "/m/model.json", false);
  EXPECT_EQ(c.unet_aoti.file, "unet.pt2");
  EXPECT_EQ(c.unet_aoti.device, "cpu");
  EXPECT_EQ(c.unet_aoti.rows_max, 16);
  EXPECT_EQ(c.unet_aoti.tokens_max, 308);
  EXPECT_EQ(c.unet_aoti.latent_height_min, 32);
  EXPECT_EQ(c.unet_aoti.latent_width_min, 40);
  EXPECT_EQ(c.unet_aoti.latent_width_max, 128);

  auto bad = j;
  bad["unet"]["aoti"]["latent_width"] = nlohmann::json::array({128, 40});
  EXPECT_NE(error_of(bad).find("/unet/aoti/latent_width must satisfy"), std::string::npos) << error_of(bad);
  bad = j;
  bad["unet"]["aoti"]["rows"] = 16;
  EXPECT_NE(error_of(bad).find("/unet/aoti/rows must be [min, max]"), std::string::npos) << error_of(bad);
  bad = j;
  bad["unet"]["aoti"]["device"] = "mps";
  EXPECT_NE(error_of(bad).find("/unet/aoti/device is 'mps'"), std::string::npos) << error_of(bad);
  bad = j;
  bad["unet"]["aoti"].erase("dtype");
  EXPECT_NE(error_of(bad).find("/unet/aoti/dtype is missing"), std::string::npos) << error_of(bad);
}

TEST(ModelConfig, AutoBackendTakesThePackageOnlyWhereItFits) {
  auto j = valid();
  const auto plain = sdxl::parse_model_config(j.dump(), "/m", "/m/model.json", false);
  j["unet"]["aoti"] = nlohmann::json::parse(R"({"file": "unet.pt2", "device": "cuda", "dtype": "fp16",
      "rows": [1, 16], "tokens": [77, 308], "latent_height": [128, 128], "latent_width": [128, 128]})");
  const auto packaged = sdxl::parse_model_config(j.dump(), "/m", "/m/model.json", false);
  std::string why;
  EXPECT_EQ(sdxl::resolve_unet_backend(packaged, "auto", "cuda", "fp16", &why), "aoti");
  EXPECT_NE(why.find("has a unet.pt2 for cuda fp16"), std::string::npos) << why;
  EXPECT_EQ(sdxl::resolve_unet_backend(plain, "auto", "cuda", "fp16", &why), "torchscript");
  EXPECT_NE(why.find("no unet.pt2"), std::string::npos) << why;
  EXPECT_EQ(sdxl::resolve_unet_backend(packaged, "auto", "cpu", "fp16", &why), "torchscript");
  EXPECT_NE(why.find("compiled for cuda, the model runs on cpu"), std::string::npos) << why;
  EXPECT_EQ(sdxl::resolve_unet_backend(packaged, "auto", "cuda", "bf16", &why), "torchscript");
  EXPECT_NE(why.find("compiled for fp16, the model runs in bf16"), std::string::npos) << why;
  // Asked for by name: as asked (the aoti backend's own checks name a mismatch).
  EXPECT_EQ(sdxl::resolve_unet_backend(plain, "aoti", "cuda", "fp16"), "aoti");
  EXPECT_EQ(sdxl::resolve_unet_backend(packaged, "torchscript", "cuda", "fp16"), "torchscript");
  EXPECT_THROW(sdxl::resolve_unet_backend(packaged, "tensorrt", "cuda", "fp16"), sdxl::UsageError);
}

TEST(ModelConfig, PackageCompiledOnAnotherGpuKindIsNotRun) {
  auto j = valid();
  j["unet"]["aoti"] = nlohmann::json::parse(R"({"file": "unet.pt2", "device": "cuda", "dtype": "fp16",
      "gpu": "NVIDIA H200", "capability": "9.0",
      "rows": [1, 16], "tokens": [77, 308], "latent_height": [128, 128], "latent_width": [128, 128]})");
  const auto packaged = sdxl::parse_model_config(j.dump(), "/m", "/m/model.json", false);
  EXPECT_EQ(packaged.unet_aoti.gpu, "NVIDIA H200");
  EXPECT_EQ(packaged.unet_aoti.capability, "9.0");
  std::string why;
  EXPECT_EQ(sdxl::resolve_unet_backend(packaged, "auto", "cuda", "fp16", &why, "9.0"), "aoti");
  EXPECT_EQ(sdxl::resolve_unet_backend(packaged, "auto", "cuda", "fp16", &why, "8.9"), "torchscript");
  EXPECT_NE(why.find("unet.pt2 was compiled on NVIDIA H200 (compute capability 9.0), whose kernels do not run on this "
                     "GPU (compute capability 8.9); re-export"), std::string::npos) << why;
  EXPECT_EQ(sdxl::unet_aoti_mismatch(packaged, "cuda", "fp16", "8.9"), why);
  // Packages from before the GPU was recorded, and callers that do not know it, are not checked.
  j["unet"]["aoti"].erase("capability");
  const auto old = sdxl::parse_model_config(j.dump(), "/m", "/m/model.json", false);
  EXPECT_EQ(sdxl::unet_aoti_mismatch(old, "cuda", "fp16", "8.9"), "");
  EXPECT_EQ(sdxl::unet_aoti_mismatch(packaged, "cuda", "fp16"), "");
}

TEST(ModelConfig, VaeDecoderPackageIsReadAndRunOnlyWhereItFits) {
  auto j = valid();
  const auto plain = sdxl::parse_model_config(j.dump(), "/m", "/m/model.json", false);
  EXPECT_TRUE(plain.vae_decoder_aoti.file.empty());
  EXPECT_NE(sdxl::vae_aoti_mismatch(plain, "cuda", "fp16").find("no vae_decoder.pt2 (model.json has no "
                                                                 "/vae_decoder/aoti); export it with"),
            std::string::npos);
  // No "tokens": the VAE has no text input.
  j["vae_decoder"]["aoti"] = nlohmann::json::parse(R"({"file": "vae_decoder.pt2", "device": "cuda", "dtype": "fp16",
      "gpu": "NVIDIA H200", "capability": "9.0", "rows": [1, 1], "latent_height": [128, 128],
      "latent_width": [96, 96]})");
  const auto c = sdxl::parse_model_config(j.dump(), "/m", "/m/model.json", false);
  EXPECT_EQ(c.vae_decoder_aoti.file, "vae_decoder.pt2");
  EXPECT_EQ(c.vae_decoder_aoti.latent_height_max, 128);
  EXPECT_EQ(c.vae_decoder_aoti.latent_width_min, 96);
  EXPECT_TRUE(c.vae_decoder_aoti.covers_latents(1, 128, 96));    // one 768x1024 image (W x H)
  EXPECT_FALSE(c.vae_decoder_aoti.covers_latents(2, 128, 96));   // two at once
  EXPECT_FALSE(c.vae_decoder_aoti.covers_latents(1, 96, 128));   // another size: vae_decoder.ts
  EXPECT_EQ(sdxl::vae_aoti_mismatch(c, "cuda", "fp16", "9.0"), "");
  EXPECT_NE(sdxl::vae_aoti_mismatch(c, "cuda", "fp32", "9.0")
                .find("vae_decoder.pt2 was compiled to decode in fp16, the VAE decodes in fp32 (--vae-dtype"),
            std::string::npos);
  EXPECT_NE(sdxl::vae_aoti_mismatch(c, "cpu", "fp16").find("compiled for cuda, the model runs on cpu"),
            std::string::npos);
  EXPECT_NE(sdxl::vae_aoti_mismatch(c, "cuda", "fp16", "8.9").find("compute capability 9.0"), std::string::npos);
  EXPECT_TRUE(sdxl::unet_aoti_mismatch(c, "cuda", "fp16").find("no unet.pt2") != std::string::npos);  // apart
  auto bad = j;
  bad["vae_decoder"]["aoti"]["latent_width"] = 96;
  EXPECT_NE(error_of(bad).find("/vae_decoder/aoti/latent_width must be [min, max]"), std::string::npos)
      << error_of(bad);
}

TEST(ModelConfig, Fp8PrecisionSwapsInTheFp8UnetAndItsPackage) {
  auto j = valid();
  const auto plain = sdxl::parse_model_config(j.dump(), "/m", "/m/model.json", false);
  EXPECT_TRUE(plain.unet_fp8.file.empty());  // model.json files from before --fp8 stay valid
  EXPECT_EQ(sdxl::with_unet_precision(plain, "default", "").unet_file, "unet.ts");
  try {
    sdxl::with_unet_precision(plain, "fp8", "");
    ADD_FAILURE() << "a model without unet.fp8 ran --precision fp8";
  } catch (const sdxl::ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("no FP8 UNet (model.json has no /unet/fp8); export it with "
                                         "scripts/export_sdxl.py --fp8"), std::string::npos) << e.what();
  }
  j["unet"]["fp8"] = nlohmann::json::parse(R"({"file": "unet_fp8.ts", "format": "e4m3fn", "layers": 158,
      "aoti": {"file": "unet_fp8.pt2", "device": "cuda", "dtype": "fp32", "rows": [1, 16], "tokens": [77, 308],
               "latent_height": [128, 128], "latent_width": [128, 128]}})");
  const auto both = sdxl::parse_model_config(j.dump(), "/m", "/m/model.json", false);
  EXPECT_EQ(both.unet_fp8.layers, 158);
  const auto fp8 = sdxl::with_unet_precision(both, "fp8", "fp32");
  EXPECT_EQ(fp8.unet_file, "unet_fp8.ts");
  EXPECT_EQ(fp8.unet_aoti.file, "unet_fp8.pt2");
  EXPECT_EQ(fp8.unet_precision, "fp8");
  std::string why;
  EXPECT_EQ(sdxl::resolve_unet_backend(fp8, "auto", "cuda", "fp32", &why), "aoti");
  EXPECT_NE(why.find("has a unet_fp8.pt2 for cuda fp32"), std::string::npos) << why;
  EXPECT_TRUE(both.unet_aoti.file.empty());  // the default precision keeps its own (absent) package
  EXPECT_NE(sdxl::unet_aoti_mismatch(sdxl::with_unet_precision(plain, "default", ""), "cuda", "fp32").find("--aoti"),
            std::string::npos);
  EXPECT_THROW(sdxl::with_unet_precision(both, "fp8", "bf16"), sdxl::UsageError);  // --dtype other than the model's
  EXPECT_THROW(sdxl::with_unet_precision(both, "int4", ""), sdxl::UsageError);
  auto bad = j;
  bad["unet"]["fp8"].erase("layers");
  EXPECT_NE(error_of(bad).find("/unet/fp8/layers is missing"), std::string::npos) << error_of(bad);
}

TEST(ModelConfig, HiddenStatesSetTheClipSkipLimit) {
  auto j = valid();  // exported before hidden_states(): only the default layer
  auto old = sdxl::parse_model_config(j.dump(), "/m", "/m/model.json", false);
  EXPECT_EQ(old.text_encoders.at(0).hidden_states, 0);
  EXPECT_EQ(sdxl::clip_skip_max(old), 2);
  EXPECT_NO_THROW(sdxl::check_clip_skip(old, 1));
  EXPECT_NO_THROW(sdxl::check_clip_skip(old, 2));
  try {
    sdxl::check_clip_skip(old, 3);
    ADD_FAILURE() << "clip skip 3 on a model without hidden states";
  } catch (const sdxl::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("export it again"), std::string::npos) << e.what();
  }

  j["text_encoders"][0]["hidden_states"] = 13;  // SDXL: CLIP-L 12 layers, bigG 32
  j["text_encoders"][1]["hidden_states"] = 33;
  auto c = sdxl::parse_model_config(j.dump(), "/m", "/m/model.json", false);
  EXPECT_EQ(c.text_encoders.at(1).hidden_states, 33);
  EXPECT_EQ(sdxl::clip_skip_max(c), 13);
  EXPECT_NO_THROW(sdxl::check_clip_skip(c, 13));
  EXPECT_THROW(sdxl::check_clip_skip(c, 0), sdxl::UsageError);
  try {
    sdxl::check_clip_skip(c, 14);
    ADD_FAILURE() << "clip skip 14 with 13 hidden states";
  } catch (const sdxl::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("clip skip 14 is outside what model 't' allows: 1..13"), std::string::npos)
        << e.what();
  }

  j["text_encoders"][1]["hidden_states"] = 1;
  EXPECT_NE(error_of(j).find("/text_encoders/1/hidden_states must be in [2, 4096], got 1"), std::string::npos)
      << error_of(j);
}

TEST(ModelConfig, SourceAndVaeFilesAreOptionalAndValidated) {
  auto c = sdxl::parse_model_config(valid().dump(), "/m", "/m/model.json", false);
  EXPECT_FALSE(c.source_file.recorded());
  EXPECT_FALSE(c.vae_file.recorded());

  const std::string sha = "31e35c80fc4829d14f90153f4c74cd59c90b779f6afe05a74cd6ffb4a5c2f1f0";
  auto j = valid();
  j["source_file"] = {{"name", "sd_xl_base_1.0.safetensors"}, {"sha256", sha}};
  j["vae_file"] = {{"name", "sdxl_vae.safetensors"}, {"sha256", std::string(64, 'b')}};
  c = sdxl::parse_model_config(j.dump(), "/m", "/m/model.json", false);
  EXPECT_EQ(c.source_file.name, "sd_xl_base_1.0.safetensors");
  EXPECT_EQ(c.source_file.short_hash(), "31e35c80fc");
  EXPECT_EQ(c.vae_file.short_hash(), "bbbbbbbbbb");

  auto bad = j;
  bad["source_file"]["sha256"] = std::string(64, 'A');
  EXPECT_NE(error_of(bad).find("/source_file/sha256 must be 64 lowercase hex digits"), std::string::npos)
      << error_of(bad);
  bad = j;
  bad["vae_file"]["sha256"] = sha.substr(0, 63);
  EXPECT_NE(error_of(bad).find("/vae_file/sha256 must be 64 lowercase hex digits"), std::string::npos) << error_of(bad);
  bad = j;
  bad["vae_file"].erase("name");
  EXPECT_NE(error_of(bad).find("/vae_file/name is missing"), std::string::npos) << error_of(bad);
  bad = j;
  bad["source_file"] = "sd_xl_base_1.0.safetensors";
  EXPECT_NE(error_of(bad).find("/source_file must be a JSON object"), std::string::npos) << error_of(bad);
}

// A VAE folder (export_sdxl.py --vae-only) reads as a VAE-only config, is told
// apart from a model either way round, and must fit the model's latents.
TEST(ModelConfig, VaeFolder) {
  nlohmann::json v = nlohmann::json::parse(R"({
    "format_version": 1, "kind": "vae", "name": "fp16-fix", "dtype": "fp16", "vae_dtype": "fp16",
    "export_device": "cuda", "vae_scaling_factor": 0.13025, "vae_downsample": 8, "latent_channels": 4,
    "vae_decoder": {"file": "vae_decoder.ts"}, "vae_encoder": {"file": "vae_encoder.ts"},
    "vae_file": {"name": "sdxl.vae.safetensors", "sha256": ")" + std::string(64, 'c') + R"("}})");
  const auto vae = sdxl::parse_vae_config(v.dump(), "/v", "/v/model.json", false);
  EXPECT_EQ(vae.architecture, "vae");
  EXPECT_EQ(vae.vae_dtype, "fp16");
  EXPECT_EQ(vae.vae_encoder_file, "vae_encoder.ts");
  EXPECT_EQ(vae.vae_file.short_hash(), "cccccccccc");
  const auto model = sdxl::parse_model_config(valid().dump(), "/m", "/m/model.json", false);
  EXPECT_NO_THROW(sdxl::check_vae_fits(vae, model));

  try {  // a VAE folder given as the model
    sdxl::parse_model_config(v.dump(), "/v", "/v/model.json", false);
    FAIL();
  } catch (const sdxl::ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("is a VAE folder"), std::string::npos) << e.what();
  }
  try {  // a model given as a VAE folder
    sdxl::parse_vae_config(valid().dump(), "/m", "/m/model.json", false);
    FAIL();
  } catch (const sdxl::ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("not a VAE folder"), std::string::npos) << e.what();
  }
  v["latent_channels"] = 16;  // an SD3 / Flux VAE's latents
  const auto other = sdxl::parse_vae_config(v.dump(), "/v", "/v/model.json", false);
  try {
    sdxl::check_vae_fits(other, model);
    FAIL();
  } catch (const sdxl::ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("16 latent channels"), std::string::npos) << e.what();
  }
  v.erase("vae_decoder");
  EXPECT_THROW(sdxl::parse_vae_config(v.dump(), "/v", "/v/model.json", false), sdxl::ModelError);
}

TEST(ModelConfig, ControlNetFolder) {
  const nlohmann::json control = {{"residuals", 3}, {"channels", {8, 8, 16, 16}}, {"downscales", {1, 1, 2, 2}}};
  nlohmann::json c = nlohmann::json::parse(R"({
    "format_version": 1, "kind": "controlnet", "name": "pose", "dtype": "fp16", "export_device": "cuda",
    "controlnet": {"file": "controlnet.ts", "in_channels": 4, "context_dim": 64, "pooled_dim": 32,
                   "cond_channels": 3, "downscale": 8},
    "source_file": {"name": "pose.safetensors", "sha256": ")" + std::string(64, 'd') + R"("}})");
  c["controlnet"].update(control);
  const auto cn = sdxl::parse_controlnet_config(c.dump(), "/c", "/c/model.json", false);
  EXPECT_EQ(cn.outputs.channels, (std::vector<int>{8, 8, 16, 16}));
  EXPECT_EQ(cn.short_hash(), "dddddddd");
  nlohmann::json m = valid();
  auto expect_unfit = [&](const std::string& why) {
    const auto model = sdxl::parse_model_config(m.dump(), "/m", "/m/model.json", false);
    try {
      sdxl::check_controlnet_fits(cn, model);
      FAIL() << why;
    } catch (const sdxl::ModelError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  expect_unfit("exported before ControlNet support");  // no /unet/control
  m["unet"]["control"] = control;
  EXPECT_NO_THROW(sdxl::check_controlnet_fits(cn, sdxl::parse_model_config(m.dump(), "/m", "/m/model.json", false)));
  m["unet"]["control"]["channels"] = {8, 8, 16, 32};
  expect_unfit("residuals whose channels");
  m["unet"]["control"] = control;
  m["unet"]["context_dim"] = 2048;  // an SD 1.x-width ControlNet would differ here the other way round
  m["text_encoders"][0]["hidden_dim"] = 768;
  m["text_encoders"][1]["hidden_dim"] = 1280;
  expect_unfit("text of width 64");
  try {  // a ControlNet folder given as the model
    sdxl::parse_model_config(c.dump(), "/c", "/c/model.json", false);
    FAIL();
  } catch (const sdxl::ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("is a ControlNet folder"), std::string::npos) << e.what();
  }
  EXPECT_THROW(sdxl::parse_controlnet_config(valid().dump(), "/m", "/m/model.json", false), sdxl::ModelError);
  c["controlnet"]["downscales"] = {1, 1, 2};  // one short of residuals + 1
  EXPECT_THROW(sdxl::parse_controlnet_config(c.dump(), "/c", "/c/model.json", false), sdxl::ModelError);
}

// controlnet.union: the type names and indices; a type is refused by name where
// the model lacks it (ProMax's tile on the 6-type model), on a plain ControlNet,
// and missing on a Union ControlNet.
TEST(ModelConfig, UnionControlNetTypes) {
  nlohmann::json c = nlohmann::json::parse(R"({
    "format_version": 1, "kind": "controlnet", "name": "union", "dtype": "fp16", "export_device": "cuda",
    "controlnet": {"file": "controlnet.ts", "in_channels": 4, "context_dim": 64, "pooled_dim": 32,
                   "cond_channels": 3, "downscale": 8, "residuals": 1, "channels": [8, 8], "downscales": [1, 1]}})");
  const auto plain = sdxl::parse_controlnet_config(c.dump(), "/p", "/p/model.json", false);
  EXPECT_FALSE(plain.is_union());
  EXPECT_EQ(sdxl::control_type_problem(plain, ""), "");
  EXPECT_NE(sdxl::control_type_problem(plain, "canny").find("is no Union ControlNet"), std::string::npos);
  c["controlnet"]["union"] = {{"num_control_type", 6},
                              {"types", {{"openpose", 0}, {"depth", 1}, {"canny", 3}, {"lineart", 3}}}};
  const auto cn = sdxl::parse_controlnet_config(c.dump(), "/u", "/u/model.json", false);
  EXPECT_TRUE(cn.is_union());
  EXPECT_EQ(cn.union_types.at("lineart"), 3);
  EXPECT_EQ(sdxl::control_type_problem(cn, "depth"), "");
  const std::string tile = sdxl::control_type_problem(cn, "tile");
  EXPECT_NE(tile.find("'tile': Union ControlNet '/u' has no such control type (it has canny, depth, lineart, openpose)"),
            std::string::npos) << tile;
  EXPECT_NE(sdxl::control_type_problem(cn, "").find("needs the control type"), std::string::npos);
  c["controlnet"]["union"]["types"]["tile"] = 6;  // an index past num_control_type
  EXPECT_THROW(sdxl::parse_controlnet_config(c.dump(), "/u", "/u/model.json", false), sdxl::ModelError);
  c["controlnet"]["union"]["types"] = nlohmann::json::object();
  EXPECT_THROW(sdxl::parse_controlnet_config(c.dump(), "/u", "/u/model.json", false), sdxl::ModelError);
}

TEST(ModelConfig, IpAdapterFolder) {
  nlohmann::json c = nlohmann::json::parse(R"({
    "format_version": 1, "kind": "ip_adapter", "name": "ip-adapter-plus_sdxl_vit-h", "variant": "plus",
    "dtype": "fp16", "export_device": "cuda",
    "image_encoder": {"file": "image_encoder.ts", "image_size": 224, "mean": [0.48145466, 0.4578275, 0.40821073],
                      "std": [0.26862954, 0.26130258, 0.27577711], "resample": "bicubic",
                      "output": "hidden_states[-2]", "negative": "zero_image"},
    "adapter": {"file": "ip_adapter.ts", "tokens": 16, "cross_attention_dim": 64, "layers": [32, 64, 64]},
    "source_file": {"name": "ip-adapter-plus_sdxl_vit-h.safetensors", "sha256": ")" + std::string(64, 'e') + R"("}})");
  const auto ip = sdxl::parse_ip_adapter_config(c.dump(), "/ip", "/ip/model.json", false);
  EXPECT_EQ(ip.variant, "plus");
  EXPECT_TRUE(ip.negative_zero_image);
  EXPECT_EQ(ip.tokens, 16);
  EXPECT_EQ(ip.layers, (std::vector<int>{32, 64, 64}));
  EXPECT_EQ(ip.short_hash(), "eeeeeeee");
  nlohmann::json m = valid();
  auto expect_unfit = [&](const std::string& why) {
    const auto model = sdxl::parse_model_config(m.dump(), "/m", "/m/model.json", false);
    try {
      sdxl::check_ip_adapter_fits(ip, model);
      FAIL() << why;
    } catch (const sdxl::ModelError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  expect_unfit("exported before IP-Adapter support");  // no /unet/ip_adapter
  m["unet"]["ip_adapter"] = {{"layers", {32, 64, 64}}, {"cross_attention_dim", 64}};
  EXPECT_NO_THROW(sdxl::check_ip_adapter_fits(ip, sdxl::parse_model_config(m.dump(), "/m", "/m/model.json", false)));
  m["unet"]["ip_adapter"]["layers"] = {32, 64};
  expect_unfit("cross-attention layers whose widths");
  m["unet"]["ip_adapter"] = {{"layers", {32, 64, 64}}, {"cross_attention_dim", 2048}};
  expect_unfit("another model family");
  try {  // an IP-Adapter folder given as the model
    sdxl::parse_model_config(c.dump(), "/ip", "/ip/model.json", false);
    FAIL();
  } catch (const sdxl::ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("is an IP-Adapter folder"), std::string::npos) << e.what();
  }
  EXPECT_THROW(sdxl::parse_ip_adapter_config(valid().dump(), "/m", "/m/model.json", false), sdxl::ModelError);
  for (const char* bad : {"/image_encoder/negative", "/image_encoder/std", "/adapter/layers", "/variant"}) {
    nlohmann::json b = c;
    b[nlohmann::json::json_pointer(bad)] = "x";
    try {
      sdxl::parse_ip_adapter_config(b.dump(), "/ip", "/ip/model.json", false);
      FAIL() << bad;
    } catch (const sdxl::ModelError& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(ModelConfig, TaskFolderFitsReadsEachFolderOnce) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("sdxl_fits_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "ip");
  std::ofstream(dir / "ip" / "image_encoder.ts") << "x";
  std::ofstream(dir / "ip" / "ip_adapter.ts") << "x";
  std::ofstream(dir / "ip" / "model.json") << R"({"format_version": 1, "kind": "ip_adapter", "name": "plus",
    "variant": "plus", "dtype": "fp16", "export_device": "cuda",
    "image_encoder": {"file": "image_encoder.ts", "image_size": 32, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5],
                      "resample": "bicubic", "output": "hidden_states[-2]", "negative": "zero_image"},
    "adapter": {"file": "ip_adapter.ts", "tokens": 16, "cross_attention_dim": 64, "layers": [32, 64]}})";
  nlohmann::json m = valid();
  m["unet"]["ip_adapter"] = {{"layers", {32, 64}}, {"cross_attention_dim", 64}};
  const auto model = sdxl::parse_model_config(m.dump(), "/m", "/m/model.json", false);
  sdxl::TaskFolderFits fits(model);
  EXPECT_NO_THROW(fits.ip_adapter((dir / "ip").string()));
  fs::remove(dir / "ip" / "model.json");
  EXPECT_NO_THROW(fits.ip_adapter((dir / "ip").string())) << "the folder was read and checked once";
  EXPECT_THROW(fits.controlnet((dir / "ip").string()), sdxl::ModelError) << "another kind is another check";
  sdxl::TaskFolderFits fresh(model);
  EXPECT_THROW(fresh.ip_adapter((dir / "ip").string()), sdxl::ModelError);
  EXPECT_THROW(fresh.ip_adapter((dir / "ip").string()), sdxl::ModelError) << "an error is kept too";
  fs::remove_all(dir);
}

TEST(ModelConfig, DetectorFolder) {
  nlohmann::json c = nlohmann::json::parse(R"({
    "format_version": 1, "kind": "detector", "name": "person_yolov8n-seg", "task": "segment",
    "classes": ["person"], "imgsz": [640, 640], "stride": 32, "mask_coefficients": 32,
    "ultralytics_version": "8.4.190", "dtype": "fp32", "export_device": "cpu",
    "detector": {"file": "detector.ts"},
    "source_file": {"name": "person_yolov8n-seg.pt", "sha256": ")" + std::string(64, 'f') + R"("}})");
  const auto d = sdxl::parse_detector_config(c.dump(), "/d", "/d/model.json", false);
  EXPECT_EQ(d.task, "segment");
  EXPECT_EQ(d.classes, (std::vector<std::string>{"person"}));
  EXPECT_EQ(d.imgsz_h, 640);
  EXPECT_EQ(d.mask_coefficients, 32);
  EXPECT_EQ(d.display_name(), "person_yolov8n-seg");
  auto expect_bad = [](const nlohmann::json& j, const std::string& why) {
    try {
      sdxl::parse_detector_config(j.dump(), "/d", "/d/model.json", false);
      FAIL() << why;
    } catch (const sdxl::ModelError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  nlohmann::json bad = c;
  bad["imgsz"] = {640, 630};  // not a multiple of the stride
  expect_bad(bad, "/imgsz");
  bad["imgsz"] = {4096, 4096};  // above the export's bound (a folder edited after its export)
  expect_bad(bad, "at most 2048");
  bad = c;
  bad["task"] = "pose";
  expect_bad(bad, "/task");
  bad = c;
  bad["kind"] = "upscaler";
  expect_bad(bad, "not a detector folder");
  try {  // a detector folder given as the model
    sdxl::parse_model_config(c.dump(), "/d", "/d/model.json", false);
    FAIL();
  } catch (const sdxl::ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("is a detector folder"), std::string::npos) << e.what();
  }
}

// Issue 61: v-prediction, zero-SNR and the model's guidance_rescale default are read; other values
// are refused at their pointer.
TEST(ModelConfig, PredictionSettings) {
  auto j = valid();
  j["scheduler"]["prediction_type"] = "v_prediction";
  j["scheduler"]["rescale_betas_zero_snr"] = true;
  j["defaults"]["guidance_rescale"] = 0.7;
  const sdxl::ModelConfig c = sdxl::parse_model_config(j.dump(), "/m", "/m/model.json", false);
  EXPECT_TRUE(c.scheduler.v_prediction());
  EXPECT_TRUE(c.scheduler.rescale_betas_zero_snr);
  EXPECT_DOUBLE_EQ(c.defaults.guidance_rescale, 0.7);
  const sdxl::ModelConfig e = sdxl::parse_model_config(valid().dump(), "/m", "/m/model.json", false);
  EXPECT_FALSE(e.scheduler.v_prediction());
  EXPECT_FALSE(e.scheduler.rescale_betas_zero_snr);
  EXPECT_DOUBLE_EQ(e.defaults.guidance_rescale, 0.0);

  j = valid();
  j["scheduler"]["prediction_type"] = "sample";
  EXPECT_NE(error_of(j).find("/scheduler/prediction_type is 'sample', expected one of: epsilon, v_prediction"),
            std::string::npos) << error_of(j);
  j = valid();
  j["scheduler"]["rescale_betas_zero_snr"] = "yes";
  EXPECT_NE(error_of(j).find("/scheduler/rescale_betas_zero_snr must be true or false"), std::string::npos) << error_of(j);
  j = valid();
  j["defaults"]["guidance_rescale"] = 1.5;
  EXPECT_NE(error_of(j).find("/defaults/guidance_rescale must be in"), std::string::npos) << error_of(j);
}
