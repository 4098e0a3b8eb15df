// Port of stable-diffusion-webui modules/prompt_parser.py parse_prompt_attention.
// A1111 runs two Python regexes over the prompt:
//   re_attention  \\\( | \\\) | \\\[ | \\] | \\\\ | \\ | \( | \[ |
//                 :\s*([+-]?[.\d]+)\s*\) | \) | ] | [^\\()\[\]:]+ | :
//   re_break      \s*\bBREAK\b\s*     (split of every literal match)
// This file scans the same alternatives by hand, over code points, with
// Python's Unicode classes for \s, \d and \w (\b). Keep it in step with
// tests/reference/prompt_reference.py: the goldens compare the two.
#include "text/prompt_parser.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <span>
#include <utility>

#include "text/unicode_data.h"

namespace sdxl {
namespace {

namespace ud = unicode_data;

constexpr char32_t kInvalid = 0x110000;  // an undecodable byte: no class matches it
constexpr double kRoundMultiplier = 1.1;
constexpr double kSquareMultiplier = 1 / 1.1;
constexpr double kFloatMax = std::numeric_limits<float>::max();
constexpr size_t kNone = static_cast<size_t>(-1);

// Python 3.11 (Unicode 14) decimal digits, category Nd: \d of a str regex and
// what float() accepts. Every run is whole blocks of ten, 0..9 in order.
constexpr ud::Range kDecimalDigits[] = {
    {0x30, 0x39},       {0x660, 0x669},     {0x6F0, 0x6F9},     {0x7C0, 0x7C9},     {0x966, 0x96F},
    {0x9E6, 0x9EF},     {0xA66, 0xA6F},     {0xAE6, 0xAEF},     {0xB66, 0xB6F},     {0xBE6, 0xBEF},
    {0xC66, 0xC6F},     {0xCE6, 0xCEF},     {0xD66, 0xD6F},     {0xDE6, 0xDEF},     {0xE50, 0xE59},
    {0xED0, 0xED9},     {0xF20, 0xF29},     {0x1040, 0x1049},   {0x1090, 0x1099},   {0x17E0, 0x17E9},
    {0x1810, 0x1819},   {0x1946, 0x194F},   {0x19D0, 0x19D9},   {0x1A80, 0x1A89},   {0x1A90, 0x1A99},
    {0x1B50, 0x1B59},   {0x1BB0, 0x1BB9},   {0x1C40, 0x1C49},   {0x1C50, 0x1C59},   {0xA620, 0xA629},
    {0xA8D0, 0xA8D9},   {0xA900, 0xA909},   {0xA9D0, 0xA9D9},   {0xA9F0, 0xA9F9},   {0xAA50, 0xAA59},
    {0xABF0, 0xABF9},   {0xFF10, 0xFF19},   {0x104A0, 0x104A9}, {0x10D30, 0x10D39}, {0x11066, 0x1106F},
    {0x110F0, 0x110F9}, {0x11136, 0x1113F}, {0x111D0, 0x111D9}, {0x112F0, 0x112F9}, {0x11450, 0x11459},
    {0x114D0, 0x114D9}, {0x11650, 0x11659}, {0x116C0, 0x116C9}, {0x11730, 0x11739}, {0x118E0, 0x118E9},
    {0x11950, 0x11959}, {0x11C50, 0x11C59}, {0x11D50, 0x11D59}, {0x11DA0, 0x11DA9}, {0x16A60, 0x16A69},
    {0x16AC0, 0x16AC9}, {0x16B50, 0x16B59}, {0x1D7CE, 0x1D7FF}, {0x1E140, 0x1E149}, {0x1E2F0, 0x1E2F9},
    {0x1E950, 0x1E959}, {0x1FBF0, 0x1FBF9},
};

const ud::Range* find_range(std::span<const ud::Range> ranges, char32_t cp) {
  auto it =
      std::upper_bound(ranges.begin(), ranges.end(), cp, [](char32_t c, const ud::Range& r) { return c < r.first; });
  if (it == ranges.begin() || cp > std::prev(it)->last) return nullptr;
  return &*std::prev(it);
}

// Python's \s for str patterns (str.isspace).
bool py_space(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= '\t' && cp <= '\r') || (cp >= 0x1C && cp <= 0x1F);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Python's \w for str patterns: str.isalnum() or '_'. Outside ASCII this is
// \p{L} | \p{N} of the tokenizer's tables (a newer Unicode than Python 3.11's:
// they differ only on code points assigned since Unicode 14).
bool py_word(char32_t cp) {
  if (cp < 0x80) return cp == '_' || (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
  return find_range(ud::kLetters, cp) != nullptr || find_range(ud::kNumbers, cp) != nullptr;
}

// Value of a decimal digit (\d), or -1.
int py_digit(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9' ? static_cast<int>(cp - '0') : -1;
  const ud::Range* r = find_range(kDecimalDigits, cp);
  return r == nullptr ? -1 : static_cast<int>((cp - r->first) % 10);
}

bool is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

// Strict UTF-8 decoding; an invalid byte becomes one kInvalid code point.
void decode_utf8(std::string_view s, std::vector<char32_t>& cps, std::vector<size_t>& offsets) {
  cps.clear();
  offsets.clear();
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    auto at = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0; };
    char32_t cp = kInvalid;
    size_t len = 1;
    if (b0 < 0x80) {
      cp = b0;
    } else if (b0 >= 0xC2 && b0 <= 0xDF && is_cont(at(1))) {
      cp = ((b0 & 0x1Fu) << 6) | (at(1) & 0x3Fu);
      len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      const unsigned char lo = b0 == 0xE0 ? 0xA0 : 0x80;
      const unsigned char hi = b0 == 0xED ? 0x9F : 0xBF;
      if (at(1) >= lo && at(1) <= hi && is_cont(at(2))) {
        cp = ((b0 & 0x0Fu) << 12) | ((at(1) & 0x3Fu) << 6) | (at(2) & 0x3Fu);
        len = 3;
      }
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      const unsigned char lo = b0 == 0xF0 ? 0x90 : 0x80;
      const unsigned char hi = b0 == 0xF4 ? 0x8F : 0xBF;
      if (at(1) >= lo && at(1) <= hi && is_cont(at(2)) && is_cont(at(3))) {
        cp = ((b0 & 0x07u) << 18) | ((at(1) & 0x3Fu) << 12) | ((at(2) & 0x3Fu) << 6) | (at(3) & 0x3Fu);
        len = 4;
      }
    }
    cps.push_back(cp);
    offsets.push_back(i);
    i += len;
  }
  offsets.push_back(s.size());
}

struct Entry {
  std::string text;
  double weight;
};

struct OpenBracket {
  size_t entry;     // index into the entries where its range starts
  size_t position;  // code point of the bracket
};

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) { decode_utf8(text, cps_, offsets_); }

  std::vector<PromptFragment> run(std::vector<PromptWarning>* warnings) {
    const size_t n = cps_.size();
    size_t i = 0;
    while (i < n) i = step(i);

    for (const OpenBracket& b : round_) {
      warn(b.position, "unclosed '(' (x1.1 applied to the rest)");
      multiply_range(b.entry, kRoundMultiplier, b.position);
    }
    for (const OpenBracket& b : square_) {
      warn(b.position, "unclosed '[' (/1.1 applied to the rest)");
      multiply_range(b.entry, kSquareMultiplier, b.position);
    }
    for (const auto& [index, position] : breaks_) {
      if (res_[index].weight != -1)
        warn(position, "BREAK inside brackets is read as the word 'BREAK', not a chunk break");
    }
    if (res_.empty()) res_.push_back({"", 1.0});

    // Merge runs of identical weights (A1111 pops res[i + 1] into res[i]; same result).
    std::vector<PromptFragment> out;
    for (Entry& e : res_) {
      if (!out.empty() && out.back().weight == e.weight) {
        out.back().text += e.text;
      } else {
        out.push_back({std::move(e.text), e.weight, false});
      }
    }
    for (PromptFragment& f : out) f.is_break = f.text == "BREAK" && f.weight == -1;

    if (warnings != nullptr) {
      std::stable_sort(warnings_.begin(), warnings_.end(),
                       [](const PromptWarning& a, const PromptWarning& b) { return a.position < b.position; });
      warnings->insert(warnings->end(), std::make_move_iterator(warnings_.begin()),
                       std::make_move_iterator(warnings_.end()));
    }
    return out;
  }

 private:
  // Handles the re_attention match at code point i; returns where the next begins.
  size_t step(size_t i) {
    const size_t n = cps_.size();
    const char32_t c = cps_[i];
    if (c == '\\') {
      if (i + 1 < n && (cps_[i + 1] == '(' || cps_[i + 1] == ')' || cps_[i + 1] == '[' || cps_[i + 1] == ']' ||
                        cps_[i + 1] == '\\')) {
        res_.push_back({std::string(1, static_cast<char>(cps_[i + 1])), 1.0});
        return i + 2;
      }
      warn(i, "stray '\\' dropped (it escapes only ( ) [ ] \\)");
      res_.push_back({"", 1.0});
      return i + 1;
    }
    if (c == '(') {
      round_.push_back({res_.size(), i});
      return i + 1;
    }
    if (c == '[') {
      square_.push_back({res_.size(), i});
      return i + 1;
    }
    if (c == ':') {
      size_t group_begin = 0;
      size_t group_end = 0;
      const size_t end = match_weight(i, group_begin, group_end);
      if (end == kNone) {
        append_text(i, i + 1);
        return i + 1;
      }
      const double weight = parse_weight(group_begin, group_end);
      if (!round_.empty() && !std::isnan(weight)) {
        multiply_range(round_.back().entry, weight, i);
        round_.pop_back();
      } else if (round_.empty()) {
        warn(i, "weight '" + shown(i, end) + "' closes no '(' (kept as text)");
        append_text(i, end);
      } else {
        warn(i, "weight '" + shown(group_begin, group_end) + "' is not a usable number (kept as text)");
        append_text(i, end);
      }
      return end;
    }
    if (c == ')') {
      if (!round_.empty()) {
        multiply_range(round_.back().entry, kRoundMultiplier, i);
        round_.pop_back();
      } else {
        warn(i, "unmatched ')' (kept as text)");
        append_text(i, i + 1);
      }
      return i + 1;
    }
    if (c == ']') {
      if (!square_.empty()) {
        multiply_range(square_.back().entry, kSquareMultiplier, i);
        square_.pop_back();
      } else {
        warn(i, "unmatched ']' (kept as text)");
        append_text(i, i + 1);
      }
      return i + 1;
    }
    size_t j = i;
    while (j < n && !is_syntax(cps_[j])) ++j;
    append_text(i, j);
    return j;
  }

  static bool is_syntax(char32_t c) { return c == '\\' || c == '(' || c == ')' || c == '[' || c == ']' || c == ':'; }

  // :\s*([+-]?[.\d]+)\s*\) at i (a ':'): the end of the match and the group, or kNone.
  size_t match_weight(size_t i, size_t& group_begin, size_t& group_end) const {
    const size_t n = cps_.size();
    size_t k = i + 1;
    while (k < n && py_space(cps_[k])) ++k;
    group_begin = k;
    if (k < n && (cps_[k] == '+' || cps_[k] == '-')) ++k;
    const size_t digits = k;
    while (k < n && (cps_[k] == '.' || py_digit(cps_[k]) >= 0)) ++k;
    if (k == digits) return kNone;
    group_end = k;
    while (k < n && py_space(cps_[k])) ++k;
    if (k >= n || cps_[k] != ')') return kNone;
    return k + 1;
  }

  // float(group) as Python reads it; NaN where that raises or leaves the float32 range.
  double parse_weight(size_t begin, size_t end) const {
    std::string ascii;
    bool negative = false;
    size_t k = begin;
    if (cps_[k] == '+' || cps_[k] == '-') negative = cps_[k++] == '-';
    size_t dots = 0;
    size_t digits = 0;
    bool nonzero_integer_part = false;
    for (; k < end; ++k) {
      if (cps_[k] == '.') {
        ++dots;
        ascii.push_back('.');
      } else {
        const int d = py_digit(cps_[k]);
        ++digits;
        if (dots == 0 && d != 0) nonzero_integer_part = true;
        ascii.push_back(static_cast<char>('0' + d));
      }
    }
    constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
    if (dots > 1 || digits == 0) return kNan;  // float("1.2.3"), float(".") raise
    double value = 0;
    const auto [ptr, ec] = std::from_chars(ascii.data(), ascii.data() + ascii.size(), value);
    if (ec == std::errc::result_out_of_range) {
      if (nonzero_integer_part) return kNan;  // Python gives inf
      value = 0;                              // underflow: Python gives 0.0
    } else if (ec != std::errc() || ptr != ascii.data() + ascii.size()) {
      return kNan;
    }
    if (std::fabs(value) > kFloatMax) return kNan;
    return negative ? -value : value;
  }

  // A literal match [begin, end): re.split(re_break, text), a BREAK entry between parts.
  void append_text(size_t begin, size_t end) {
    size_t part = begin;
    size_t i = begin;
    while (i < end) {
      size_t j = i;
      while (j < end && py_space(cps_[j])) ++j;
      const bool match = j + 5 <= end && cps_[j] == 'B' && cps_[j + 1] == 'R' && cps_[j + 2] == 'E' &&
                         cps_[j + 3] == 'A' && cps_[j + 4] == 'K' && (j == begin || !py_word(cps_[j - 1])) &&
                         (j + 5 == end || !py_word(cps_[j + 5]));
      if (!match) {
        // Every start inside a run of spaces reaches the same j, and j itself fails too.
        i = j + 1;
        continue;
      }
      size_t k = j + 5;
      while (k < end && py_space(cps_[k])) ++k;
      res_.push_back({slice(part, i), 1.0});
      breaks_.emplace_back(res_.size(), j);
      res_.push_back({"BREAK", -1.0});
      part = k;
      i = k;
    }
    res_.push_back({slice(part, end), 1.0});
  }

  void multiply_range(size_t start, double multiplier, size_t position) {
    bool clamped = false;
    for (size_t p = start; p < res_.size(); ++p) {
      double w = res_[p].weight * multiplier;
      if (std::fabs(w) > kFloatMax) {
        w = w > 0 ? kFloatMax : -kFloatMax;
        clamped = true;
      }
      res_[p].weight = w;
    }
    if (clamped && !clamped_before_) {  // said once per prompt
      warn(position, "emphasis weight exceeds the float range, clamped");
      clamped_before_ = true;
    }
  }

  std::string slice(size_t begin, size_t end) const {
    return std::string(text_.substr(offsets_[begin], offsets_[end] - offsets_[begin]));
  }

  // The text of [begin, end) for a message, cut to 20 code points + "..." past 24.
  std::string shown(size_t begin, size_t end) const {
    if (end - begin <= 24) return slice(begin, end);
    return slice(begin, begin + 20) + "...";
  }

  void warn(size_t position, std::string message) { warnings_.push_back({position, std::move(message)}); }

  std::string_view text_;
  std::vector<char32_t> cps_;
  std::vector<size_t> offsets_;  // byte offset of each code point, plus the end
  std::vector<Entry> res_;
  std::vector<OpenBracket> round_;
  std::vector<OpenBracket> square_;
  std::vector<std::pair<size_t, size_t>> breaks_;  // (entry of a BREAK, code point of the word)
  std::vector<PromptWarning> warnings_;
  bool clamped_before_ = false;
};

}  // namespace

std::vector<PromptFragment> parse_prompt_attention(std::string_view text, std::vector<PromptWarning>* warnings) {
  return Parser(text).run(warnings);
}

}  // namespace sdxl
