// control/clip_image.h vs transformers' CLIPImageProcessor (goldens by tests/reference/gen_resize_goldens.py).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "control/clip_image.h"

TEST(ClipImage, EqualsTransformersClipImageProcessor) {
  const char* dir = std::getenv("SDXL_FIXTURES_DIR");
  ASSERT_NE(dir, nullptr) << "SDXL_FIXTURES_DIR is not set (run through ctest)";
  std::ifstream in(std::string(dir) + "/goldens/resize.json");
  ASSERT_TRUE(in) << "missing goldens/resize.json";
  const auto g = nlohmann::json::parse(in);
  int checked = 0;
  for (const auto& c : g.at("clip")) {
    sdxl::RgbImage img;
    img.width = c.at("width");
    img.height = c.at("height");
    img.rgb = c.at("input").get<std::vector<std::uint8_t>>();
    const int size = c.at("size");
    const torch::Tensor got = sdxl::clip_image_tensor(img, size, c.at("mean").get<std::vector<double>>(),
                                                      c.at("std").get<std::vector<double>>());
    const auto want = c.at("pixel_values").get<std::vector<float>>();
    ASSERT_EQ(got.sizes(), (std::vector<std::int64_t>{1, 3, size, size}));
    const torch::Tensor w = torch::tensor(want).view({1, 3, size, size});
    EXPECT_EQ(got.sub(w).abs().max().item<float>(), 0.0f)
        << img.width << "x" << img.height << " -> " << size << " (transformers " << c.at("transformers") << ")";
    ++checked;
  }
  EXPECT_EQ(checked, 6);
}
