#include "batch/story.h"

namespace sdxl {

namespace {

// Prompt and negative as one template; the separator is no wildcard syntax,
// and each part's braces balance on their own (checked), so it survives.
constexpr char kPartSeparator = '\x1e';

std::string joined(const GenerationParams& p) { return p.prompt + kPartSeparator + p.negative_prompt; }

void join_text(std::string& text, const std::string& part) {
  if (part.empty()) return;
  text += (text.empty() ? "" : ", ") + part;
}

}  // namespace

std::string apply_style_text(const std::string& style, const std::string& text) {
  if (style.empty()) return text;
  const size_t at = style.find("{prompt}");
  if (at != std::string::npos) {
    std::string out = style;
    for (size_t k = out.find("{prompt}"); k != std::string::npos; k = out.find("{prompt}", k + text.size()))
      out.replace(k, 8, text);
    return out;
  }
  std::string out = text;
  join_text(out, style);
  return out;
}

void apply_story(const StoryBook& book, const std::vector<std::string>& characters, const std::string& style,
                 GenerationParams& p, std::vector<std::pair<std::string, std::string>>& problems) {
  for (size_t k = 0; k < characters.size(); ++k) {
    const std::string where = "/characters/" + std::to_string(k);
    const auto it = book.characters.find(characters[k]);
    if (it == book.characters.end()) {
      std::string known;
      for (const auto& [name, c] : book.characters) known += (known.empty() ? "" : ", ") + name;
      problems.emplace_back(where, "unknown character '" + characters[k] + "' (the top-level \"characters\" has: " +
                                       (known.empty() ? std::string("nothing") : known) + ")");
      continue;
    }
    join_text(p.prompt, it->second.prompt);
    join_text(p.negative_prompt, it->second.negative);
    for (const LoraRef& l : it->second.loras) {
      bool same = false;
      for (const LoraRef& have : p.loras) {
        if (have.path != l.path) continue;
        if (have.weight != l.weight)
          problems.emplace_back(where, "character '" + characters[k] + "' uses LoRA '" + l.name + "' at weight " +
                                           std::to_string(l.weight) + ", but the task already has it at " +
                                           std::to_string(have.weight) + " (name it once, or at one weight)");
        same = true;
      }
      if (!same) p.loras.push_back(l);
    }
  }
  if (style.empty()) return;
  const auto it = book.styles.find(style);
  if (it == book.styles.end()) {
    std::string known;
    for (const auto& [name, s] : book.styles) known += (known.empty() ? "" : ", ") + name;
    problems.emplace_back("/style", "unknown style '" + style + "' (the top-level \"styles\" has: " +
                                        (known.empty() ? std::string("nothing") : known) + ")");
    return;
  }
  p.prompt = apply_style_text(it->second.prompt, p.prompt);
  p.negative_prompt = apply_style_text(it->second.negative, p.negative_prompt);
}

bool prompt_has_wildcards(const GenerationParams& p) {
  return has_wildcards(p.prompt) || has_wildcards(p.negative_prompt);
}

void check_prompt_wildcards(const GenerationParams& p, const WildcardLibrary& lib, std::string* failed) {
  if (failed) *failed = "prompt";
  check_template(p.prompt, lib);
  if (failed) *failed = "negative";
  check_template(p.negative_prompt, lib);
  check_template(joined(p), lib);  // the expansion budget counts both, as they are expanded together
}

ImagePrompt expand_image_prompt(const GenerationParams& p, bool expand_all, int index, std::int64_t seed,
                                const WildcardLibrary& lib) {
  const Expansion e = expand_all ? expand_combination(joined(p), static_cast<std::uint64_t>(index), lib)
                                 : expand_random(joined(p), static_cast<std::uint64_t>(seed), lib);
  ImagePrompt out;
  const size_t cut = e.text.find(kPartSeparator);
  out.prompt = e.text.substr(0, cut);
  out.negative = cut == std::string::npos ? "" : e.text.substr(cut + 1);
  out.choices = e.choices;
  return out;
}

ImagePrompt task_image_prompt(const BatchTask& task, int index, std::int64_t seed, const WildcardLibrary& lib) {
  if (!prompt_has_wildcards(task.params)) return {task.params.prompt, task.params.negative_prompt, {}};
  return expand_image_prompt(task.params, task.expand_all, index, seed, lib);
}

std::uint64_t prompt_combinations(const GenerationParams& p, const WildcardLibrary& lib, std::uint64_t limit) {
  return count_combinations(joined(p), lib, limit);
}

}  // namespace sdxl
