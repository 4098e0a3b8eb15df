#include "batch/wildcards.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <set>
#include <sstream>

#include <sys/stat.h>

#include <mutex>
#include <tuple>

#include "core/error.h"
#include "core/input_file.h"
#include "core/input_text.h"

namespace sdxl {

namespace fs = std::filesystem;

namespace {

// --- the syntax tree ---------------------------------------------------------

struct Node;
using Seq = std::vector<Node>;
struct Option {
  double weight = 1.0;
  Seq seq;
};
struct Node {
  enum class Kind { kText, kVariants, kWildcard } kind = Kind::kText;
  std::string text;              // kText: the literal; kWildcard: the name
  std::vector<Option> options;   // kVariants
  int min_pick = 1, max_pick = 1;
  bool multi = false;            // {N$$...}: several different options, joined
  std::string sep = ", ";
};

class Parser {
 public:
  Parser(const std::string& s, std::string where) : s_(s), where_(std::move(where)) {}
  Seq parse_all() {
    Seq seq = parse_seq(false);
    if (i_ < s_.size()) fail("a '" + std::string(1, s_[i_]) + "' without its '{'");
    return seq;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    const std::string shown = s_.size() > 160 ? s_.substr(0, 160) + "..." : s_;
    throw UsageError(where_ + ": " + why + " at character " + std::to_string(i_ + 1) + " of \"" + shown + "\"" +
                     " (write \\{ \\} \\| for the characters themselves)");
  }
  static void add_text(Seq& seq, const std::string& t) {
    if (t.empty()) return;
    if (!seq.empty() && seq.back().kind == Node::Kind::kText) seq.back().text += t;
    else seq.push_back({Node::Kind::kText, t, {}, 1, 1, false, ", "});
  }
  // Text, variants and wildcards up to the end, or up to '|' / '}' inside braces.
  Seq parse_seq(bool in_braces) {
    Seq seq;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '\\' && i_ + 1 < s_.size() && std::strchr("{}|", s_[i_ + 1]) != nullptr && s_[i_ + 1] != '\0') {
        add_text(seq, std::string(1, s_[i_ + 1]));
        i_ += 2;
      } else if (c == '{') {
        ++i_;
        seq.push_back(parse_variants());
      } else if (c == '}' || c == '|') {
        if (in_braces) break;
        if (c == '}') return seq;  // parse_all reports it
        add_text(seq, "|");
        ++i_;
      } else if (!(c == '_' && s_.compare(i_, 2, "__") == 0 && wildcard_at(seq))) {  // not a __name__
        add_text(seq, std::string(1, c));
        ++i_;
      }
    }
    return seq;
  }
  // __name__ (letters, digits, _ - . /); anything else is plain text.
  bool wildcard_at(Seq& seq) {
    size_t j = i_ + 2;
    while (j < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[j])) || s_[j] == '-' || s_[j] == '.' ||
                             s_[j] == '/' || (s_[j] == '_' && s_.compare(j, 2, "__") != 0)))
      ++j;
    if (j == i_ + 2 || s_.compare(j, 2, "__") != 0) return false;
    Node n;
    n.kind = Node::Kind::kWildcard;
    n.text = s_.substr(i_ + 2, j - i_ - 2);
    seq.push_back(std::move(n));
    i_ = j + 2;
    return true;
  }
  // "N$$", "N-M$$" and an optional "SEP$$" after it, at the start of a variant.
  void parse_count(Node& n) {
    size_t j = i_;
    auto digits = [&](int& out) {
      const size_t k = j;
      while (j < s_.size() && std::isdigit(static_cast<unsigned char>(s_[j]))) ++j;
      if (j == k || j - k > 4) return false;
      out = std::stoi(s_.substr(k, j - k));
      return true;
    };
    int lo = 0, hi = 0;
    if (!digits(lo)) return;
    hi = lo;
    if (j < s_.size() && s_[j] == '-' && (++j, !digits(hi))) return;
    if (s_.compare(j, 2, "$$") != 0) return;
    if (lo > hi) fail("a count range " + std::to_string(lo) + "-" + std::to_string(hi) + " that runs backwards");
    n.multi = true;
    n.min_pick = lo;
    n.max_pick = hi;
    i_ = j + 2;
    const size_t sep_end = s_.find("$$", i_);
    const size_t stop = s_.find_first_of("|{}", i_);
    if (sep_end != std::string::npos && (stop == std::string::npos || sep_end < stop)) {
      n.sep = s_.substr(i_, sep_end - i_);
      i_ = sep_end + 2;
    }
  }
  // "2::" or "0.5::" before an option.
  double parse_weight() {
    size_t j = i_;
    while (j < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[j])) || s_[j] == '.')) ++j;
    if (j == i_ || s_.compare(j, 2, "::") != 0) return 1.0;
    char* end = nullptr;
    const std::string num = s_.substr(i_, j - i_);
    const double w = std::strtod(num.c_str(), &end);
    if (end != num.c_str() + num.size() || !std::isfinite(w)) fail("a weight '" + num + "' that is not a number");
    i_ = j + 2;
    return w;
  }
  Node parse_variants() {
    if (++depth_ > kMaxDepth) fail("variants nested deeper than " + std::to_string(kMaxDepth) + " levels");
    Node n;
    n.kind = Node::Kind::kVariants;
    const size_t open = i_ - 1;
    parse_count(n);
    while (true) {
      Option o;
      o.weight = parse_weight();
      o.seq = parse_seq(true);
      n.options.push_back(std::move(o));
      if (i_ >= s_.size()) {
        i_ = open;
        fail("a '{' that is never closed");
      }
      if (s_[i_++] == '}') break;
    }
    --depth_;
    return n;
  }

  static constexpr int kMaxDepth = 64;  // a bound on the parser's recursion
  const std::string& s_;
  std::string where_;
  size_t i_ = 0;
  int depth_ = 0;
};

