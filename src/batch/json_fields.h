// Typed reads of a batch file's JSON values that collect problems at their JSON pointers instead of
// throwing, so a user fixes a file in one go. The batch file's parser (batch_file.cpp) and the video
// section's reader (video_spec.cpp) share them. torch-free.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "batch/batch_file.h"

namespace sdxl {

struct JsonFields {
  std::vector<BatchProblem>& problems;

  void add(const std::string& pointer, const std::string& msg) { problems.push_back({pointer, msg}); }
  // Each key of `obj` not in `allowed` is a problem ("unknown key (allowed here: ...)").
  void check_keys(const nlohmann::json& obj, const std::string& pointer, const std::set<std::string>& allowed);
  // obj[key] into `out` when present and of the type (and within lo..hi); false when absent or wrong (a
  // problem at pointer/key then).
  bool get_string(const nlohmann::json& obj, const std::string& pointer, const char* key, std::string& out);
  bool get_int(const nlohmann::json& obj, const std::string& pointer, const char* key, long long lo, long long hi,
               long long& out);
  bool get_number(const nlohmann::json& obj, const std::string& pointer, const char* key, double lo, double hi,
                  double& out);
};

}  // namespace sdxl
