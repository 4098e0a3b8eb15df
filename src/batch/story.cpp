#include "batch/story.h"

namespace sdxl {

namespace {

// Prompt and negative as one template; the separator is no wildcard syntax,
// and each part's braces balance on their own (checked), so it survives.
constexpr char kPartSeparator = '\x1e';

// The prompt, the negative, then each region's prompt and negative.
std::string joined(const GenerationParams& p) {
  std::string out = p.prompt + kPartSeparator + p.negative_prompt;
  for (const RegionUse& r : p.regions) out += kPartSeparator + r.prompt + kPartSeparator + r.negative;
  return out;
}

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

namespace {

// The top-level character `name`, or a problem at `where` (listing the known names).
const Character* find_character(const StoryBook& book, const std::string& name, const std::string& where,
                                std::vector<std::pair<std::string, std::string>>& problems) {
  const auto it = book.characters.find(name);
  if (it != book.characters.end()) return &it->second;
  std::string known;
  for (const auto& [n, c] : book.characters) known += (known.empty() ? "" : ", ") + n;
  problems.emplace_back(where, "unknown character '" + name + "' (the top-level \"characters\" has: " +
                                   (known.empty() ? std::string("nothing") : known) + ")");
  return nullptr;
}

// A task-wide character: its prompt, negative and LoRAs join the task's, its reference the IP-Adapter's images.
void join_character(const std::string& name, const Character& c, const std::string& where, GenerationParams& p,
                    std::vector<std::pair<std::string, std::string>>& problems) {
  join_text(p.prompt, c.prompt);
  join_text(p.negative_prompt, c.negative);
  for (const LoraRef& l : c.loras) {
    bool same = false;
    for (const LoraRef& have : p.loras) {
      if (have.path != l.path) continue;
      if (have.weight != l.weight)
        problems.emplace_back(where, "character '" + name + "' uses LoRA '" + l.name + "' at weight " +
                                         std::to_string(l.weight) + ", but the task already has it at " +
                                         std::to_string(have.weight) + " (name it once, or at one weight)");
      same = true;
    }
    if (!same) p.loras.push_back(l);
  }
  if (c.reference.empty()) return;
  if (!p.ip_adapter.on()) {
    problems.emplace_back(where, "character '" + name + "' has a reference picture, but the task has no \"ip_adapter\" "
                                 "to use it (add {\"ip_adapter\": {\"model\": DIR}} to the task or the defaults)");
    return;
  }
  if (!p.ip_adapter.images.empty() && p.ip_adapter.scale != c.reference_scale)
    problems.emplace_back(where, "character '" + name + "' has its reference at scale " +
                                     format_number(c.reference_scale) + ", but the task's IP-Adapter images are at " +
                                     format_number(p.ip_adapter.scale) +
                                     " (outside regions the pictures share one scale: make them equal)");
  if (p.ip_adapter.images.empty()) p.ip_adapter.scale = c.reference_scale;
  p.ip_adapter.images.push_back(c.reference);
}

// A region's character: its prompt after the region's, its negative after the region's (or the
// task's), its reference inside the region. LoRAs are refused: merged weights act on the whole panel.
void join_region_character(const Character& c, const std::string& where, const GenerationParams& p, RegionUse& r,
                           std::vector<std::pair<std::string, std::string>>& problems) {
  if (!c.loras.empty())
    problems.emplace_back(where, "character '" + r.character + "' has LoRAs, which cannot act in one region only: "
                                 "regions mix prompts inside the UNet's attention, and a LoRA changes the weights of "
                                 "the whole panel (name the character in the task's \"characters\", or drop its "
                                 "\"loras\" here)");
  join_text(r.prompt, c.prompt);
  if (!c.negative.empty()) {
    if (r.negative.empty()) r.negative = p.negative_prompt;
    join_text(r.negative, c.negative);
  }
  if (c.reference.empty()) return;
  if (!p.ip_adapter.on())
    problems.emplace_back(where, "character '" + r.character + "' has a reference picture, but the task has no "
                                 "\"ip_adapter\" to use it (add {\"ip_adapter\": {\"model\": DIR}} to the task or the defaults)");
  r.reference = c.reference;
  r.reference_scale = c.reference_scale;
}

}  // namespace

void apply_story(const StoryBook& book, const std::vector<std::string>& characters, const std::string& style,
                 GenerationParams& p, std::vector<std::pair<std::string, std::string>>& problems) {
  for (size_t k = 0; k < characters.size(); ++k) {
    const std::string where = "/characters/" + std::to_string(k);
    if (const Character* c = find_character(book, characters[k], where, problems))
      join_character(characters[k], *c, where, p, problems);
  }
  for (size_t k = 0; k < p.regions.size(); ++k) {
    RegionUse& r = p.regions[k];
    const std::string where = "/regions/" + std::to_string(k) + "/character";
    if (r.character.empty()) continue;
    if (const Character* c = find_character(book, r.character, where, problems))
      join_region_character(*c, where, p, r, problems);
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
  for (RegionUse& r : p.regions) {
    r.prompt = apply_style_text(it->second.prompt, r.prompt);
    if (!r.negative.empty()) r.negative = apply_style_text(it->second.negative, r.negative);
  }
}

bool prompt_has_wildcards(const GenerationParams& p) {
  return has_wildcards(joined(p));
}

void check_prompt_wildcards(const GenerationParams& p, const WildcardLibrary& lib, std::string* failed) {
  if (failed) *failed = "prompt";
  check_template(p.prompt, lib);
  if (failed) *failed = "negative";
  check_template(p.negative_prompt, lib);
  for (size_t k = 0; k < p.regions.size(); ++k) {
    if (failed) *failed = "regions/" + std::to_string(k) + "/prompt";
    check_template(p.regions[k].prompt, lib);
    if (failed) *failed = "regions/" + std::to_string(k) + "/negative";
    check_template(p.regions[k].negative, lib);
  }
  if (failed) *failed = "prompt";
  check_template(joined(p), lib);  // the expansion budget counts both, as they are expanded together
}

ImagePrompt expand_image_prompt(const GenerationParams& p, bool expand_all, int index, std::int64_t seed,
                                const WildcardLibrary& lib) {
  const Expansion e = expand_all ? expand_combination(joined(p), static_cast<std::uint64_t>(index), lib)
                                 : expand_random(joined(p), static_cast<std::uint64_t>(seed), lib);
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t cut = e.text.find(kPartSeparator); cut != std::string::npos; cut = e.text.find(kPartSeparator, start)) {
    parts.push_back(e.text.substr(start, cut - start));
    start = cut + 1;
  }
  parts.push_back(e.text.substr(start));
  parts.resize(2 + 2 * p.regions.size());
  ImagePrompt out;
  out.prompt = parts[0];
  out.negative = parts[1];
  for (size_t k = 0; k < p.regions.size(); ++k) out.regions.emplace_back(parts[2 + 2 * k], parts[3 + 2 * k]);
  out.choices = e.choices;
  return out;
}

void apply_image_prompt(ImagePrompt ip, GenerationParams& p) {
  p.prompt = std::move(ip.prompt);
  p.negative_prompt = std::move(ip.negative);
  for (size_t k = 0; k < p.regions.size() && k < ip.regions.size(); ++k) {
    p.regions[k].prompt = std::move(ip.regions[k].first);
    p.regions[k].negative = std::move(ip.regions[k].second);
  }
}

ImagePrompt task_image_prompt(const BatchTask& task, int index, std::int64_t seed, const WildcardLibrary& lib) {
  if (!prompt_has_wildcards(task.params)) {
    ImagePrompt same{task.params.prompt, task.params.negative_prompt, {}, {}};
    for (const RegionUse& r : task.params.regions) same.regions.emplace_back(r.prompt, r.negative);
    return same;
  }
  return expand_image_prompt(task.params, task.expand_all, index, seed, lib);
}

std::uint64_t prompt_combinations(const GenerationParams& p, const WildcardLibrary& lib, std::uint64_t limit) {
  return count_combinations(joined(p), lib, limit);
}

}  // namespace sdxl
