// image/resize.h vs PIL's Image.resize (goldens by tests/reference/gen_resize_goldens.py).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "image/resize.h"

namespace {

nlohmann::json load_goldens() {
  const char* dir = std::getenv("SDXL_FIXTURES_DIR");
  if (!dir) throw std::runtime_error("SDXL_FIXTURES_DIR is not set (run through ctest)");
  std::ifstream in(std::string(dir) + "/goldens/resize.json");
  if (!in) throw std::runtime_error(std::string("missing ") + dir + "/goldens/resize.json");
  return nlohmann::json::parse(in);
}

}  // namespace

TEST(Resize, EqualsPillowLanczosAndNearest) {
  const auto g = load_goldens();
  int checked = 0;
  for (const auto& c : g.at("cases")) {
    const auto in = c.at("input").get<std::vector<std::uint8_t>>();
    const auto want = c.at("output").get<std::vector<std::uint8_t>>();
    const int w = c.at("width"), h = c.at("height"), ow = c.at("out_width"), oh = c.at("out_height");
    const std::string filter = c.at("filter");
    const std::vector<std::uint8_t> got = filter == "lanczos" ? sdxl::resize_lanczos_rgb8(in.data(), w, h, ow, oh)
                                                              : sdxl::resize_nearest_rgb8(in.data(), w, h, ow, oh);
    ASSERT_EQ(got.size(), want.size()) << filter << " " << w << "x" << h << " -> " << ow << "x" << oh;
    size_t differing = 0;
    for (size_t i = 0; i < got.size(); ++i) differing += got[i] != want[i];
    EXPECT_EQ(differing, 0u) << filter << " " << w << "x" << h << " -> " << ow << "x" << oh << " (Pillow "
                             << g.at("pillow").get<std::string>() << ")";
    ++checked;
  }
  EXPECT_EQ(checked, 14);
}
