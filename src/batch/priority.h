// A task's priority class as batch files write it ("priority": "high").
// torch-free, pure.
#pragma once

#include <optional>
#include <string>

namespace sdxl {

enum class Priority : int { kHigh = 0, kMid = 1, kLow = 2 };

const char* priority_name(Priority p);
// "high" | "mid" | "low" (also "medium", "normal" for mid). nullopt otherwise.
std::optional<Priority> parse_priority(const std::string& text);

}  // namespace sdxl
