// Wildcard prompts in the dynamicprompts syntax that wildcard libraries use:
//   {a|b|c}        one of the variants          {2::a|b}     weighted (2:1)
//   {2$$a|b|c}     two different ones, joined by ", "   {1-2$$a|b}  one or two
//   {2$$ and $$a|b|c}  joined by " and "        __name__     a line of name.txt
//   __folder/name__    a line of folder/name.txt in a wildcards folder
// Variants and wildcard lines nest. \{ \} \| are the literal characters; any
// other backslash stays as written (A1111's \( \) reach the prompt parser).
// Wildcard files: one value per line; empty lines and lines starting with '#'
// are skipped; the values are sorted (as dynamicprompts does) so that a file's
// line order does not change which value an index or a seed picks.
//
// Random mode draws every choice from a generator seeded by the image's seed,
// so an image's prompt depends only on its template and seed: reruns, resumes
// and shards make the same prompts. Combinatorial mode ("all") lists every
// combination, the leftmost choice varying slowest, as dynamicprompts'
// combinatorial generator does (which joins $$ picks with "," by default;
// here the default joiner is ", ").
// Wildcard files are inputs: each is read only inside the folder it is found
// in (core/input_file.h's confinement rule: no link out of the folder), must be
// UTF-8 without control characters (a tab allowed; core/input_text.h), and is
// read and parsed once per process however many images use it.
// Expansion has a budget: at most kMaxExpansionBytes of text and
// kMaxExpansionSteps steps per prompt. check_template measures the most any
// draw can make, so validate refuses a template over the budget, naming the
// chain of wildcard files; the expansions stop at the same budget.
// torch-free. Errors are UsageError naming the template, file and line.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace sdxl {

inline constexpr std::uint64_t kMaxExpansionBytes = 256ull << 10;  // one prompt and its negative
inline constexpr std::uint64_t kMaxExpansionSteps = 1000000;      // parts visited for one expansion

struct WildcardFile;  // a file's sorted values, parsed (wildcards.cpp)

// The wildcard files of some folders (searched in order), read once each.
class WildcardLibrary {
 public:
  explicit WildcardLibrary(std::vector<std::filesystem::path> dirs = {});
  const std::vector<std::filesystem::path>& dirs() const { return dirs_; }
  // The sorted values of __name__; throws UsageError naming the folders searched.
  const std::vector<std::string>& values(const std::string& name) const;
  // Where __name__ was read from (after values()), for messages.
  std::filesystem::path file_of(const std::string& name) const;
  // __name__'s file, read and parsed (throws as values() does).
  const WildcardFile& file(const std::string& name) const;
  // check_template's memo: the most text bytes and steps an expansion of
  // __name__ makes, for every wildcard already measured with these folders.
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>>& bounds() const { return bounds_; }

 private:
  std::vector<std::filesystem::path> dirs_;
  mutable std::map<std::string, std::shared_ptr<const WildcardFile>> cache_;
  mutable std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> bounds_;
};

struct Expansion {
  std::string text;
  std::vector<std::string> choices;  // what each variant and wildcard picked, in order
};

// Throws UsageError when the template cannot expand: unbalanced braces, a bad
// {N$$...} count, a missing wildcard file, a cycle of wildcards, or (with a
// limit) more than `limit` combinations.
void check_template(const std::string& text, const WildcardLibrary& lib);
// Whether the text uses any wildcard syntax (then it is expanded per image).
bool has_wildcards(const std::string& text);
// One expansion drawn from `seed`.
Expansion expand_random(const std::string& text, std::uint64_t seed, const WildcardLibrary& lib);
// The number of combinations (saturating at limit + 1).
std::uint64_t count_combinations(const std::string& text, const WildcardLibrary& lib, std::uint64_t limit);
// Combination `index` (0-based) in combinatorial order; index < count_combinations.
Expansion expand_combination(const std::string& text, std::uint64_t index, const WildcardLibrary& lib);

}  // namespace sdxl
