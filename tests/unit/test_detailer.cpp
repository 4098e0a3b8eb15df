// The detailer's torch-free parts: the "detailer" key (parsing, checks, defaults), its PNG metadata,
// its masks (ADetailer's box, dilate / erode, k largest) and a region's inpainting pass.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "batch/batch_file.h"
#include "batch/manifest.h"
#include "check/batch_check.h"
#include "pipeline/detailer.h"
#include "scheduler/work_list.h"

namespace fs = std::filesystem;

namespace {

struct DetectorDir {
  fs::path dir = fs::temp_directory_path() / ("sdxl_detailer_" + std::to_string(::getpid()));
  std::string sha = std::string(64, 'c');
  DetectorDir() {
    fs::remove_all(dir);
    fs::create_directories(dir / "det" / "face");
    fs::create_directories(dir / "notdet");
    std::ofstream(dir / "det" / "face" / "detector.ts") << "0123456789";
    std::ofstream(dir / "det" / "face" / "model.json") << R"({"format_version": 1, "kind": "detector",
      "name": "face", "task": "detect", "classes": ["face"], "imgsz": [640, 640], "stride": 32,
      "ultralytics_version": "8.4.190", "dtype": "fp32", "export_device": "cpu",
      "files": {"detector.ts": {"bytes": 10, "sha256": ")" << sha << R"("}}, "detector": {"file": "detector.ts"}})";
    std::ofstream(dir / "notdet" / "model.json") << R"({"format_version": 1, "kind": "vae"})";
  }
  ~DetectorDir() { fs::remove_all(dir); }
  sdxl::BatchFile parse(const std::string& text, std::vector<sdxl::BatchProblem>& p) const {
    sdxl::FileInputChecks checks;
    return sdxl::parse_batch_text(text, dir / "b.json", sdxl::GenerationParams{}, &p, {}, &checks);
  }
};

const sdxl::BatchProblem* find(const std::vector<sdxl::BatchProblem>& ps, const std::string& pointer) {
  for (const auto& p : ps)
    if (p.pointer == pointer) return &p;
  return nullptr;
}

}  // namespace

TEST(Detailer, KeyReadWithAdetailersDefaultsFromDefaultsAndTasks) {
  DetectorDir d;
  std::vector<sdxl::BatchProblem> p;
  const auto bf = d.parse(R"({"version": 1,
      "defaults": {"detailer": [{"detector": "det/face"}]},
      "tasks": [{"id": "a", "prompt": "x"},
                {"id": "b", "prompt": "y", "detailer": [
                   {"detector": "det/face", "prompt": "[PROMPT], detailed face", "negative": "blurry",
                    "confidence": 0.5, "dilate": -8, "blur": 0, "denoise": 0.3, "padding": 64, "max": 2, "steps": 12},
                   {"detector": "det/face", "steps": null}]},
                {"id": "c", "prompt": "z", "detailer": null}]})",
                         p);
  ASSERT_TRUE(p.empty()) << p[0].pointer << " " << p[0].message;
  ASSERT_EQ(bf.tasks[0].params.detailer.size(), 1u);
  const sdxl::DetailerUse& a = bf.tasks[0].params.detailer[0];
  EXPECT_EQ(a.detector, (d.dir / "det" / "face").string()) << "relative to the batch file";
  EXPECT_EQ(a.weights_sha256, d.sha);
  EXPECT_EQ(a.confidence, 0.3);
  EXPECT_EQ(a.dilate, 4);
  EXPECT_EQ(a.blur, 4);
  EXPECT_EQ(a.denoise, 0.4);
  EXPECT_EQ(a.padding, 32);
  EXPECT_EQ(a.max, 0);
  EXPECT_EQ(a.steps, 0);
  ASSERT_EQ(bf.tasks[1].params.detailer.size(), 2u) << "a task's list replaces the defaults'";
  const sdxl::DetailerUse& b = bf.tasks[1].params.detailer[0];
  EXPECT_EQ(b.prompt, "[PROMPT], detailed face");
  EXPECT_EQ(b.negative, "blurry");
  EXPECT_EQ(b.confidence, 0.5);
  EXPECT_EQ(b.dilate, -8);
  EXPECT_EQ(b.blur, 0);
  EXPECT_EQ(b.denoise, 0.3);
  EXPECT_EQ(b.padding, 64);
  EXPECT_EQ(b.max, 2);
  EXPECT_EQ(b.steps, 12);
  EXPECT_EQ(bf.tasks[1].params.detailer[1].steps, 0) << "null: the task's steps";
  EXPECT_TRUE(bf.tasks[2].params.detailer.empty()) << "null turns the defaults' off";
}

