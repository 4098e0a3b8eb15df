#include "batch/batch_strings.h"

#include "core/input_text.h"
#include "core/json_shape.h"

namespace sdxl {
namespace {

bool is_free_text(const std::string& key) { return key == "prompt" || key == "negative" || key == "notes"; }

void walk(const nlohmann::json& v, const std::string& pointer, TextKind kind, std::vector<BatchProblem>& problems) {
  if (v.is_string()) {
    if (const std::string why = text_problem(v.get_ref<const std::string&>(), kind); !why.empty())
      problems.push_back({pointer, why, 0});
  } else if (v.is_object()) {
    for (const auto& [key, child] : v.items()) {
      if (const std::string why = text_problem(key, TextKind::kName); !why.empty()) {
        problems.push_back({pointer, "a key " + why, 0});  // the key itself is not shown: it is not printable
        continue;
      }
      walk(child, pointer + "/" + escape_json_pointer(key), is_free_text(key) ? TextKind::kMultiline : TextKind::kName,
           problems);
    }
  } else if (v.is_array()) {
    for (size_t k = 0; k < v.size(); ++k) walk(v[k], pointer + "/" + std::to_string(k), TextKind::kName, problems);
  }
}

}  // namespace

void check_batch_strings(const nlohmann::json& j, std::vector<BatchProblem>& problems) {
  walk(j, "", TextKind::kName, problems);
}

}  // namespace sdxl
