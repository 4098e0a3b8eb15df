// libFuzzer target: A1111 prompt parsing and chunking on arbitrary bytes
// (unbalanced brackets, odd weights, BREAK runs, invalid UTF-8) with the stock
// vocabulary, loaded once from $SDXL_FUZZ_TOKENIZER_DIR. Aborts on any broken
// invariant: every chunk 77 ids in range and 77 finite multipliers, bos first,
// at least one chunk, tokens_used per chunk <= 75, warning positions in range.
// A1111 prompt editing (prompt_schedule.h) on the same bytes: nothing but
// UsageError thrown, end steps increasing to the steps, every step's entry and
// text in range, first pass and hires pass.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "text/clip_tokenizer.h"
#include "text/prompt_chunks.h"
#include "core/error.h"
#include "text/prompt_parser.h"
#include "text/prompt_schedule.h"

namespace {

void check_schedules(const std::string& text) {
  const int steps = 1 + static_cast<int>(text.size() % 40);
  const int hires = text.size() % 3 == 0 ? 7 : 0;
  sdxl::PassSchedules ps;
  try {
    ps = sdxl::pass_schedules(text, steps, hires);
  } catch (const sdxl::UsageError&) {
    return;  // a `when` that is no number or beyond any step
  }
  if (ps.texts.empty() || ps.passes.size() != (hires > 0 ? 2u : 1u) || ps.text_of_entry.size() != ps.passes.size())
    std::abort();
  for (size_t pass = 0; pass < ps.passes.size(); ++pass) {
    const auto& entries = ps.passes[pass].entries;
    const int n = pass == 0 ? steps : hires;
    if (entries.empty() || entries.back().end_at_step != n || ps.text_of_entry[pass].size() != entries.size())
      std::abort();
    for (size_t k = 1; k < entries.size(); ++k)
      if (entries[k].end_at_step <= entries[k - 1].end_at_step || entries[k - 1].end_at_step < 1) std::abort();
    for (int step = 0; step < n; ++step)
      if (ps.text_at(pass, step) >= ps.texts.size()) std::abort();
  }
  if (ps.texts.size() == 1 && !sdxl::prompt_has_schedule(text) && ps.texts.front() != text) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static std::unique_ptr<sdxl::ClipTokenizer> tok = [] {
    const char* dir = std::getenv("SDXL_FUZZ_TOKENIZER_DIR");
    if (!dir) std::abort();
    return std::make_unique<sdxl::ClipTokenizer>(sdxl::ClipTokenizer::from_dir(dir, "!"));
  }();
  const std::string text(reinterpret_cast<const char*>(data), size);

  std::vector<sdxl::PromptWarning> warnings;
  const auto fragments = sdxl::parse_prompt_attention(text, &warnings);
  if (fragments.empty()) std::abort();
  for (const auto& f : fragments) {
    if (!std::isfinite(f.weight) || std::fabs(f.weight) > 3.4028234663852886e38) std::abort();
    if (f.is_break != (f.text == "BREAK" && f.weight == -1)) std::abort();
  }
  for (const auto& w : warnings)
    if (w.position > size || w.message.empty()) std::abort();

  const auto got = sdxl::tokenize_prompt_counted(*tok, text, nullptr);
  if (got.chunks.empty() || got.tokens_used.size() != got.chunks.size()) std::abort();
  for (size_t k = 0; k < got.chunks.size(); ++k) {
    const auto& c = got.chunks[k];
    if (c.ids.size() != sdxl::ClipTokenizer::kMaxLength) std::abort();
    if (c.multipliers.size() != sdxl::ClipTokenizer::kMaxLength) std::abort();
    if (c.ids.front() != tok->bos_id()) std::abort();
    if (got.tokens_used[k] > sdxl::kChunkTokens) std::abort();
    for (int64_t id : c.ids)
      if (id < 0 || static_cast<size_t>(id) >= tok->vocab_size()) std::abort();
    for (float m : c.multipliers)
      if (!std::isfinite(m)) std::abort();
  }

  check_schedules(text);

  std::vector<sdxl::PromptChunk> padded = got.chunks;
  sdxl::pad_chunks(*tok, padded, got.chunks.size() + 2);
  if (padded.size() != got.chunks.size() + 2 || padded.back().ids != sdxl::empty_chunk(*tok).ids) std::abort();
  return 0;
}
