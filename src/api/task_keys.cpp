// The public face of the task-key table (batch/task_keys.h): sdxl_batch::task_keys().
#include <sdxl_batch/sdxl_batch.h>

#include <algorithm>

#include "batch/task_keys.h"

namespace sdxl_batch {
namespace {

std::string split_name(sdxl::KeySplit s) {
  switch (s) {
    case sdxl::KeySplit::kNo: return "no";
    case sdxl::KeySplit::kValue: return "value";
    case sdxl::KeySplit::kPresence: return "presence";
    case sdxl::KeySplit::kParts: return "parts";
  }
  return "";
}

TaskKeyInfo info_of(const sdxl::TaskKey& k) {
  TaskKeyInfo i;
  i.name = k.name;
  i.type = sdxl::key_type_name(k.type);
  i.in_defaults = k.in_defaults();
  i.lo = k.lo;
  i.hi = k.hi;
  i.multiple_of = k.multiple_of;
  for (size_t start = 0; !k.choices.empty() && start <= k.choices.size();) {
    const size_t bar = std::min(k.choices.find('|', start), k.choices.size());
    i.choices.emplace_back(k.choices.substr(start, bar - start));
    start = bar + 1;
  }
  i.range = sdxl::key_range_text(k);
  i.default_text = k.default_text;
  i.a1111 = k.a1111;
  i.manifest = k.manifest;
  i.split = split_name(k.split);
  // Story keys remake an image through the prompt they change.
  i.remakes = k.compared && (k.plain() || k.hooks || k.part == sdxl::KeyPart::kStory);
  i.generate_flag = k.generate_flag;
  i.summary = k.summary;
  return i;
}

}  // namespace

std::vector<TaskKeyInfo> task_keys() {
  std::vector<TaskKeyInfo> out;
  for (const sdxl::TaskKey& k : sdxl::task_keys()) out.push_back(info_of(k));
  return out;
}

TaskKeyInfo task_key(const std::string& name) {
  if (const sdxl::TaskKey* k = sdxl::find_task_key(name)) return info_of(*k);
  throw UsageError("'" + name + "' is not a task key (sdxl-batch keys lists them)");
}

}  // namespace sdxl_batch
