#include "batch/output_names.h"

#include <cctype>
#include <unordered_map>

namespace sdxl {
namespace {

constexpr char kSeedMark = '\x01';  // stands for {seed}; a checked template holds no control character

// Every output name of a run uses the same date, so any fixed date compares names exactly.
constexpr const char* kAnyDate = "2000-01-01";

std::string fold_case(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// `marked` with every seed mark written as `seed`.
std::string with_seed(const std::string& marked, std::int64_t seed) {
  std::string out;
  for (char c : marked) out += c == kSeedMark ? std::to_string(seed) : std::string(1, c);
  return out;
}

// `marked` with every seed mark, and the digits next to it, written as '#':
// what is left is what a drawn seed cannot change.
std::string skeleton(const std::string& marked) {
  std::string out;
  for (size_t i = 0; i < marked.size(); ++i) {
    if (marked[i] != kSeedMark) {
      out.push_back(marked[i]);
      continue;
    }
    while (!out.empty() && (std::isdigit(static_cast<unsigned char>(out.back())) || out.back() == '#')) out.pop_back();
    out.push_back('#');
    while (i + 1 < marked.size() && std::isdigit(static_cast<unsigned char>(marked[i + 1]))) ++i;
  }
  return out;
}

struct Image {
  size_t task = 0;
  int index = 0;
};

std::string describe(const std::vector<BatchTask>& tasks, const std::vector<std::string>& pointers, const Image& im) {
  return "image " + std::to_string(im.index) + " of task '" + tasks[im.task].id + "' (" + pointers[im.task] + ")";
}

}  // namespace

std::vector<BatchProblem> output_name_collisions(const std::vector<BatchTask>& tasks,
                                                 const std::vector<std::string>& pointers, const std::string& tmpl) {
  std::string marked_tmpl = tmpl;
  for (size_t k = marked_tmpl.find("{seed}"); k != std::string::npos; k = marked_tmpl.find("{seed}", k + 1))
    marked_tmpl.replace(k, 6, std::string(1, kSeedMark));
  const bool seed_in_name = marked_tmpl.find(kSeedMark) != std::string::npos;
  const std::string hint = ": two images may not share a file (give the tasks ids that stay different in file "
                           "names, where characters outside [A-Za-z0-9._-] become '_' and case does not count, or "
                           "keep {id} and {index} in output.template)";
  std::unordered_map<std::string, Image> exact;      // name -> first image
  std::unordered_map<std::string, Image> skeletons;  // skeleton -> first image
  std::vector<BatchProblem> problems;
  for (size_t t = 0; t < tasks.size() && t < pointers.size(); ++t) {
    const BatchTask& task = tasks[t];
    for (int i = 0; i < task.count; ++i) {
      const std::string marked = fold_case(output_file_name(task, i, 0, marked_tmpl, kAnyDate));
      const Image im{t, i};
      std::string clash;
      if (!task.seed_random || !seed_in_name) {
        const std::string name = with_seed(marked, task.params.seed + i);
        const auto [it, fresh] = exact.try_emplace(name, im);
        if (!fresh && it->second.task != t)
          clash = "image " + std::to_string(i) + " would be written to '" +
                  output_file_name(task, i, task.params.seed + i, tmpl, "DATE") + "', as " +
                  describe(tasks, pointers, it->second) + " is" + hint;
      }
      if (clash.empty() && seed_in_name) {
        const auto [it, fresh] = skeletons.try_emplace(skeleton(marked), im);
        const bool random_either = task.seed_random || tasks[it->second.task].seed_random;
        if (!fresh && it->second.task != t && random_either)
          clash = "image " + std::to_string(i) + "'s file name differs from that of " +
                  describe(tasks, pointers, it->second) + " only in the seed, and " +
                  (task.seed_random ? "this task's" : "that task's") +
                  " seed is drawn at run time (-1), so both may get one file" + hint;
      }
      if (clash.empty()) continue;
      problems.push_back({pointers[t] + "/id", clash, 0});
      break;  // one problem per task
    }
  }
  return problems;
}

}  // namespace sdxl
