// The text rule for batch files (core/input_text.h), applied to every string
// and key of the JSON before anything reads it. torch-free.
//
// "prompt" and "negative" (of a task, the defaults, a character, a style) are
// free text: a tab and a line break are allowed (A1111 prompts may span
// lines). Every other string (ids, names, paths, sampler names, times, the
// output template) and every key is a name: one line without a tab. No string
// may hold another control character (U+0000-U+001F, U+007F-U+009F): such a
// character would move text between the prompt and the negative, end a PNG
// text chunk, or start a line of its own in the PNG's parameters.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "batch/batch_file.h"

namespace sdxl {

// Adds a problem for each string or key of `j` that breaks the rule.
void check_batch_strings(const nlohmann::json& j, std::vector<BatchProblem>& problems);

}  // namespace sdxl
