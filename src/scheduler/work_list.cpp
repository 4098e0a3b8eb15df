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
      w.wildcard_choices = std::move(ip.choices);
      apply_image_prompt(std::move(ip), w.params);
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

}  // namespace sdxl
