// A1111's schedule grammar (modules/prompt_parser.py), read by hand:
//   start:      (prompt | /[][():]/+)*
//   prompt:     (emphasized | scheduled | alternate | plain | WHITESPACE)*
//   emphasized: "(" prompt ")" | "(" prompt ":" prompt ")" | "[" prompt "]"
//   scheduled:  "[" [prompt ":"] prompt ":" [WHITESPACE] NUMBER [WHITESPACE] "]"
//   alternate:  "[" prompt ("|" [prompt])+ "]"
//   plain:      /([^\\\[\]():|]|\\.)+/        NUMBER: lark's SIGNED_NUMBER
// A group's extent is unique (its prompt stops at the first ':', '|', ']' or ')'
// of its own level), and the three square forms differ by what follows the
// first prompt (':', '|', ']'), so each group is parsed once, left to right.
// Only at the top level may a bracket or ':' that starts no group stand as
// text; lark then prefers the group wherever one parses (the goldens check it).
#include "text/prompt_schedule.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <utility>

#include "core/error.h"

namespace sdxl {
namespace {

struct Node;
using Seq = std::vector<Node>;

// Text, or a group whose text depends on the step.
struct Node {
  enum class Kind { kText, kScheduled, kAlternate } kind = Kind::kText;
  std::string text;         // kText
  Seq before, after;        // kScheduled ("before" empty when absent: A1111's `before or ()`)
  std::string when_text;    // kScheduled: the NUMBER as written
  long long when = 0;       // kScheduled: the step, after resolve_steps
  std::vector<Seq> options;  // kAlternate
};

// Python's \s outside ASCII, as UTF-8: U+0085, U+00A0, U+1680, U+2000-U+200A,
// U+2028, U+2029, U+202F, U+205F, U+3000. Returns the bytes matched, 0 if none.
size_t space_at(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0u; };
  const unsigned c = b(0);
  if (c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1C && c <= 0x1F)) return 1;
  if (c == 0xC2 && (b(1) == 0x85 || b(1) == 0xA0)) return 2;
  if (c == 0xE1 && b(1) == 0x9A && b(2) == 0x80) return 3;
  if (c == 0xE2 && b(1) == 0x80 && (b(2) <= 0x8A || b(2) == 0xA8 || b(2) == 0xA9 || b(2) == 0xAF) && b(2) >= 0x80)
    return 3;
  if (c == 0xE2 && b(1) == 0x81 && b(2) == 0x9F) return 3;
  if (c == 0xE3 && b(1) == 0x80 && b(2) == 0x80) return 3;
  return 0;
}

size_t skip_spaces(std::string_view s, size_t i) {
  for (size_t n; (n = space_at(s, i)) > 0;) i += n;
  return i;
}

size_t skip_digits(std::string_view s, size_t i) {
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  return i;
}

// Exponent ("e", sign, digits) at i: its end, or i when there is none.
size_t exponent_end(std::string_view s, size_t i) {
  if (i >= s.size() || (s[i] != 'e' && s[i] != 'E')) return i;
  size_t j = i + 1;
  if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
  const size_t k = skip_digits(s, j);
  return k > j ? k : i;
}

// lark's SIGNED_NUMBER as its regex matches: ["+"|"-"] (FLOAT | INT), FLOAT
// being INT _EXP | DECIMAL _EXP?, the first alternative that matches. Returns
// the end, or `i` when no number starts there.
size_t number_end(std::string_view s, size_t i) {
  size_t j = i;
  if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
  const size_t int_end = skip_digits(s, j);
  if (int_end > j) {
    const size_t e = exponent_end(s, int_end);
    if (e > int_end) return e;  // INT _EXP
  }
  size_t dec_end = j;
  if (int_end > j && int_end < s.size() && s[int_end] == '.') {
    dec_end = skip_digits(s, int_end + 1);  // INT "." INT?
  } else if (int_end == j && j < s.size() && s[j] == '.' && skip_digits(s, j + 1) > j + 1) {
    dec_end = skip_digits(s, j + 1);  // "." INT
  }
  if (dec_end > j) return exponent_end(s, dec_end);
  return int_end > j ? int_end : i;
}

