// Story tools of batch files: characters (a prompt fragment, a negative and
// LoRAs that join a task's), styles (A1111's: "{prompt}" marks where the
// task's prompt goes, else the style is appended) and the per-image expansion
// of wildcard prompts (batch/wildcards.h). torch-free, pure except for
// reading wildcard files.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "batch/batch_file.h"
#include "batch/generation_params.h"
#include "batch/wildcards.h"
#include "batch/lora_ref.h"

namespace sdxl {

struct Character {
  std::string prompt, negative;
  std::vector<LoraRef> loras;
  // A reference picture (a PNG) for the task's IP-Adapter, with its scale; "" none. In a region it
  // acts there only; named by a task's "characters", everywhere.
  std::string reference;
  double reference_scale = 1.0;
};
struct Style {
  std::string prompt, negative;
};
struct StoryBook {
  std::map<std::string, Character> characters;
  std::map<std::string, Style> styles;
};

// A1111's rule: the style's "{prompt}" replaced by `text`, or "text, style".
std::string apply_style_text(const std::string& style, const std::string& text);

// Joins the named characters (", "-joined after the prompt; their negatives
// after the negative; their LoRAs after the task's; their reference pictures after the IP-Adapter's
// images) and then the style into `p`. A region's character joins that region only: its prompt after
// the region's, its negative after the region's (or after the task's, when the region has none) and its
// reference picture acting inside the region; the style wraps each region's texts as the task's.
// Problems as (pointer below the task, message): an unknown character or style, a LoRA named twice at
// different weights, a character with LoRAs in a region (they would act on the whole panel), a
// reference picture without the task's IP-Adapter.

void apply_story(const StoryBook& book, const std::vector<std::string>& characters, const std::string& style,
                 GenerationParams& p, std::vector<std::pair<std::string, std::string>>& problems);

// The prompt and negative of image `index` (seed `seed`) of a task whose
// prompt or negative has wildcards: drawn from the seed, or combination
// `index` with expand_all. The two texts expand as one template, so their
// choices are drawn together (prompt first).
struct ImagePrompt {
  std::string prompt, negative;
  std::vector<std::pair<std::string, std::string>> regions;  // each region's prompt and negative
  std::vector<std::string> choices;
};
// The image's texts into `p` (its prompt, negative and each region's).
void apply_image_prompt(ImagePrompt ip, GenerationParams& p);
ImagePrompt expand_image_prompt(const GenerationParams& p, bool expand_all, int index, std::int64_t seed,
                                const WildcardLibrary& lib);
// Image `index` (seed `seed`) of `task`: its prompt as expand_image_prompt
// makes it, or the task's own text when it has no wildcards.
ImagePrompt task_image_prompt(const BatchTask& task, int index, std::int64_t seed, const WildcardLibrary& lib);
// How many images expand_all makes of `p` (saturating at limit + 1).
std::uint64_t prompt_combinations(const GenerationParams& p, const WildcardLibrary& lib, std::uint64_t limit);
// Whether any text (prompt, negative, a region's) has wildcards; check_prompt_wildcards throws
// UsageError like check_template, after setting `*failed` (when given) to the text that failed:
// "prompt", "negative" or "regions/K/prompt" ("regions/K/negative").
bool prompt_has_wildcards(const GenerationParams& p);
void check_prompt_wildcards(const GenerationParams& p, const WildcardLibrary& lib, std::string* failed = nullptr);

}  // namespace sdxl
