// Port of stable-diffusion-webui modules/sd_hijack_clip.py
// FrozenCLIPEmbedderWithCustomWordsBase.tokenize_line / empty_chunk /
// process_tokens, without textual-inversion embeddings. Keep it in step with
// tests/reference/prompt_reference.py (Chunker): the goldens compare the two.
#include "text/prompt_chunks.h"

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <utility>

namespace sdxl {
namespace {

// A1111 compares with vocab[",</w>"]; -1 (never equal to an id) if the vocabulary lacks it.
int32_t comma_token(const ClipTokenizer& tokenizer) {
  const std::vector<int32_t> ids = tokenizer.encode(",");
  if (ids.size() == 1 && tokenizer.token_text(ids[0]) == ",</w>") return ids[0];
  for (size_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (tokenizer.token_text(static_cast<int32_t>(id)) == ",</w>") return static_cast<int32_t>(id);
  }
  return -1;
}

// process_tokens: where the pad id differs from the end id (SDXL's second
// tokenizer), every id after the first end token becomes the pad id.
void pad_after_end(const ClipTokenizer& tokenizer, std::vector<int64_t>& ids) {
  if (tokenizer.eos_id() == tokenizer.pad_id()) return;
  auto end = std::find(ids.begin(), ids.end(), tokenizer.eos_id());
  if (end != ids.end()) std::fill(std::next(end), ids.end(), tokenizer.pad_id());
}

class Chunker {
 public:
  explicit Chunker(const ClipTokenizer& tokenizer) : tok_(tokenizer), comma_(comma_token(tokenizer)) {}

  TokenizedPrompt run(const std::vector<PromptFragment>& parsed) {
    for (const PromptFragment& fragment : parsed) {
      if (fragment.is_break) {
        next_chunk(/*is_last=*/false);
        continue;
      }
      const auto weight = static_cast<float>(fragment.weight);
      for (const int32_t token : tok_.encode(fragment.text)) {
        if (token == comma_) {
          last_comma_ = tokens_.size();
        } else if (kCommaPaddingBacktrack != 0 && tokens_.size() == kChunkTokens && last_comma_ != kNone &&
                   tokens_.size() - last_comma_ <= kCommaPaddingBacktrack) {
          const auto break_location = static_cast<std::ptrdiff_t>(last_comma_ + 1);
          std::vector<int64_t> reloc_tokens(tokens_.begin() + break_location, tokens_.end());
          std::vector<float> reloc_mults(mults_.begin() + break_location, mults_.end());
          tokens_.resize(last_comma_ + 1);
          mults_.resize(last_comma_ + 1);
          next_chunk(/*is_last=*/false);
          tokens_ = std::move(reloc_tokens);
          mults_ = std::move(reloc_mults);
        }
        if (tokens_.size() == kChunkTokens) next_chunk(/*is_last=*/false);
        tokens_.push_back(token);
        mults_.push_back(weight);
      }
    }
    if (!tokens_.empty() || out_.chunks.empty()) next_chunk(/*is_last=*/true);
    return std::move(out_);
  }

 private:
  static constexpr size_t kNone = static_cast<size_t>(-1);

  void next_chunk(bool is_last) {
    out_.token_count += is_last ? tokens_.size() : kChunkTokens;
    out_.tokens_used.push_back(tokens_.size());
    PromptChunk chunk;
    chunk.ids.reserve(ClipTokenizer::kMaxLength);
    chunk.ids.push_back(tok_.bos_id());
    chunk.ids.insert(chunk.ids.end(), tokens_.begin(), tokens_.end());
    chunk.ids.resize(kChunkTokens + 1, tok_.eos_id());
    chunk.ids.push_back(tok_.eos_id());
    chunk.multipliers.reserve(ClipTokenizer::kMaxLength);
    chunk.multipliers.push_back(1.0f);
    chunk.multipliers.insert(chunk.multipliers.end(), mults_.begin(), mults_.end());
    chunk.multipliers.resize(ClipTokenizer::kMaxLength, 1.0f);
    pad_after_end(tok_, chunk.ids);
    out_.chunks.push_back(std::move(chunk));
    tokens_.clear();
    mults_.clear();
    last_comma_ = kNone;
  }

  const ClipTokenizer& tok_;
  const int32_t comma_;
  std::vector<int64_t> tokens_;  // the chunk being filled, at most kChunkTokens
  std::vector<float> mults_;
  size_t last_comma_ = kNone;  // index in tokens_ of the last comma, kNone if none since the chunk began
  TokenizedPrompt out_;
};

}  // namespace

TokenizedPrompt tokenize_prompt_counted(const ClipTokenizer& tokenizer, std::string_view prompt,
                                        std::vector<PromptWarning>* warnings) {
  return Chunker(tokenizer).run(parse_prompt_attention(prompt, warnings));
}

std::vector<PromptChunk> tokenize_prompt(const ClipTokenizer& tokenizer, std::string_view prompt,
                                         std::vector<PromptWarning>* warnings) {
  return tokenize_prompt_counted(tokenizer, prompt, warnings).chunks;
}

PromptChunk empty_chunk(const ClipTokenizer& tokenizer) {
  PromptChunk chunk;
  chunk.ids.assign(ClipTokenizer::kMaxLength, tokenizer.eos_id());
  chunk.ids.front() = tokenizer.bos_id();
  pad_after_end(tokenizer, chunk.ids);
  chunk.multipliers.assign(ClipTokenizer::kMaxLength, 1.0f);
  return chunk;
}

void pad_chunks(const ClipTokenizer& tokenizer, std::vector<PromptChunk>& chunks, size_t count) {
  if (chunks.size() >= count) return;
  const PromptChunk empty = empty_chunk(tokenizer);
  chunks.resize(count, empty);
}

}  // namespace sdxl
