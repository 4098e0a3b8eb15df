#include "scheduler/work_list.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <optional>

#include "batch/story.h"
#include "core/sha256.h"
#include "batch/lora_ref.h"

namespace sdxl {

namespace fs = std::filesystem;

std::string local_date() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool same_settings(const GenerationParams& a, const GenerationParams& b) {
  return a.prompt == b.prompt && a.negative_prompt == b.negative_prompt && a.seed == b.seed && a.steps == b.steps &&
         std::abs(a.cfg - b.cfg) < 1e-9 && a.width == b.width && a.height == b.height && a.sampler == b.sampler &&
         a.schedule == b.schedule && a.guidance_rescale == b.guidance_rescale && a.clip_skip == b.clip_skip &&
         a.init_image == b.init_image && (a.init_image.empty() || a.strength == b.strength) &&
         a.mask == b.mask && a.mask_sha256 == b.mask_sha256 &&
         (!a.inpaint() || (a.mask_blur == b.mask_blur && a.inpaint_area == b.inpaint_area &&
                           (!a.inpaint_masked() || a.inpaint_padding == b.inpaint_padding))) &&
         a.hires.scale == b.hires.scale &&
         (!a.hires_on() || (a.hires.upscaler == b.hires.upscaler && a.hires.steps == b.hires.steps &&
                            a.hires.denoise == b.hires.denoise && a.hires.weights_sha256 == b.hires.weights_sha256)) &&
         a.loras == b.loras && a.vae == b.vae && a.controlnets == b.controlnets && a.ip_adapter == b.ip_adapter &&
         a.upscale == b.upscale && a.detailer == b.detailer;
}

std::string image_label(const WorkItem& w) { return w.task->id + "#" + std::to_string(w.index); }

namespace {

// Whether image `index` of `task` is done: its manifest line has these
// settings and its file the recorded sha256. Adds it to `wl.skipped` then.
bool already_done(const BatchTask& task, const WorkItem& w, const Manifest& manifest, const fs::path& out_dir,
                  const std::string& unet_precision, WorkList& wl) {
  const auto e = manifest.find(task.id, w.index);
  if (!e || !same_settings(e->params, w.params) || e->unet_precision != unet_precision) return false;
  const auto sha = sha256_file_hex(out_dir / e->file);
  if (sha && *sha == e->sha256) {
    ++wl.skipped_count;
    wl.skipped.push_back({{"task", task.id}, {"index", w.index}, {"seed", e->seed}, {"file", e->file}});
    return true;
  }
  spdlog::info("{} #{}: {} is missing or changed since it was recorded; generating it again", task.id, w.index, e->file);
  return false;
}

}  // namespace

WorkList build_work(const BatchFile& batch, const WorkListOptions& o, const Manifest& manifest, const fs::path& out_dir,
                    const std::string& date, double start_unix) {
  WorkList wl;
  const WildcardLibrary lib(batch.wildcard_dirs);
  for (size_t pos = 0; pos < batch.tasks.size(); ++pos) {
    if (!in_shard(pos, o.shard_index, o.shard_count)) continue;
    const BatchTask& task = batch.tasks[pos];
    std::int64_t base = task.params.seed;
    if (task.seed_random) {
      const auto recorded = o.force ? std::nullopt : manifest.task_base_seed(task.id);
      base = recorded ? *recorded : random_seed();
      if (!recorded) wl.drawn_seeds.emplace_back(task.id, base);
    }
    const Priority prio = parse_priority(task.priority).value_or(Priority::kMid);
    const double deadline = task.deadline.empty() ? -1.0 : parse_deadline_unix(task.deadline, start_unix);
    for (int i = 0; i < task.count; ++i) {
      WorkItem w{&task, i, task.params, "", prio, deadline, 0, 0, {}, nullptr};
      w.params.seed = base + i;
      ImagePrompt ip = task_image_prompt(task, i, w.params.seed, lib);  // wildcards: from the seed, or "all"'s index
      w.params.prompt = std::move(ip.prompt);
      w.params.negative_prompt = std::move(ip.negative);
      w.wildcard_choices = std::move(ip.choices);
      w.file = output_file_name(task, i, w.params.seed, batch.name_template, date);
      ++wl.total;
      if (!o.force && already_done(task, w, manifest, out_dir, o.unet_precision, wl)) continue;
      wl.work.push_back(std::move(w));
    }
  }
  return wl;
}

TaskQueue make_queue(const std::vector<WorkItem>& work, const QueuePolicy& policy, double start_unix) {
  TaskQueue q(policy);
  for (size_t k = 0; k < work.size(); ++k) {
    QueuedImage qi;
    qi.handle = k;
    qi.priority = work[k].priority;
    qi.deadline_s = work[k].deadline_unix < 0 ? -1.0 : std::max(0.0, work[k].deadline_unix - start_unix);
    qi.group = batch_group_key(work[k].params);
    qi.lora_set = lora_set_key(work[k].params);
    q.push(qi);
  }
  return q;
}

namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

std::string lora_set_key(const GenerationParams& p) {
  std::string key;
  for (const auto& l : p.loras) key += l.path.string() + ":" + num(l.weight) + ";";
  for (const auto& t : extract_lora_tags(p.prompt).tags) key += "<" + t.name + ":" + num(t.weight) + ">;";
  return key;
}

std::string batch_group_key(const GenerationParams& p) {
  std::string key = std::to_string(p.width) + "x" + std::to_string(p.height) + "|" + std::to_string(p.steps) + "|" +
                    p.sampler + "|" + p.schedule + "|cfg" + num(p.cfg);
  if (p.guidance_rescale != 0) key += "|rescale" + num(p.guidance_rescale);
  if (!p.init_image.empty()) key += "|img2img" + num(p.strength);
  if (p.inpaint()) key += "|inpaint";  // each row brings its own mask and blur
  if (p.hires_on())
    key += "|hires" + num(p.hires.scale) + ":" + p.hires.upscaler + ":" + std::to_string(p.hires.steps) + ":" +
           num(p.hires.denoise);
  const std::string loras = lora_set_key(p);
  if (!loras.empty()) key += "|loras:" + loras;
  // ControlNets: the same models, strengths and windows (each image brings its own control image).
  for (const auto& c : p.controlnets)
    key += "|cn:" + c.model + ":" + num(c.strength) + ":" + num(c.start) + ":" + num(c.end);
  // An IP-Adapter: the same folder and reference count (one token row length);
  // images and scale are each image's own.
  if (p.ip_adapter.on()) key += "|ip:" + p.ip_adapter.model + ":" + std::to_string(p.ip_adapter.images.size());
  // A frame made by an upscaler model: a batch's memory estimate counts its tiles (side_modules_key).
  if (p.upscale.uses_model()) key += "|upscaler";
  return key;
}

}  // namespace sdxl
