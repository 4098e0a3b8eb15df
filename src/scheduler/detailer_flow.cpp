#include "scheduler/detailer_flow.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <utility>

#include "scheduler/image_finish.h"

namespace sdxl {

namespace {

// The next step of `prog` after its current state: the pass of its next region, or (no region left
// in any unit) the detailed image. Detectors run here for each unit reached.
DetailerOutcome next_step(DeviceLane& lane, const std::shared_ptr<DetailerProgress>& prog) {
  DetailerProgress& pr = *prog;
  const std::vector<DetailerUse>& units = pr.base.params.detailer;
  DetailerOutcome o;
  o.involved = true;
  while (pr.unit < 0 || pr.next >= static_cast<int>(pr.regions.size())) {
    if (++pr.unit >= static_cast<int>(units.size())) {
      finish_image(lane, pr.base.params, pr.job.image);
      pr.job.detailer = pr.boxes;
      o.done = std::move(pr.job);
      return o;
    }
    PixelImage now{pr.job.image.width, pr.job.image.height, pr.job.image.rgb};
    pr.regions = lane.detailer_regions(units[pr.unit], now, pr.model_name);
    pr.next = 0;
    if (pr.job.image.detailer_models.size() <= static_cast<size_t>(pr.unit))
      pr.job.image.detailer_models.resize(pr.unit + 1);
    pr.job.image.detailer_models[pr.unit] = pr.model_name;
    spdlog::debug("{}: detailer unit {} ({}) found {} region(s)", image_label(pr.base), pr.unit + 1, pr.model_name,
                  pr.regions.size());
  }
  const DetailerRegion& r = pr.regions[pr.next];
  auto init = std::make_shared<PixelImage>(PixelImage{pr.job.image.width, pr.job.image.height, pr.job.image.rgb});
  WorkItem pass = pr.base;
  pass.params = detailer_pass_params(pr.base.params, units[pr.unit], pr.next, std::move(init), r.mask);
  pass.attempts = 0;
  pass.not_before_s = 0;
  pass.detailer = prog;
  o.pass = std::move(pass);
  return o;
}

// The box of the region just passed, for the report.
nlohmann::json box_record(const DetailerProgress& pr) {
  const DetailerRegion& r = pr.regions[pr.next];
  return {{"unit", pr.unit}, {"detector", pr.model_name}, {"region", pr.next},
          {"box", {r.x1, r.y1, r.x2, r.y2}}, {"score", r.score}, {"class", r.class_id},
          {"image_width", pr.job.image.width}, {"image_height", pr.job.image.height}};
}

// Region pr.next's pass is done: its result (the image with the region pasted back) is the image now.
void absorb_pass(DetailerProgress& pr, std::vector<std::uint8_t> rgb, double generate_s) {
  pr.job.image.rgb = std::move(rgb);
  pr.job.generate_s += generate_s;
  pr.boxes.push_back(box_record(pr));
  ++pr.next;
}

}  // namespace

bool detailer_involved(const WorkItem& w) { return w.detailer != nullptr || !w.params.detailer.empty(); }

std::vector<DetailerOutcome> advance_detailers(DeviceLane& lane, const std::vector<WorkItem>& items,
                                               std::vector<WriteJob>& base) {
  std::vector<DetailerOutcome> out(items.size());
  for (size_t k = 0; k < items.size(); ++k) {
    const WorkItem& w = items[k];
    if (!detailer_involved(w)) continue;
    std::shared_ptr<DetailerProgress> prog = w.detailer;
    try {
      if (prog) {  // a region's pass: the image now holds it
        absorb_pass(*prog, std::move(base[k].image.rgb), base[k].generate_s);
      } else {  // the image itself: its first unit's detector runs on it
        prog = std::make_shared<DetailerProgress>();
        prog->base = w;
        prog->job = std::move(base[k]);
      }
      out[k] = next_step(lane, prog);
    } catch (const std::exception& e) {
      out[k].involved = true;
      out[k].error = std::string("detailer: ") + e.what();
    }
  }
  return out;
}

void observe_detailer_regions(WorkEstimator& est, const WriteJob& done) {
  const std::vector<DetailerUse>& units = done.item.params.detailer;
  for (size_t k = 0; k < units.size(); ++k) {
    const auto n = std::count_if(done.detailer.begin(), done.detailer.end(),
                                 [&](const nlohmann::json& b) { return b.value("unit", -1) == static_cast<int>(k); });
    est.observe_detailer_regions(units[k].detector, static_cast<int>(n));
  }
}

void queue_detailer_pass(RunState& run, WorkItem pass) {
  QueuedImage q;
  q.handle = run.work.size();
  q.priority = pass.priority;
  q.deadline_s = pass.deadline_unix < 0 ? -1.0 : std::max(0.0, pass.deadline_unix - run.start_unix);
  q.group = batch_group_key(pass.params);
  q.lora_set = lora_set_key(pass.params);
  q.enqueued_s = run.elapsed();
  run.work.push_back(std::move(pass));
  run.queue.push(q);
}

GeneratedImage detail_image(DeviceLane& lane, const GenerationParams& params, GeneratedImage image,
                            nlohmann::json* boxes) {
  BatchTask task;  // the logs' label ("generate#0")
  task.id = "generate";
  auto prog = std::make_shared<DetailerProgress>();
  prog->base.task = &task;
  prog->base.params = params;
  prog->job.image = std::move(image);
  for (;;) {
    DetailerOutcome o = next_step(lane, prog);
    if (o.done) {
      if (boxes) *boxes = std::move(o.done->detailer);
      return std::move(o.done->image);
    }
    // The pass alone, through the three stages as a batch of one (a run's at --max-batch 1).
    std::vector<GeneratedImage> made = lane.decode(lane.sample(lane.encode({o.pass->params}), {}));
    const StageSeconds st = made.front().seconds;
    absorb_pass(*prog, std::move(made.front().rgb), st.text + st.sample + st.decode);
  }
}

}  // namespace sdxl