TEST(Detailer, BadKeysAreRefusedNamingTheTask) {
  DetectorDir d;
  std::vector<sdxl::BatchProblem> p;
  d.parse(R"({"version": 1, "tasks": [
      {"id": "p1", "prompt": "x", "detailer": [{"detector": "det/none"}]},
      {"id": "p2", "prompt": "x", "detailer": [{"detector": "notdet"}]},
      {"id": "p3", "prompt": "x", "detailer": [{"prompt": "face"}]},
      {"id": "p4", "prompt": "x", "detailer": [{"detector": "det/face", "confidence": 0, "denoise": 1.5,
                                                "dilate": 200, "blur": -1, "padding": 300, "max": -1, "steps": 0}]},
      {"id": "p5", "prompt": "x", "detailer": {"detector": "det/face"}},
      {"id": "p6", "prompt": "x", "detailer": ["det/face"]},
      {"id": "p7", "prompt": "x", "detailer": [{"detector": "det/face", "strength": 0.5}]}]})",
          p);
  for (const auto* ptr : {"/tasks/0/detailer/0/detector", "/tasks/1/detailer/0/detector", "/tasks/2/detailer/0/detector",
                          "/tasks/3/detailer/0/confidence", "/tasks/3/detailer/0/denoise", "/tasks/3/detailer/0/dilate",
                          "/tasks/3/detailer/0/blur", "/tasks/3/detailer/0/padding", "/tasks/3/detailer/0/max",
                          "/tasks/3/detailer/0/steps", "/tasks/4/detailer", "/tasks/5/detailer/0",
                          "/tasks/6/detailer/0/strength"}) {
    const sdxl::BatchProblem* bp = find(p, ptr);
    ASSERT_NE(bp, nullptr) << ptr;
    const std::string id = "p" + std::to_string(std::stoi(std::string(ptr).substr(7)) + 1);
    EXPECT_NE(bp->message.find("(task '" + id + "')"), std::string::npos) << ptr << ": " << bp->message;
  }
  EXPECT_NE(find(p, "/tasks/1/detailer/0/detector")->message.find("not a detector folder"), std::string::npos)
      << find(p, "/tasks/1/detailer/0/detector")->message;
  EXPECT_NE(find(p, "/tasks/2/detailer/0/detector")->message.find("is missing"), std::string::npos);
  p.clear();
  d.parse(R"({"version": 1, "defaults": {"detailer": [{"detector": "det/none"}]}, "tasks": [{"id": "a", "prompt": "x"}]})",
          p);
  ASSERT_NE(find(p, "/defaults/detailer/0/detector"), nullptr) << "a defaults' problem is said at the defaults";
}

TEST(Detailer, PromptsAndUnitSuffixesAsAdetailerWritesThem) {
  EXPECT_EQ(sdxl::detailer_prompt("", "a cat"), "a cat");
  EXPECT_EQ(sdxl::detailer_prompt("[PROMPT], face, [PROMPT]", "a cat"), "a cat, face, a cat");
  EXPECT_EQ(sdxl::detailer_prompt("a face", "a cat"), "a face");
  EXPECT_EQ(sdxl::detailer_unit_suffix(0), "");
  EXPECT_EQ(sdxl::detailer_unit_suffix(1), " 2nd");
  EXPECT_EQ(sdxl::detailer_unit_suffix(2), " 3rd");
  EXPECT_EQ(sdxl::detailer_unit_suffix(3), " 4th");
  EXPECT_EQ(sdxl::detailer_unit_suffix(10), " 11th");
  EXPECT_EQ(sdxl::detailer_unit_suffix(20), " 21st");
}