// Python's float() of a NUMBER (its syntax already checked).
double number_value(std::string_view num) {
  const bool neg = !num.empty() && num.front() == '-';
  if (!num.empty() && (num.front() == '+' || num.front() == '-')) num.remove_prefix(1);
  double v = 0;
  const auto r = std::from_chars(num.data(), num.data() + num.size(), v);
  if (r.ec == std::errc::result_out_of_range) {
    const size_t e = num.find_first_of("eE");
    const bool tiny = e != std::string_view::npos && e + 1 < num.size() && num[e + 1] == '-';
    v = tiny ? 0.0 : HUGE_VAL;
  }
  return neg ? -v : v;
}

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  // The whole prompt, or nothing where A1111's parse fails.
  std::optional<Seq> parse_start() {
    Seq out;
    size_t i = 0;
    while (i < s_.size()) {
      const size_t j = parse_prompt(i, out, 0);
      if (j > i) {
        i = j;
        continue;
      }
      const char c = s_[i];
      if (c != '[' && c != ']' && c != '(' && c != ')' && c != ':') return std::nullopt;  // '|' or a bad '\'
      append_text(out, std::string(1, c));
      i += 1;
    }
    return out;
  }

 private:
  static void append_text(Seq& seq, std::string text) {
    if (!seq.empty() && seq.back().kind == Node::Kind::kText) {
      seq.back().text += text;
      return;
    }
    Node n;
    n.text = std::move(text);
    seq.push_back(std::move(n));
  }

  // plain, whitespace and groups from i into seq; returns where it stopped.
  size_t parse_prompt(size_t i, Seq& seq, size_t depth) {
    while (i < s_.size()) {
      const char c = s_[i];
      if (c == '\\') {
        if (i + 1 >= s_.size() || s_[i + 1] == '\n') return i;  // \\. matches neither
        append_text(seq, std::string(s_.substr(i, 2)));
        i += 2;
      } else if (c == '[' || c == '(') {
        const size_t j = parse_group(i, seq, depth + 1);
        if (j == i) return i;
        i = j;
      } else if (c == ']' || c == ')' || c == ':' || c == '|') {
        return i;
      } else {
        size_t j = i;
        while (j < s_.size() && std::string_view("\\[]():|").find(s_[j]) == std::string_view::npos) ++j;
        append_text(seq, std::string(s_.substr(i, j - i)));
        i = j;
      }
    }
    return i;
  }

  // A group at i appended to seq; returns its end, or i (seq unchanged) when none parses.
  size_t parse_group(size_t i, Seq& seq, size_t depth) {
    if (depth > kMaxScheduleNesting) return i;  // read as text; A1111's recursion fails here or soon after
    Seq first;
    size_t j = parse_prompt(i + 1, first, depth);
    if (j >= s_.size()) return i;
    const char open = s_[i], next = s_[j];
    if (open == '(') {
      Seq second;
      size_t k = j;
      if (next == ':') k = parse_prompt(j + 1, second, depth);
      if ((next != ':' && next != ')') || k >= s_.size() || s_[k] != ')') return i;
      append_text(seq, "(");
      for (Node& n : first) append_node(seq, std::move(n));
      if (next == ':') {
        append_text(seq, ":");
        for (Node& n : second) append_node(seq, std::move(n));
      }
      append_text(seq, ")");
      return k + 1;
    }
    if (next == ']') {  // emphasized
      append_text(seq, "[");
      for (Node& n : first) append_node(seq, std::move(n));
      append_text(seq, "]");
      return j + 1;
    }
    if (next == '|') return parse_alternate(i, j, std::move(first), seq, depth);
    if (next == ':') return parse_scheduled(i, j, std::move(first), seq, depth);
    return i;
  }

  static void append_node(Seq& seq, Node n) {
    if (n.kind == Node::Kind::kText)
      append_text(seq, std::move(n.text));
    else
      seq.push_back(std::move(n));
  }

  // "[" first ("|" [prompt])+ "]" with j at the first '|'; returns open when it does not close.
  size_t parse_alternate(size_t open, size_t j, Seq first, Seq& seq, size_t depth) {
    Node n;
    n.kind = Node::Kind::kAlternate;
    n.options.push_back(std::move(first));
    while (j < s_.size() && s_[j] == '|') {
      Seq opt;
      j = parse_prompt(j + 1, opt, depth);
      n.options.push_back(std::move(opt));
    }
    if (j >= s_.size() || s_[j] != ']') return open;
    seq.push_back(std::move(n));
    return j + 1;
  }

  // After "[" first ":" (j at the ':'): "[to:when]" or "[from:to:when]".
  size_t parse_scheduled(size_t open, size_t j, Seq first, Seq& seq, size_t depth) {
    Node n;
    n.kind = Node::Kind::kScheduled;
    size_t end = when_end(j + 1, n.when_text);
    if (end != 0) {
      n.after = std::move(first);
    } else {
      Seq second;
      const size_t k = parse_prompt(j + 1, second, depth);
      if (k >= s_.size() || s_[k] != ':') return open;
      end = when_end(k + 1, n.when_text);
      if (end == 0) return refuse_when_text(open, k + 1);
      n.before = std::move(first);
      n.after = std::move(second);
    }
    seq.push_back(std::move(n));
    return end;
  }

  // [WHITESPACE] NUMBER [WHITESPACE] "]" at i: the end after ']', or 0.
  size_t when_end(size_t i, std::string& number) {
    const size_t a = skip_spaces(s_, i);
    const size_t b = number_end(s_, a);
    if (b == a) return 0;
    const size_t c = skip_spaces(s_, b);
    if (c >= s_.size() || s_[c] != ']') return 0;
    number = std::string(s_.substr(a, b - a));
    return c + 1;
  }

  // "[from:to:WHEN]" whose WHEN is no number: A1111 reads the group as text;
  // refused here, as the issue asks. Only a plain WHEN up to ']' counts: other
  // shapes (a '|' or a group inside it) are left to A1111's reading.
  size_t refuse_when_text(size_t open, size_t i) {
    size_t k = i;
    while (k < s_.size() && std::string_view("[]():|\\").find(s_[k]) == std::string_view::npos) ++k;
    if (k < s_.size() && s_[k] == ']') {
      const std::string_view when = s_.substr(i, k - i);
      if (skip_spaces(when, 0) < when.size())
        throw UsageError("prompt editing '" + std::string(s_.substr(open, k + 1 - open)) + "': when '" +
                         std::string(when) + "' is not a number (a step like 10, or a fraction of the steps like 0.5)");
    }
    return open;
  }

  std::string_view s_;
};

