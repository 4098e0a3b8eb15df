#include "detect/detector.h"

#include <torch/torch.h>

#include <algorithm>
#include <string>

#include "core/error.h"
#include "detect/letterbox.h"
#include "detect/nms.h"
#include "device/device_errors.h"

namespace sdxl {

namespace {

using torch::indexing::Slice;

constexpr int kMaxNms = 30000;      // Ultralytics' max_nms
constexpr double kClassOffset = 7680;  // Ultralytics' max_wh: boxes of other classes never overlap

// The rows NMS keeps: [N, 4 + 1 + 1 + M] = xyxy (input pixels), score, class, mask coefficients.
torch::Tensor non_max_suppression(const torch::Tensor& pred, int nc, const DetectSettings& s) {
  const torch::Tensor p = pred.transpose(0, 1);  // [A, 4 + nc + M]
  const torch::Tensor candidates = p.index({Slice(), Slice(4, 4 + nc)}).amax(1) > s.confidence;
  torch::Tensor x = p.index({candidates});
  const torch::Tensor xy = x.index({Slice(), Slice(0, 2)}), half_wh = x.index({Slice(), Slice(2, 4)}) / 2;
  const torch::Tensor box = torch::cat({xy - half_wh, xy + half_wh}, 1);
  const auto [conf, cls] = x.index({Slice(), Slice(4, 4 + nc)}).max(1, /*keepdim=*/true);
  const torch::Tensor extra = x.index({Slice(), Slice(4 + nc, torch::indexing::None)});
  x = torch::cat({box, conf, cls.to(torch::kFloat32), extra}, 1).index({conf.view(-1) > s.confidence});
  if (x.size(0) > kMaxNms) x = x.index({x.index({Slice(), 4}).argsort(/*stable=*/false, 0, /*descending=*/true)
                                             .index({Slice(0, kMaxNms)})});
  const torch::Tensor shifted = (x.index({Slice(), Slice(0, 4)}) + x.index({Slice(), Slice(5, 6)}) * kClassOffset)
                                    .contiguous();
  const torch::Tensor scores = x.index({Slice(), 4}).contiguous();
  std::vector<NmsBox> boxes(static_cast<std::size_t>(x.size(0)));
  std::copy_n(shifted.data_ptr<float>(), shifted.numel(), reinterpret_cast<float*>(boxes.data()));
  const std::vector<float> sc(scores.data_ptr<float>(), scores.data_ptr<float>() + scores.numel());
  std::vector<std::int64_t> keep = nms(boxes, sc, s.iou);
  if (static_cast<int>(keep.size()) > s.max_det) keep.resize(static_cast<std::size_t>(s.max_det));
  return x.index({torch::tensor(keep, torch::kInt64)});
}

// Ultralytics' process_mask(upsample=True): [N, H, W] uint8 masks at the model's input size.
torch::Tensor process_mask(const torch::Tensor& protos, const torch::Tensor& coeffs, const torch::Tensor& boxes,
                           int64_t height, int64_t width) {
  const int64_t c = protos.size(0), mh = protos.size(1), mw = protos.size(2);
  torch::Tensor masks = coeffs.matmul(protos.to(torch::kFloat32).view({c, -1})).view({-1, mh, mw});
  namespace F = torch::nn::functional;
  masks = F::interpolate(masks.unsqueeze(0), F::InterpolateFuncOptions()
                                                 .size(std::vector<int64_t>{height, width})
                                                 .mode(torch::kBilinear)
                                                 .align_corners(false))[0];
  masks = masks.gt_(0.0).to(torch::kUInt8);
  // crop_mask: columns x1 <= c < x2, rows y1 <= r < y2 (float compares)
  const auto chunks = boxes.unsqueeze(2).chunk(4, 1);  // each [N, 1, 1]
  const torch::Tensor cols = torch::arange(width, torch::kFloat32).view({1, 1, -1});
  const torch::Tensor rows = torch::arange(height, torch::kFloat32).view({1, -1, 1});
  masks.mul_((cols >= chunks[0]).mul(cols < chunks[2]));
  masks.mul_((rows >= chunks[1]).mul(rows < chunks[3]));
  return masks;
}

// Ultralytics' scale_masks of one input-size mask to the image, > 0.5: [h, w] bool.
torch::Tensor mask_to_image(const torch::Tensor& mask, const LetterboxGeometry& g) {
  namespace F = torch::nn::functional;
  const torch::Tensor body = mask.index({Slice(g.top, g.top + g.new_h), Slice(g.left, g.left + g.new_w)});
  const torch::Tensor up = F::interpolate(body.to(torch::kFloat32).unsqueeze(0).unsqueeze(0),
                                          F::InterpolateFuncOptions()
                                              .size(std::vector<int64_t>{g.src_h, g.src_w})
                                              .mode(torch::kBilinear)
                                              .align_corners(false));
  return up[0][0] > 0.5;
}

// Ultralytics' scale_boxes (in place): padding removed, divided by the gain, clipped to the image.
void scale_boxes(torch::Tensor boxes, const LetterboxGeometry& g) {
  const double gain_x = static_cast<double>(g.new_w) / g.src_w, gain_y = static_cast<double>(g.new_h) / g.src_h;
  for (int k = 0; k < 4; ++k) {
    torch::Tensor col = boxes.select(1, k);
    col.sub_(k % 2 == 0 ? g.left : g.top).div_(k % 2 == 0 ? gain_x : gain_y);
    col.clamp_(0, k % 2 == 0 ? g.src_w : g.src_h);
  }
}

}  // namespace

Detector::Detector(const std::filesystem::path& dir, const torch::Device& device)
    : config_(load_detector_config(dir)), device_(device) {
  const auto path = dir / config_.file;
  try {
    module_ = torch::jit::load(path.string(), device);
  } catch (const c10::Error& e) {
    throw ModelError("detector '" + path.string() + "' does not load: " + e.what_without_backtrace());
  }
  module_.eval();
}

std::uint64_t Detector::weight_bytes() const {
  std::uint64_t n = 0;
  for (const at::Tensor& p : module_.parameters()) n += p.nbytes();
  for (const at::Tensor& b : module_.buffers()) n += b.nbytes();
  return n;
}

std::vector<Detection> Detector::detect(const std::uint8_t* rgb, int width, int height, const DetectSettings& s,
                                        bool keep_masks) {
  torch::InferenceMode guard;
  const LetterboxGeometry g = letterbox_geometry(width, height, config_.imgsz_w, config_.imgsz_h);
  std::vector<std::uint8_t> boxed = letterbox_rgb8(rgb, g);
  const torch::Tensor input = torch::from_blob(boxed.data(), {1, g.dst_h, g.dst_w, 3}, torch::kUInt8)
                                  .permute({0, 3, 1, 2})
                                  .to(device_)
                                  .to(torch::kFloat32)
                                  .div_(255);
  const torch::IValue out = translate_device_errors("detector", [&] { return module_.forward({input}); });
  const bool segment = config_.task == "segment";
  torch::Tensor pred, protos;
  if (out.isTuple()) {
    const auto& items = out.toTupleRef().elements();
    pred = items.at(0).toTensor();
    if (segment && items.size() > 1) protos = items.at(1).toTensor().to(torch::kCPU, torch::kFloat32)[0];
  } else {
    pred = out.toTensor();
  }
  pred = pred.to(torch::kCPU, torch::kFloat32)[0];
  const int nc = segment ? static_cast<int>(config_.classes.size()) : static_cast<int>(pred.size(0)) - 4;
  const int64_t want_rows = 4 + nc + (segment ? config_.mask_coefficients : 0);
  if (pred.dim() != 2 || pred.size(0) != want_rows || (segment && !protos.defined()))
    throw ModelError("detector '" + config_.dir.string() + "': the module's output does not fit its model.json (" +
                     std::to_string(pred.size(0)) + " rows per anchor, expected " + std::to_string(want_rows) + ")");
  torch::Tensor x = non_max_suppression(pred, nc, s);
  torch::Tensor masks;
  if (segment && x.size(0) > 0) {
    masks = process_mask(protos, x.index({Slice(), Slice(6, torch::indexing::None)}),
                         x.index({Slice(), Slice(0, 4)}), g.dst_h, g.dst_w);
    const torch::Tensor has_pixels = masks.amax({-2, -1}) > 0;  // Ultralytics drops detections without mask
    x = x.index({has_pixels});
    masks = masks.index({has_pixels});
  }
  torch::Tensor boxes = x.index({Slice(), Slice(0, 4)}).clone();
  scale_boxes(boxes, g);
  std::vector<Detection> result(static_cast<std::size_t>(x.size(0)));
  for (int64_t i = 0; i < x.size(0); ++i) {
    Detection& d = result[static_cast<std::size_t>(i)];
    d.x1 = boxes[i][0].item<float>();
    d.y1 = boxes[i][1].item<float>();
    d.x2 = boxes[i][2].item<float>();
    d.y2 = boxes[i][3].item<float>();
    d.score = x[i][4].item<float>();
    d.class_id = static_cast<int>(x[i][5].item<float>());
    if (!segment) continue;
    const torch::Tensor m = mask_to_image(masks[i], g);
    d.mask_area = m.sum().item<int64_t>();
    if (keep_masks) {
      const torch::Tensor u8 = m.to(torch::kUInt8).contiguous();
      d.mask.assign(u8.data_ptr<std::uint8_t>(), u8.data_ptr<std::uint8_t>() + u8.numel());
    }
  }
  return result;
}

}  // namespace sdxl