Seq parse_template(const std::string& text, const std::string& where) { return Parser(text, where).parse_all(); }

// --- evaluation ----------------------------------------------------------------

// splitmix64: a small generator whose sequence is the same on every platform.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : next() % n; }

 private:
  std::uint64_t state_;
};

}  // namespace

// A wildcard file's values (sorted) and their parse, shared by every library
// of the process.
struct WildcardFile {
  fs::path path;
  std::vector<std::string> values;
  std::vector<Seq> seqs;  // seqs[k] is values[k] parsed
};

namespace {

// The most that expansions of a part can make: text bytes and steps (saturating).
struct Cost {
  std::uint64_t bytes = 0, steps = 0;
};

std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

struct Eval {
  const WildcardLibrary& lib;
  std::vector<std::string> stack{};  // wildcards being expanded (cycles, and the chain in messages)
  std::uint64_t steps = 0;
  std::map<std::pair<std::string, std::uint64_t>, std::uint64_t> counts{};  // (name, cap) -> combinations

  const std::vector<Seq>& wildcard(const std::string& name) {
    if (std::find(stack.begin(), stack.end(), name) != stack.end()) {
      std::string chain;
      for (const auto& s : stack) chain += "__" + s + "__ -> ";
      throw UsageError("wildcards form a cycle: " + chain + "__" + name + "__");
    }
    return lib.file(name).seqs;
  }
  // "the prompt -> __a__ ('dir/a.txt') -> __b__ ('dir/b.txt')": where an expansion is.
  std::string chain() const {
    std::string out = "the prompt";
    for (const auto& s : stack) out += " -> __" + s + "__ ('" + lib.file_of(s).string() + "')";
    return out;
  }
  [[noreturn]] void over_budget(const std::string& what) const {
    throw UsageError("wildcards expand beyond the budget: " + chain() + " can make " + what +
                     " (a prompt may expand to at most " + std::to_string(kMaxExpansionBytes >> 10) + " KiB in " +
                     std::to_string(kMaxExpansionSteps) + " steps; a file that uses the next one several times " +
                     "doubles the text at each level)");
  }
  void step() {
    if (++steps > kMaxExpansionSteps) over_budget("more than " + std::to_string(kMaxExpansionSteps) + " steps");
  }
  void check_cost(const Cost& c) const {
    if (c.bytes > kMaxExpansionBytes)
      over_budget("more than " + std::to_string(kMaxExpansionBytes >> 10) + " KiB of text");
    if (c.steps > kMaxExpansionSteps) over_budget("more than " + std::to_string(kMaxExpansionSteps) + " steps");
  }
  struct Scope {
    Eval& e;
    Scope(Eval& ev, const std::string& name) : e(ev) { e.stack.push_back(name); }
    ~Scope() { e.stack.pop_back(); }
  };
};

std::string random_seq(const Seq& seq, Rng& rng, Eval& ev, std::vector<std::string>& choices);

size_t weighted_pick(const std::vector<Option>& opts, const std::vector<bool>& taken, Rng& rng) {
  double total = 0;
  for (size_t k = 0; k < opts.size(); ++k)
    if (!taken[k]) total += opts[k].weight;
  double r = rng.uniform() * total;
  size_t last = 0;
  for (size_t k = 0; k < opts.size(); ++k) {
    if (taken[k]) continue;
    last = k;
    if (r < opts[k].weight) return k;
    r -= opts[k].weight;
  }
  return last;
}

std::string random_node(const Node& n, Rng& rng, Eval& ev, std::vector<std::string>& choices) {
  ev.step();
  if (n.kind == Node::Kind::kText) return n.text;
  if (n.kind == Node::Kind::kWildcard) {
    const auto& values = ev.wildcard(n.text);
    if (values.empty()) return "";
    Eval::Scope in(ev, n.text);
    const std::string v = random_seq(values[rng.below(values.size())], rng, ev, choices);
    choices.push_back("__" + n.text + "__=" + v);
    return v;
  }
  const int most = std::min<int>(n.max_pick, static_cast<int>(n.options.size()));
  const int least = std::min(n.min_pick, most);
  const int picks = n.multi ? least + static_cast<int>(rng.below(static_cast<std::uint64_t>(most - least + 1))) : 1;
  std::vector<bool> taken(n.options.size(), false);
  std::string out;
  for (int k = 0; k < picks; ++k) {
    const size_t o = weighted_pick(n.options, taken, rng);
    taken[o] = true;
    out += (k ? n.sep : "") + random_seq(n.options[o].seq, rng, ev, choices);
  }
  choices.push_back(out);
  return out;
}

std::string random_seq(const Seq& seq, Rng& rng, Eval& ev, std::vector<std::string>& choices) {
  std::string out;
  for (const Node& n : seq) {
    out += random_node(n, rng, ev, choices);
    if (out.size() > kMaxExpansionBytes) ev.check_cost({out.size(), 0});
  }
  return out;
}

// Combinatorial mode: counts saturate at `cap`.
std::uint64_t sat_mul(std::uint64_t a, std::uint64_t b, std::uint64_t cap) {
  if (a == 0 || b == 0) return 0;
  return a > cap / b ? cap : std::min(cap, a * b);
}

std::uint64_t count_seq(const Seq& seq, Eval& ev, std::uint64_t cap);

// Calls f(order) for each ordered pick of k different options, lexicographically.
void for_each_pick(size_t n, size_t k, const std::function<bool(const std::vector<size_t>&)>& f) {
  std::vector<size_t> pick;
  std::vector<bool> used(n, false);
  std::function<bool()> rec = [&]() -> bool {
    if (pick.size() == k) return f(pick);
    for (size_t o = 0; o < n; ++o) {
      if (used[o]) continue;
      used[o] = true;
      pick.push_back(o);
      const bool go_on = rec();
      pick.pop_back();
      used[o] = false;
      if (!go_on) return false;
    }
    return true;
  };
  rec();
}

std::pair<int, int> pick_range(const Node& n) {
  const int most = std::min<int>(n.max_pick, static_cast<int>(n.options.size()));
  return {std::min(n.min_pick, most), most};
}

std::uint64_t count_node(const Node& n, Eval& ev, std::uint64_t cap) {
  if (n.kind == Node::Kind::kText) return 1;
  std::uint64_t total = 0;
  if (n.kind == Node::Kind::kWildcard) {
    if (auto it = ev.counts.find({n.text, cap}); it != ev.counts.end()) return it->second;
    const auto& values = ev.wildcard(n.text);
    Eval::Scope in(ev, n.text);
    for (const Seq& v : values) total = std::min(cap, total + count_seq(v, ev, cap));
    ev.counts[{n.text, cap}] = total;
    return total;
  }
  if (!n.multi) {
    for (const Option& o : n.options) total = std::min(cap, total + count_seq(o.seq, ev, cap));
    return total;
  }
  const auto [least, most] = pick_range(n);
  for (int k = least; k <= most && total < cap; ++k)
    for_each_pick(n.options.size(), static_cast<size_t>(k), [&](const std::vector<size_t>& pick) {
      std::uint64_t c = 1;
      for (size_t o : pick) c = sat_mul(c, count_seq(n.options[o].seq, ev, cap), cap);
      total = std::min(cap, total + c);
      return total < cap;
    });
  return total;
}

std::uint64_t count_seq(const Seq& seq, Eval& ev, std::uint64_t cap) {
  std::uint64_t c = 1;
  for (const Node& n : seq) c = sat_mul(c, count_node(n, ev, cap), cap);
  return c;
}

std::string nth_seq(const Seq& seq, std::uint64_t index, Eval& ev, std::vector<std::string>& choices);

// Part `index` of a sequence of parts with the given counts (the first varies slowest).
std::string nth_of_parts(const std::vector<const Seq*>& parts, const std::string& sep, std::uint64_t index, Eval& ev,
                         std::vector<std::string>& choices) {
  std::vector<std::uint64_t> counts;
  for (const Seq* p : parts) counts.push_back(count_seq(*p, ev, UINT64_MAX));
  std::string out;
  for (size_t k = 0; k < parts.size(); ++k) {
    std::uint64_t below = 1;
    for (size_t j = k + 1; j < parts.size(); ++j) below *= counts[j];
    out += (k ? sep : "") + nth_seq(*parts[k], index / below, ev, choices);
    index %= below;
  }
  return out;
}

std::string nth_node(const Node& n, std::uint64_t index, Eval& ev, std::vector<std::string>& choices) {
  ev.step();
  if (n.kind == Node::Kind::kText) return n.text;
  std::string out;
  if (n.kind == Node::Kind::kWildcard) {
    const auto& values = ev.wildcard(n.text);
    Eval::Scope in(ev, n.text);
    for (const Seq& v : values) {
      const std::uint64_t c = count_seq(v, ev, UINT64_MAX);
      if (index < c) {
        out = nth_seq(v, index, ev, choices);
        choices.push_back("__" + n.text + "__=" + out);
        return out;
      }
      index -= c;
    }
    return out;
  }
  const auto [least, most] = n.multi ? pick_range(n) : std::pair<int, int>{1, 1};
  bool found = false;
  for (int k = least; k <= most && !found; ++k)
    for_each_pick(n.options.size(), static_cast<size_t>(k), [&](const std::vector<size_t>& pick) {
      std::vector<const Seq*> parts;
      for (size_t o : pick) parts.push_back(&n.options[o].seq);
      std::uint64_t c = 1;
      for (const Seq* p : parts) c *= count_seq(*p, ev, UINT64_MAX);
      if (index >= c) {
        index -= c;
        return true;
      }
      out = nth_of_parts(parts, n.sep, index, ev, choices);
      found = true;
      return false;
    });
  choices.push_back(out);
  return out;
}

std::string nth_seq(const Seq& seq, std::uint64_t index, Eval& ev, std::vector<std::string>& choices) {
  std::vector<std::uint64_t> counts;
  for (const Node& n : seq) counts.push_back(count_node(n, ev, UINT64_MAX));
  std::string out;
  for (size_t k = 0; k < seq.size(); ++k) {
    std::uint64_t below = 1;
    for (size_t j = k + 1; j < seq.size(); ++j) below *= counts[j];
    out += nth_node(seq[k], index / below, ev, choices);
    index %= below;
  }
  return out;
}

Cost cost_seq(const Seq& seq, Eval& ev);

// The most text and steps that `opts` can make when `picks` of them are taken.
Cost cost_options(const std::vector<Option>& opts, int picks, const std::string& sep, Eval& ev) {
  std::vector<Cost> each;
  for (const Option& o : opts) each.push_back(cost_seq(o.seq, ev));
  const size_t k = std::min(each.size(), static_cast<size_t>(std::max(picks, 1)));
  Cost c;
  auto top = [&](auto field) {
    std::vector<std::uint64_t> v;
    for (const Cost& e : each) v.push_back(e.*field);
    std::partial_sort(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end(), std::greater<>());
    std::uint64_t sum = 0;
    for (size_t i = 0; i < k; ++i) sum = sat_add(sum, v[i]);
    return sum;
  };
  c.bytes = sat_add(top(&Cost::bytes), sep.size() * (k > 0 ? k - 1 : 0));
  c.steps = top(&Cost::steps);
  return c;
}

// Walks every wildcard the template reaches once (missing files, cycles,
// syntax) and bounds what any expansion can make; over the budget it throws
// naming the chain of files where the bound is first passed.
Cost cost_node(const Node& n, Eval& ev) {
  Cost c{n.text.size(), 1};
  if (n.kind == Node::Kind::kText) return c;
  c.bytes = 0;
  if (n.kind == Node::Kind::kWildcard) {
    auto& memo = ev.lib.bounds();
    if (auto it = memo.find(n.text); it != memo.end()) return {it->second.first, it->second.second};
    const auto& values = ev.wildcard(n.text);
    Eval::Scope in(ev, n.text);
    for (const Seq& v : values) {
      const Cost vc = cost_seq(v, ev);
      c.bytes = std::max(c.bytes, vc.bytes);
      c.steps = std::max(c.steps, sat_add(vc.steps, 1));
    }
    ev.check_cost(c);
    memo[n.text] = {c.bytes, c.steps};
    return c;
  }
  const Cost o = cost_options(n.options, n.multi ? n.max_pick : 1, n.sep, ev);
  return {o.bytes, sat_add(o.steps, 1)};
}

Cost cost_seq(const Seq& seq, Eval& ev) {
  Cost c;
  for (const Node& n : seq) {
    const Cost nc = cost_node(n, ev);
    c.bytes = sat_add(c.bytes, nc.bytes);
    c.steps = sat_add(c.steps, nc.steps);
  }
  return c;
}

}  // namespace