// A1111's CollectSteps: each `when` to a step (truncated toward zero, at most
// `steps`; below 1 it never holds), the steps at which some text changes.
struct StepRule {
  int steps = 1;
  long long int_offset = 0;
  double flt_offset = 0;
};

void resolve_steps(Seq& seq, const StepRule& rule, std::set<int>& ends, bool& alternates) {
  for (Node& n : seq) {
    if (n.kind == Node::Kind::kScheduled) {
      const double raw = number_value(n.when_text);
      const bool fraction = n.when_text.find('.') != std::string::npos;
      const double v = fraction ? (raw - rule.flt_offset) * rule.steps : raw - static_cast<double>(rule.int_offset);
      if (std::isinf(v))
        throw UsageError("prompt editing: when '" + n.when_text + "' is beyond any step (A1111 fails on it too)");
      const double t = std::trunc(v);
      n.when = t >= rule.steps ? rule.steps : (t < 0 ? -1 : static_cast<long long>(t));
      if (n.when >= 1) ends.insert(static_cast<int>(n.when));
      resolve_steps(n.before, rule, ends, alternates);
      resolve_steps(n.after, rule, ends, alternates);
    } else if (n.kind == Node::Kind::kAlternate) {
      alternates = true;
      for (Seq& o : n.options) resolve_steps(o, rule, ends, alternates);
    }
  }
}

// A1111's AtStep: the text of the prompt at a step.
void text_at(const Seq& seq, int step, std::string& out) {
  for (const Node& n : seq) {
    if (n.kind == Node::Kind::kText)
      out += n.text;
    else if (n.kind == Node::Kind::kScheduled)
      text_at(step <= n.when ? n.before : n.after, step, out);
    else
      text_at(n.options[static_cast<size_t>(step - 1) % n.options.size()], step, out);
  }
}

bool has_groups(const Seq& seq) {
  return std::any_of(seq.begin(), seq.end(), [](const Node& n) { return n.kind != Node::Kind::kText; });
}

}  // namespace

size_t PromptSchedule::index_at(int step) const {
  for (size_t k = 0; k < entries.size(); ++k)
    if (step <= entries[k].end_at_step) return k;
  return 0;
}

PromptSchedule prompt_schedule(std::string_view prompt, int base_steps, std::optional<int> hires_steps) {
  StepRule rule;
  rule.steps = hires_steps ? *hires_steps : base_steps;
  if (hires_steps) {
    rule.int_offset = base_steps;
    rule.flt_offset = 1.0;
  }
  if (rule.steps < 1) throw UsageError("prompt schedule: steps must be at least 1");
  std::optional<Seq> tree = Parser(prompt).parse_start();
  PromptSchedule out;
  if (!tree || !has_groups(*tree)) {
    out.entries.push_back({rule.steps, std::string(prompt)});
    return out;
  }
  std::set<int> ends{rule.steps};
  bool alternates = false;
  resolve_steps(*tree, rule, ends, alternates);
  if (alternates)
    for (int s = 1; s <= rule.steps; ++s) ends.insert(s);
  for (int end : ends) {
    PromptScheduleEntry e;
    e.end_at_step = end;
    text_at(*tree, end, e.text);
    out.entries.push_back(std::move(e));
  }
  return out;
}

PassSchedules pass_schedules(std::string_view prompt, int steps, int hires_steps) {
  PassSchedules out;
  out.passes.push_back(prompt_schedule(prompt, steps));
  if (hires_steps > 0) out.passes.push_back(prompt_schedule(prompt, steps, hires_steps));
  for (const PromptSchedule& pass : out.passes) {
    std::vector<size_t>& of = out.text_of_entry.emplace_back();
    for (const PromptScheduleEntry& e : pass.entries) {
      const auto it = std::find(out.texts.begin(), out.texts.end(), e.text);
      of.push_back(static_cast<size_t>(it - out.texts.begin()));
      if (it == out.texts.end()) out.texts.push_back(e.text);
    }
  }
  return out;
}

bool prompt_has_schedule(std::string_view prompt) {
  const std::optional<Seq> tree = Parser(prompt).parse_start();
  return tree && has_groups(*tree);
}

}  // namespace sdxl
