#include "pipeline/detailer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

namespace sdxl {

namespace {

// One axis of the morphology: out[i] = max (or min) of in[i + d] for d in [-a, k - 1 - a] inside [0, n).
void morph_line(const std::uint8_t* in, std::uint8_t* out, int n, std::ptrdiff_t step, int k, bool dilate) {
  const int a = k / 2;
  for (int i = 0; i < n; ++i) {
    const int lo = std::max(0, i - a), hi = std::min(n - 1, i + k - 1 - a);
    std::uint8_t v = dilate ? 0 : 255;
    for (int t = lo; t <= hi; ++t) {
      const std::uint8_t x = in[t * step];
      v = dilate ? std::max(v, x) : std::min(v, x);
    }
    out[i * step] = v;
  }
}

// PIL's ImageDraw.rectangle(box, fill=255) on a black "L" image: corners truncated to int, inclusive.
std::vector<std::uint8_t> box_mask(const Detection& d, int width, int height) {
  std::vector<std::uint8_t> m(static_cast<size_t>(width) * height, 0);
  const int x0 = std::max(0, static_cast<int>(d.x1)), y0 = std::max(0, static_cast<int>(d.y1));
  const int x1 = std::min(width - 1, static_cast<int>(d.x2)), y1 = std::min(height - 1, static_cast<int>(d.y2));
  for (int y = y0; y <= y1; ++y)
    std::fill(m.begin() + static_cast<std::ptrdiff_t>(y) * width + x0,
              m.begin() + static_cast<std::ptrdiff_t>(y) * width + x1 + 1, 255);
  return m;
}

}  // namespace

std::vector<std::uint8_t> dilate_erode_mask(const std::vector<std::uint8_t>& mask, int width, int height, int value) {
  if (value == 0) return mask;
  const int k = std::abs(value);
  const bool dilate = value > 0;
  std::vector<std::uint8_t> rows(mask.size()), out(mask.size());
  for (int y = 0; y < height; ++y)
    morph_line(mask.data() + static_cast<size_t>(y) * width, rows.data() + static_cast<size_t>(y) * width, width, 1,
               k, dilate);
  for (int x = 0; x < width; ++x) morph_line(rows.data() + x, out.data() + x, height, width, k, dilate);
  return out;
}

std::vector<DetailerRegion> detailer_regions(const std::vector<Detection>& detections, int width, int height,
                                             const DetailerUse& unit) {
  // ADetailer's pred_preprocessing: the k largest boxes (largest first), then each mask dilated or
  // eroded and the ones left black dropped.
  std::vector<size_t> order(detections.size());
  std::iota(order.begin(), order.end(), 0);
  if (unit.max > 0 && static_cast<int>(order.size()) > unit.max) {
    const auto area = [&](size_t i) {
      return (detections[i].x2 - detections[i].x1) * (detections[i].y2 - detections[i].y1);
    };
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return area(a) > area(b); });
    order.resize(unit.max);
  }
  std::vector<DetailerRegion> regions;
  for (const size_t i : order) {
    const Detection& d = detections[i];
    std::vector<std::uint8_t> m;
    if (d.mask.size() == static_cast<size_t>(width) * height) {
      m.resize(d.mask.size());
      std::transform(d.mask.begin(), d.mask.end(), m.begin(), [](std::uint8_t v) { return v ? 255 : 0; });
    } else {
      m = box_mask(d, width, height);
    }
    m = dilate_erode_mask(m, width, height, unit.dilate);
    if (std::none_of(m.begin(), m.end(), [](std::uint8_t v) { return v != 0; })) continue;
    auto img = std::make_shared<PixelImage>();
    img->width = width;
    img->height = height;
    img->rgb.resize(m.size() * 3);
    for (size_t k = 0; k < m.size(); ++k) img->rgb[3 * k] = img->rgb[3 * k + 1] = img->rgb[3 * k + 2] = m[k];
    regions.push_back({d.x1, d.y1, d.x2, d.y2, d.score, d.class_id, std::move(img)});
  }
  return regions;
}

GenerationParams detailer_pass_params(const GenerationParams& image, const DetailerUse& unit, int j,
                                      std::shared_ptr<const PixelImage> init, std::shared_ptr<const PixelImage> mask) {
  GenerationParams p = image;
  p.prompt = detailer_prompt(unit.prompt, image.prompt);
  p.negative_prompt = detailer_prompt(unit.negative, image.negative_prompt);
  p.seed = image.seed + j;
  if (unit.steps > 0) p.steps = unit.steps;
  p.width = init->width;
  p.height = init->height;
  const std::string label = "detailer " + std::filesystem::path(unit.detector).filename().string() + " region " +
                            std::to_string(j);
  p.init_image = label;
  p.strength = unit.denoise;
  p.mask = label;
  p.mask_sha256.clear();
  p.mask_blur = unit.blur;
  p.inpaint_area = "masked";
  p.inpaint_padding = unit.padding;
  p.init_pixels = std::move(init);
  p.mask_pixels = std::move(mask);
  p.hires = GenerationParams::Hires{};
  p.controlnets.clear();
  p.ip_adapter = IpAdapterUse{};
  p.upscale = UpscaleUse{};
  p.detailer.clear();
  p.regions.clear();  // a region pass is its own crop: the panel's regions do not map onto it
  return p;
}

}  // namespace sdxl
