// Prompt editing and alternation in the UNet calls (text/prompt_schedule.h): each
// image's scheduled texts are encoded once (text stage); at each model call of a
// pass every row takes its own schedule's text for that call, so images that
// switch at different steps still share the call. The conditioning is rebuilt
// only when some row's text changes. Not thread-safe (one sub-batch's sampling).
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <vector>

#include "pipeline/text_encode.h"
#include "text/prompt_schedule.h"

namespace sdxl {

// One image's texts and schedules. `neg` holds one zero embedding (and
// neg_schedules one empty text) for an empty negative prompt under CFG.
struct ImageTextSteps {
  std::vector<PromptEmbeds> pos, neg;  // per distinct text, all of one chunk count
  PassSchedules pos_schedules, neg_schedules;
};

class StepConditioning {
 public:
  void add_image(ImageTextSteps image) { images_.push_back(std::move(image)); }
  bool on() const { return !images_.empty(); }
  // The context and pooled output of model call `call` (from 0) of pass `pass`
  // (0: first, 1: hires), rows [negatives (with CFG), positives]; returns false
  // (and leaves them) when every row's text is the one of the last call selected.
  bool select(size_t pass, int call, bool cfg, torch::Tensor& context, torch::Tensor& pooled);
  // Every embedding held (for a stream hand-over).
  std::vector<torch::Tensor> tensors() const;

 private:
  std::vector<ImageTextSteps> images_;
  std::vector<size_t> selected_;  // the texts of the last selection: negatives', then positives'
};

}  // namespace sdxl
