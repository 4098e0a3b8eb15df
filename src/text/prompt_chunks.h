// A1111 (stable-diffusion-webui) long-prompt chunking for one CLIP tokenizer:
// the emphasis-parsed prompt (prompt_parser.h) becomes chunks of 75 tokens,
// each sent to the text encoder as 77 ids (bos, 75 tokens or padding, eos).
// A port of modules/sd_hijack_clip.py tokenize_line (comma backtrack 20,
// BREAK) and process_tokens (ids after the first end token become the pad id:
// [bos, tokens..., eos, pad...]); tests/reference/prompt_reference.py is the Python
// reference of the goldens. Pure functions; never throw on any prompt. torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "text/clip_tokenizer.h"
#include "text/prompt_parser.h"

namespace sdxl {

struct PromptChunk {
  std::vector<int64_t> ids;        // ClipTokenizer::kMaxLength ids
  std::vector<float> multipliers;  // one per id: the token's emphasis weight, 1.0 at bos/eos/padding
};

struct TokenizedPrompt {
  std::vector<PromptChunk> chunks;  // at least one
  std::vector<size_t> tokens_used;  // per chunk: prompt tokens in it (0..75), the rest is padding
  size_t token_count = 0;           // A1111's count: 75 per chunk before the last, plus the last one's tokens
};

constexpr size_t kChunkTokens = 75;            // prompt tokens per chunk
constexpr size_t kCommaPaddingBacktrack = 20;  // A1111 opts.comma_padding_backtrack default

// Parses the prompt (warnings as parse_prompt_attention), tokenizes every
// fragment on its own, every token carrying its fragment's weight, and fills
// chunks of 75 tokens. When a chunk is full and a comma was among its last 20
// tokens, the tokens after that comma move to the next chunk. BREAK ends the
// chunk. An empty prompt gives one chunk (bos, eos, padding).
TokenizedPrompt tokenize_prompt_counted(const ClipTokenizer& tokenizer, std::string_view prompt,
                                        std::vector<PromptWarning>* warnings);

// tokenize_prompt_counted(...).chunks.
std::vector<PromptChunk> tokenize_prompt(const ClipTokenizer& tokenizer, std::string_view prompt,
                                         std::vector<PromptWarning>* warnings);

// A1111's empty_chunk: bos, eos, then padding; multipliers all 1.0.
PromptChunk empty_chunk(const ClipTokenizer& tokenizer);

// Appends empty chunks until there are `count` (never removes any): the
// positive and negative prompts must have as many chunks for CFG.
void pad_chunks(const ClipTokenizer& tokenizer, std::vector<PromptChunk>& chunks, size_t count);

}  // namespace sdxl
