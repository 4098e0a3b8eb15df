#include "core/input_text.h"

#include <cstdint>
#include <cstdio>

namespace sdxl {
namespace {

// Length of the valid UTF-8 sequence at `s[i]` and its code point, or 0 when
// the bytes there are not valid UTF-8 (RFC 3629: shortest form, no
// surrogates, at most U+10FFFF).
size_t utf8_at(std::string_view s, size_t i, std::uint32_t& cp) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  size_t n = 0;
  std::uint32_t min = 0;
  if ((c & 0xE0) == 0xC0) n = 2, cp = c & 0x1Fu, min = 0x80;
  else if ((c & 0xF0) == 0xE0) n = 3, cp = c & 0x0Fu, min = 0x800;
  else if ((c & 0xF8) == 0xF0) n = 4, cp = c & 0x07u, min = 0x10000;
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(k) & 0x3Fu);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

bool is_control(std::uint32_t cp) { return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F); }

bool allowed(std::uint32_t cp, TextKind kind) {
  if (!is_control(cp)) return true;
  if (cp == '\t') return kind != TextKind::kName;
  if (cp == '\n') return kind == TextKind::kMultiline;
  return false;
}

std::string code_name(std::uint32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "U+%04X", static_cast<unsigned>(cp));
  return buf;
}

}  // namespace

std::string text_problem(std::string_view text, TextKind kind) {
  for (size_t i = 0; i < text.size();) {
    std::uint32_t cp = 0;
    const size_t n = utf8_at(text, i, cp);
    if (n == 0) return "is not UTF-8 at byte " + std::to_string(i + 1) + " (save the file as UTF-8)";
    if (!allowed(cp, kind)) {
      const char* what = cp == '\n' ? "a line break" : cp == '\t' ? "a tab" : "a control character";
      return "has " + std::string(what) + " (" + code_name(cp) + ") at byte " + std::to_string(i + 1) +
             (cp == '\n' || cp == '\t' ? ", which this field may not hold" : " (not allowed in any text)");
    }
    i += n;
  }
  return "";
}

std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    std::uint32_t cp = 0;
    const size_t n = utf8_at(text, i, cp);
    if (n == 0) out += "\xEF\xBF\xBD";
    else out.append(text.substr(i, n));
    i += n == 0 ? 1 : n;
  }
  return out;
}

std::string clean_metadata_text(std::string_view text, bool keep_newlines) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    std::uint32_t cp = 0;
    const size_t n = utf8_at(text, i, cp);
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
      continue;
    }
    if (cp == '\r' && keep_newlines) {
      out.push_back('\n');
      i += (i + 1 < text.size() && text[i + 1] == '\n') ? 2 : 1;
      continue;
    }
    if (is_control(cp) && !(cp == '\n' && keep_newlines)) out.push_back(' ');
    else out.append(text.substr(i, n));
    i += n;
  }
  return out;
}

}  // namespace sdxl
