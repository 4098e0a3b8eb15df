// Limits on JSON read from users' files (batch files, model.json), checked
// before the document is built: a nesting depth (a file of tens of thousands
// of '[' must not exhaust the stack of anything that walks it) and duplicate
// keys in an object (JSON parsers silently keep the last one, so a setting
// written twice would be lost without a word). torch-free.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace sdxl {

inline constexpr int kMaxJsonDepth = 64;

struct JsonShape {
  bool too_deep = false;  // then the document must not be parsed further
  // (JSON pointer, message) for each duplicate key and for the depth.
  std::vector<std::pair<std::string, std::string>> problems;
};

// A key as a JSON pointer segment (RFC 6901: '~' -> "~0", '/' -> "~1").
std::string escape_json_pointer(const std::string& key);

// Scans `text` (stops at a syntax error: the parser reports that one).
JsonShape check_json_shape(const std::string& text, int max_depth = kMaxJsonDepth);

}  // namespace sdxl