TEST(Detailer, ParametersCarryAdetailersKeys) {
  sdxl::GenerationParams p;
  p.prompt = "a cat";
  sdxl::DetailerUse face;
  face.detector = "/m/det/face";
  sdxl::DetailerUse hand;
  hand.detector = "/m/det/hand";
  hand.prompt = "hand, detailed";
  hand.negative = "extra fingers";
  hand.max = 2;
  hand.steps = 12;
  p.detailer = {face, hand};
  sdxl::ImageSources src;
  src.model_name = "m";
  src.detailer_models = {"face_yolov8n.pt", "hand_yolov8n.pt"};
  const std::string s = sdxl::a1111_parameters(p, src);
  EXPECT_NE(s.find("ADetailer model: face_yolov8n.pt, ADetailer confidence: 0.3, ADetailer dilate erode: 4, "
                   "ADetailer mask blur: 4, ADetailer denoising strength: 0.4, ADetailer inpaint only masked: True, "
                   "ADetailer inpaint padding: 32, ADetailer model 2nd: hand_yolov8n.pt, ADetailer prompt 2nd: "
                   "\"hand, detailed\", ADetailer negative prompt 2nd: extra fingers, ADetailer confidence 2nd: 0.3, "
                   "ADetailer mask only top k largest 2nd: 2, ADetailer dilate erode 2nd: 4"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("ADetailer use separate steps 2nd: True, ADetailer steps 2nd: 12, Version: "), std::string::npos) << s;
  EXPECT_EQ(s.find("ADetailer prompt:"), std::string::npos) << "an empty prompt is not written";
}

TEST(Detailer, ManifestAndResumeCompareTheDetailer) {
  sdxl::GenerationParams p;
  sdxl::DetailerUse u;
  u.detector = "/m/det/face";
  u.weights_sha256 = std::string(64, 'a');
  u.denoise = 0.35;
  p.detailer = {u};
  sdxl::GenerationParams q = p;
  EXPECT_TRUE(sdxl::same_settings(p, q));
  q.detailer[0].denoise = 0.4;
  EXPECT_FALSE(sdxl::same_settings(p, q)) << "other settings make the image again";
  q = p;
  q.detailer[0].weights_sha256 = std::string(64, 'b');
  EXPECT_FALSE(sdxl::same_settings(p, q)) << "another detector export makes the image again";
  q = p;
  q.detailer.clear();
  EXPECT_FALSE(sdxl::same_settings(p, q));
}

TEST(Detailer, BoxMasksDilateAndErodeAsOpenCv) {
  // PIL's rectangle of (2.7, 1.2, 5.9, 3.5): columns 2..5, rows 1..3 (truncated, inclusive).
  sdxl::Detection det;
  det.x1 = 2.7f, det.y1 = 1.2f, det.x2 = 5.9f, det.y2 = 3.5f, det.score = 0.9f;
  sdxl::DetailerUse u;
  u.dilate = 0;
  auto r = sdxl::detailer_regions({det}, 10, 8, u);
  ASSERT_EQ(r.size(), 1u);
  auto at = [&](int x, int y) { return r[0].mask->rgb[3 * (y * 10 + x)]; };
  for (int y = 0; y < 8; ++y)
    for (int x = 0; x < 10; ++x) EXPECT_EQ(at(x, y), (x >= 2 && x <= 5 && y >= 1 && y <= 3) ? 255 : 0) << x << "," << y;
  // cv2.dilate with np.ones((4, 4)): anchor 2, so a pixel takes the maximum of [x - 2, x + 1]: [x1 - 1, x2 + 2].
  std::vector<std::uint8_t> m(10 * 8, 0);
  for (int y = 3; y <= 4; ++y)
    for (int x = 4; x <= 5; ++x) m[y * 10 + x] = 255;
  const auto dil = sdxl::dilate_erode_mask(m, 10, 8, 4);
  for (int y = 0; y < 8; ++y)
    for (int x = 0; x < 10; ++x)
      EXPECT_EQ(dil[y * 10 + x], (x >= 3 && x <= 7 && y >= 2 && y <= 6) ? 255 : 0) << x << "," << y;
  // cv2.erode of that with the same kernel (anchor 2 again): the minimum of [x - 2, x + 1], so the
  // box comes back one pixel right and down (columns 5..6, rows 4..5), as OpenCV gives it.
  const auto ero = sdxl::dilate_erode_mask(dil, 10, 8, -4);
  for (int y = 0; y < 8; ++y)
    for (int x = 0; x < 10; ++x)
      EXPECT_EQ(ero[y * 10 + x], (x >= 5 && x <= 6 && y >= 4 && y <= 5) ? 255 : 0) << x << "," << y;
  // Pixels outside the image are ignored: an all-white mask stays white when eroded.
  EXPECT_EQ(sdxl::dilate_erode_mask(std::vector<std::uint8_t>(80, 255), 10, 8, -4), std::vector<std::uint8_t>(80, 255));
  // Eroded to nothing: dropped. max: the largest boxes first.
  u.dilate = -20;
  EXPECT_TRUE(sdxl::detailer_regions({det}, 10, 8, u).empty());
  sdxl::Detection small = det, big = det;
  small.x1 = 0, small.x2 = 1;
  big.x1 = 0, big.x2 = 9;
  u.dilate = 4;
  u.max = 2;
  r = sdxl::detailer_regions({small, det, big}, 10, 8, u);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].x2, 9.0f);
  EXPECT_EQ(r[1].x1, 2.7f);
}