namespace {

constexpr std::uint64_t kMaxWildcardFileBytes = 16ull << 20;

// The values of a wildcard file's text: trimmed, without empty and '#' lines,
// each UTF-8 without control characters (a tab allowed), sorted; with their line numbers.
std::vector<std::pair<std::string, int>> wildcard_values(const std::string& text, const fs::path& p) {
  std::vector<std::pair<std::string, int>> lines;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    if (const std::string why = text_problem(line, TextKind::kLine); !why.empty())
      throw UsageError("wildcard file '" + p.string() + "' line " + std::to_string(number) + " " + why);
    lines.emplace_back(line.substr(first), number);
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

// A wildcard file read inside `root` (the confinement rule), parsed once per
// process: files are kept by device, inode, size and modification time.
std::shared_ptr<const WildcardFile> load_wildcard_file(const fs::path& p, const fs::path& root,
                                                       const std::string& name) {
  InputFile in(p, kMaxWildcardFileBytes, root);
  if (!in.ok()) throw UsageError("wildcard __" + name + "__: wildcard file '" + p.string() + "' " + in.error());
  struct stat st{};
  ::fstat(in.fd(), &st);
  using Key = std::tuple<dev_t, ino_t, off_t, time_t, long>;
  const Key key{st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec};
  static std::mutex mu;
  static std::map<Key, std::shared_ptr<const WildcardFile>> files;
  {
    std::lock_guard lk(mu);
    if (auto it = files.find(key); it != files.end()) return it->second;
  }
  const std::string text = in.read_all();
  if (!in.error().empty()) throw UsageError("wildcard file '" + p.string() + "' " + in.error());
  auto f = std::make_shared<WildcardFile>();
  f->path = p;
  for (auto& [value, number] : wildcard_values(text, p)) {
    f->seqs.push_back(parse_template(value, p.string() + " line " + std::to_string(number)));
    f->values.push_back(std::move(value));
  }
  if (f->values.empty()) throw UsageError("wildcard __" + name + "__: '" + p.string() + "' has no values");
  std::lock_guard lk(mu);
  return files.emplace(key, std::move(f)).first->second;
}

}  // namespace

WildcardLibrary::WildcardLibrary(std::vector<fs::path> dirs) : dirs_(std::move(dirs)) {}

const WildcardFile& WildcardLibrary::file(const std::string& name) const {
  if (auto it = cache_.find(name); it != cache_.end()) return *it->second;
  if (name.find("..") != std::string::npos || (!name.empty() && name.front() == '/'))
    throw UsageError("wildcard __" + name + "__: a name may not leave the wildcards folder");
  std::string searched;
  for (const auto& d : dirs_) {
    const fs::path p = d / (name + ".txt");
    std::error_code ec;
    if (!fs::exists(p, ec)) {
      searched += (searched.empty() ? "" : ", ") + p.string();
      continue;
    }
    return *cache_.emplace(name, load_wildcard_file(p, d, name)).first->second;
  }
  throw UsageError("wildcard __" + name + "__: no " + name + ".txt in the wildcards folders (" +
                   (searched.empty() ? std::string("none given: set \"wildcards_dir\" or --wildcards-dir") : searched) +
                   ")");
}

const std::vector<std::string>& WildcardLibrary::values(const std::string& name) const { return file(name).values; }

fs::path WildcardLibrary::file_of(const std::string& name) const {
  auto it = cache_.find(name);
  return it == cache_.end() ? fs::path(name + ".txt") : it->second->path;
}

bool has_wildcards(const std::string& text) {
  return text.find_first_of("{}") != std::string::npos || text.find("__") != std::string::npos;
}

void check_template(const std::string& text, const WildcardLibrary& lib) {
  Eval ev{lib};
  ev.check_cost(cost_seq(parse_template(text, "prompt"), ev));
}

Expansion expand_random(const std::string& text, std::uint64_t seed, const WildcardLibrary& lib) {
  Eval ev{lib};
  Rng rng(seed);
  Expansion e;
  e.text = random_seq(parse_template(text, "prompt"), rng, ev, e.choices);
  return e;
}

std::uint64_t count_combinations(const std::string& text, const WildcardLibrary& lib, std::uint64_t limit) {
  Eval ev{lib};
  return count_seq(parse_template(text, "prompt"), ev, limit + 1);
}

Expansion expand_combination(const std::string& text, std::uint64_t index, const WildcardLibrary& lib) {
  Eval ev{lib};
  Expansion e;
  e.text = nth_seq(parse_template(text, "prompt"), index, ev, e.choices);
  return e;
}

}  // namespace sdxl
