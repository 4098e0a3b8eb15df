#include "pipeline/prompt_steps.h"

namespace sdxl {

bool StepConditioning::select(size_t pass, int call, bool cfg, torch::Tensor& context, torch::Tensor& pooled) {
  std::vector<size_t> want;
  if (cfg)
    for (const ImageTextSteps& im : images_) want.push_back(im.neg_schedules.text_at(pass, call));
  for (const ImageTextSteps& im : images_) want.push_back(im.pos_schedules.text_at(pass, call));
  if (want == selected_) return false;
  std::vector<torch::Tensor> ctx, pool;
  size_t k = 0;
  if (cfg)
    for (const ImageTextSteps& im : images_) {
      ctx.push_back(im.neg[want[k]].context);
      pool.push_back(im.neg[want[k++]].pooled);
    }
  for (const ImageTextSteps& im : images_) {
    ctx.push_back(im.pos[want[k]].context);
    pool.push_back(im.pos[want[k++]].pooled);
  }
  context = torch::cat(ctx);
  pooled = torch::cat(pool);
  selected_ = std::move(want);
  return true;
}

std::vector<torch::Tensor> StepConditioning::tensors() const {
  std::vector<torch::Tensor> out;
  for (const ImageTextSteps& im : images_)
    for (const auto* list : {&im.pos, &im.neg})
      for (const PromptEmbeds& e : *list) {
        out.push_back(e.context);
        out.push_back(e.pooled);
      }
  return out;
}

}  // namespace sdxl