TEST(Detailer, RegionPassIsAnOnlyMaskedInpaintingWithTheRegionsSeed) {
  sdxl::GenerationParams img;
  img.prompt = "a cat";
  img.negative_prompt = "blurry";
  img.seed = 100;
  img.steps = 20;
  img.width = 64;
  img.height = 96;
  img.hires.scale = 2;
  img.upscale.model = "Lanczos";
  img.upscale.scale = 2;
  sdxl::DetailerUse u;
  u.detector = "/m/det/face";
  u.prompt = "[PROMPT], face";
  u.denoise = 0.35;
  u.blur = 6;
  u.padding = 16;
  auto init = std::make_shared<sdxl::PixelImage>(sdxl::PixelImage{128, 192, std::vector<std::uint8_t>(128 * 192 * 3)});
  auto mask = init;
  img.detailer = {u};
  const sdxl::GenerationParams p = sdxl::detailer_pass_params(img, u, 2, init, mask);
  EXPECT_EQ(p.prompt, "a cat, face");
  EXPECT_EQ(p.negative_prompt, "blurry");
  EXPECT_EQ(p.seed, 102);
  EXPECT_EQ(p.steps, 20);
  EXPECT_EQ(p.width, 128) << "the image's size (the hires pass's)";
  EXPECT_EQ(p.height, 192);
  EXPECT_TRUE(p.inpaint_masked());
  EXPECT_EQ(p.strength, 0.35);
  EXPECT_EQ(p.mask_blur, 6);
  EXPECT_EQ(p.inpaint_padding, 16);
  EXPECT_FALSE(p.hires_on());
  EXPECT_FALSE(p.upscale.on());
  EXPECT_TRUE(p.detailer.empty());
  EXPECT_EQ(sdxl::batch_group_key(p), sdxl::batch_group_key(sdxl::detailer_pass_params(img, u, 0, init, mask)))
      << "regions of the same settings share a UNet call";
}

TEST(Detailer, SegmentModelsMaskTheSegmentNotTheBox) {
  // A -seg detection's mask (image pixels) is the region, dilated like a box's.
  sdxl::Detection det;
  det.x1 = 0, det.y1 = 0, det.x2 = 9, det.y2 = 7, det.score = 0.8f;
  det.mask.assign(10 * 8, 0);
  det.mask[4 * 10 + 5] = 1;
  det.mask_area = 1;
  sdxl::DetailerUse u;
  u.dilate = 2;  // kernel 2 x 2, anchor 1: [x - 1, x] -> columns 5..6, rows 4..5
  const auto r = sdxl::detailer_regions({det}, 10, 8, u);
  ASSERT_EQ(r.size(), 1u);
  int white = 0;
  for (int y = 0; y < 8; ++y)
    for (int x = 0; x < 10; ++x) {
      const bool on = r[0].mask->rgb[3 * (y * 10 + x)] == 255;
      white += on;
      EXPECT_EQ(on, x >= 5 && x <= 6 && y >= 4 && y <= 5) << x << "," << y;
    }
  EXPECT_EQ(white, 4);
}
