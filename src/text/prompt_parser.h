// A1111 (stable-diffusion-webui) prompt emphasis syntax: "(text)" x1.1,
// "[text]" /1.1, "(text:1.3)", nesting multiplies, "\(" "\)" "\[" "\]" "\\"
// literal, BREAK. A port of modules/prompt_parser.py parse_prompt_attention;
// tests/reference/prompt_reference.py is the Python reference the goldens come from.
// Pure function, never throws on any input: malformed syntax is read the way
// A1111 reads it and reported as a PromptWarning. torch-free.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace sdxl {

// One run of prompt text with its emphasis weight. A BREAK is {"BREAK", -1, true}.
// As in A1111, is_break is decided after weights are applied: a BREAK inside
// brackets gets the brackets' weight and is then the plain word "BREAK".
struct PromptFragment {
  std::string text;
  double weight = 1.0;
  bool is_break = false;
};

// Something odd in the prompt syntax. position counts code points from 0
// (each invalid UTF-8 byte counts as one).
struct PromptWarning {
  size_t position = 0;
  std::string message;
};

// The fragments of the prompt, runs of equal weight merged; [{"", 1.0}] for a
// prompt without text. Exactly A1111's result, except where A1111 would raise
// or overflow: a weight float() rejects (":1.2.3)", ":.)") or beyond the float32
// range is kept as text, and products beyond the float32 range are clamped.
// Warnings (sorted by position) are appended to *warnings when it is non-null.
std::vector<PromptFragment> parse_prompt_attention(std::string_view text, std::vector<PromptWarning>* warnings);

}  // namespace sdxl
