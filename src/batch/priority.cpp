#include "batch/priority.h"

namespace sdxl {

const char* priority_name(Priority p) {
  switch (p) {
    case Priority::kHigh: return "high";
    case Priority::kMid: return "mid";
    case Priority::kLow: return "low";
  }
  return "mid";
}

std::optional<Priority> parse_priority(const std::string& text) {
  if (text == "high") return Priority::kHigh;
  if (text == "mid" || text == "medium" || text == "normal") return Priority::kMid;
  if (text == "low") return Priority::kLow;
  return std::nullopt;
}

}  // namespace sdxl
