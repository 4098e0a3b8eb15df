// What unit tests share: a fresh temporary folder removed afterwards, whole-file
// reads and writes, the message of what a call throws, and a batch file's problem at a pointer. Header-only; tests only.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "batch/batch_file.h"

namespace sdxl::testing {

// <tmp>/sdxl-<name>-<pid>, empty at the start, removed with everything in it at the end.
struct TempDir {
  std::filesystem::path root;
  explicit TempDir(const std::string& name)
      : root(std::filesystem::temp_directory_path() / ("sdxl-" + name + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(root);
    std::filesystem::create_directories(root);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void spit(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

// What f() throws (its what()), "" when it returns.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// The message of the first problem at `pointer` ("" when none).
inline std::string problem_at(const std::vector<BatchProblem>& ps, const std::string& pointer) {
  for (const auto& p : ps)
    if (p.pointer == pointer) return p.message;
  return "";
}

}  // namespace sdxl::testing
