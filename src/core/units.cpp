#include "core/units.h"

#include <cctype>
#include <cmath>
#include <exception>

#include "core/error.h"

namespace sdxl {

std::pair<int, int> parse_shard(const std::string& text) {
  const size_t slash = text.find('/');
  try {
    if (slash != std::string::npos) {
      size_t a = 0, b = 0;
      const int k = std::stoi(text.substr(0, slash), &a);
      const int n = std::stoi(text.substr(slash + 1), &b);
      if (a == slash && b == text.size() - slash - 1 && n >= 1 && k >= 0 && k < n) return {k, n};
    }
  } catch (const std::exception&) {
  }
  throw UsageError("--shard '" + text + "': expected K/N with 0 <= K < N, e.g. 0/4 (K is the 0-based shard index)");
}

double parse_duration_s(const std::string& text) {
  const std::string hint = "duration '" + text + "': expected e.g. 90, 90s, 30m, 6h or 1h30m (finite, 0 or more)";
  double total = 0;
  size_t i = 0;
  bool any = false;
  while (i < text.size()) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(text.substr(i), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || !std::isfinite(v) || v < 0) throw UsageError(hint);  // stod reads "nan" and "inf" too
    i += used;
    double unit = 1;
    if (i < text.size()) {
      const char u = text[i];
      if (u == 's') unit = 1;
      else if (u == 'm') unit = 60;
      else if (u == 'h') unit = 3600;
      else throw UsageError("duration '" + text + "': unknown unit '" + std::string(1, u) + "' (use s, m or h)");
      ++i;
    }
    total += v * unit;
    any = true;
  }
  if (!any) throw UsageError("duration is empty: expected e.g. 90, 90s, 30m, 6h or 1h30m");
  if (!std::isfinite(total)) throw UsageError(hint + " (too large)");
  return total;
}

std::uint64_t parse_size_bytes(const std::string& text) {
  const std::string hint = "size '" + text + "': expected e.g. 24GiB, 12G, 800MiB or a number of bytes";
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw UsageError(hint);
  }
  if (used == 0 || !(v >= 0)) throw UsageError(hint);
  std::string unit = text.substr(used);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") mult = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib") mult = 1024.0 * 1024.0;
  else if (unit == "g" || unit == "gb" || unit == "gib") mult = 1024.0 * 1024.0 * 1024.0;
  else if (unit == "t" || unit == "tb" || unit == "tib") mult = 1024.0 * 1024.0 * 1024.0 * 1024.0;
  else throw UsageError(hint);
  const double bytes = v * mult;
  if (bytes > 1.8e19) throw UsageError(hint + " (too large)");
  return static_cast<std::uint64_t>(bytes);
}

}  // namespace sdxl
