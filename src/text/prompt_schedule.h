// A1111 (stable-diffusion-webui) prompt editing and alternation: "[from:to:when]",
// "[to:when]", "[from::when]" and "[a|b|c]", nested, read as modules/prompt_parser.py's
// lark grammar reads them (get_learned_conditioning_prompt_schedules). A prompt
// becomes a schedule: texts, each an ordinary prompt for parse_prompt_attention
// (emphasis and BREAK hold inside each), with the last sampler step it holds.
// tests/reference/prompt_schedule_reference.py is the Python reference (lark, A1111's
// grammar) of the goldens tests/reference/prompt_schedule_goldens.json.
// Pure functions, torch-free. Throw UsageError where A1111 fails too (a `when`
// whose step is infinite) and for a "[from:to:when]" whose `when` is not a number
// (A1111 reads that group as text). Groups nested deeper than kMaxScheduleNesting
// are read as text (A1111's recursion fails on such depths).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sdxl {

constexpr size_t kMaxScheduleNesting = 100;  // groups inside groups

// One text of a schedule and the last step it holds for (A1111's end_at_step).
struct PromptScheduleEntry {
  int end_at_step = 0;
  std::string text;
};

// At least one entry; end_at_step strictly increasing, the last one the steps.
struct PromptSchedule {
  std::vector<PromptScheduleEntry> entries;
  bool edited() const { return entries.size() > 1; }
  // The entry sampler step `step` (0-based, as A1111's denoiser counts its calls)
  // uses: the first whose end_at_step >= step, else the first (reconstruct_cond_batch).
  size_t index_at(int step) const;
};

// The schedule of `prompt` over `steps` sampler steps (>= 1). A `when` with a
// decimal point is a fraction of the steps, an integer a step number; both are
// truncated toward zero and capped at the steps. For a hires pass give the first
// pass's steps as base_steps and the pass's own as hires_steps: an integer then
// counts from the end of the first pass and a fraction from 1.0 ("[a:b:1.5]":
// halfway through the hires pass). A prompt A1111's grammar cannot parse (a '|'
// outside "[...]", a trailing '\') is one entry of the prompt as written.
PromptSchedule prompt_schedule(std::string_view prompt, int base_steps, std::optional<int> hires_steps = {});

// A prompt's schedules over a run's passes: the first pass of `steps`, and
// when hires_steps > 0 the hires pass (prompt_schedule's hires rule), with the
// distinct texts they use. A prompt without edits has one text, the prompt as written.
struct PassSchedules {
  std::vector<std::string> texts;                  // distinct, in order of first use
  std::vector<PromptSchedule> passes;              // one per pass
  std::vector<std::vector<size_t>> text_of_entry;  // per pass, per entry: its index in texts
  // The text of sampler step `step` (from 0) of pass `pass`, as PromptSchedule::index_at.
  size_t text_at(size_t pass, int step) const { return text_of_entry[pass][passes[pass].index_at(step)]; }
};
PassSchedules pass_schedules(std::string_view prompt, int steps, int hires_steps);

// Whether the prompt contains any edit or alternation (its schedule has more
// than one text for some step count). Throws as prompt_schedule.
bool prompt_has_schedule(std::string_view prompt);

}  // namespace sdxl
