// A1111 prompt syntax (prompt_parser.h) and chunking (prompt_chunks.h) against
// the goldens of tests/reference/prompt_reference.py for both SDXL tokenizers, plus A1111's
// own doctest examples, warnings and chunk counts. The stock tokenizers and
// goldens/prompts.json come from $SDXL_FIXTURES_DIR; tests that need them skip
// when the variable is unset.
#include <gtest/gtest.h>

#include "stock_fixtures.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/clip_tokenizer.h"
#include "text/prompt_chunks.h"
#include "text/prompt_parser.h"

namespace sdxl {
namespace {

namespace fs = std::filesystem;

using fixtures::escaped;


using Pairs = std::vector<std::pair<std::string, double>>;

Pairs pairs(const std::vector<PromptFragment>& fragments) {
  Pairs out;
  for (const auto& f : fragments) out.emplace_back(f.text, f.weight);
  return out;
}

std::string repeat_words(size_t n, const std::string& word) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += (i == 0 ? "" : " ") + word;
  return s;
}

// ---------------------------------------------------------------- goldens

TEST(PromptGolden, ParserMatchesReference) {
  REQUIRE_STOCK("prompts.json");
  size_t checked = 0;
  for (const auto& c : st->golden.at("cases")) {
    const std::string prompt = c.at("prompt").get<std::string>();
    std::vector<PromptWarning> warnings;
    const auto fragments = parse_prompt_attention(prompt, &warnings);
    const auto& want = c.at("fragments");
    ASSERT_EQ(fragments.size(), want.size()) << escaped(prompt);
    for (size_t i = 0; i < fragments.size(); ++i) {
      EXPECT_EQ(fragments[i].text, want[i][0].get<std::string>()) << escaped(prompt) << " fragment " << i;
      EXPECT_EQ(fragments[i].weight, want[i][1].get<double>()) << escaped(prompt) << " fragment " << i;
      EXPECT_EQ(fragments[i].is_break, want[i][2].get<bool>()) << escaped(prompt) << " fragment " << i;
    }
    const auto& want_warnings = c.at("warnings");
    ASSERT_EQ(warnings.size(), want_warnings.size()) << escaped(prompt);
    for (size_t i = 0; i < warnings.size(); ++i) {
      EXPECT_EQ(warnings[i].position, want_warnings[i][0].get<size_t>()) << escaped(prompt) << " warning " << i;
      EXPECT_EQ(warnings[i].message, want_warnings[i][1].get<std::string>()) << escaped(prompt) << " warning " << i;
    }
    ++checked;
  }
  EXPECT_GE(checked, 60u);
}

void check_chunks(const ClipTokenizer& tok, const nlohmann::json& golden, const std::string& name) {
  size_t checked = 0;
  for (const auto& c : golden.at("cases")) {
    const std::string prompt = c.at("prompt").get<std::string>();
    const auto& want = c.at(name);
    const TokenizedPrompt got = tokenize_prompt_counted(tok, prompt, nullptr);
    const auto& want_chunks = want.at("chunks");
    ASSERT_EQ(got.chunks.size(), want_chunks.size()) << name << " " << escaped(prompt);
    for (size_t k = 0; k < got.chunks.size(); ++k) {
      EXPECT_EQ(got.chunks[k].ids, want_chunks[k].at("ids").get<std::vector<int64_t>>())
          << name << " " << escaped(prompt) << " chunk " << k;
      std::vector<float> mults;
      for (const auto& m : want_chunks[k].at("multipliers")) mults.push_back(static_cast<float>(m.get<double>()));
      EXPECT_EQ(got.chunks[k].multipliers, mults) << name << " " << escaped(prompt) << " chunk " << k;
    }
    EXPECT_EQ(got.tokens_used, want.at("used").get<std::vector<size_t>>()) << name << " " << escaped(prompt);
    EXPECT_EQ(got.token_count, want.at("token_count").get<size_t>()) << name << " " << escaped(prompt);
    ++checked;
  }
  EXPECT_GE(checked, 60u);
  EXPECT_EQ(empty_chunk(tok).ids, golden.at("empty_chunk").at(name).get<std::vector<int64_t>>()) << name;
}

TEST(PromptGolden, Tokenizer1ChunksMatchReference) {
  REQUIRE_STOCK("prompts.json");
  check_chunks(*st->tokenizer, st->golden, "tokenizer");
}

TEST(PromptGolden, Tokenizer2ChunksMatchReference) {
  REQUIRE_STOCK("prompts.json");
  check_chunks(*st->tokenizer_2, st->golden, "tokenizer_2");
}

// ---------------------------------------------------------------- parser, by hand

// The doctest of A1111's parse_prompt_attention (modules/prompt_parser.py).
TEST(PromptParser, A1111Doctests) {
  EXPECT_EQ(pairs(parse_prompt_attention("normal text", nullptr)), (Pairs{{"normal text", 1.0}}));
  EXPECT_EQ(pairs(parse_prompt_attention("an (important) word", nullptr)),
            (Pairs{{"an ", 1.0}, {"important", 1.1}, {" word", 1.0}}));
  EXPECT_EQ(pairs(parse_prompt_attention("(unbalanced", nullptr)), (Pairs{{"unbalanced", 1.1}}));
  EXPECT_EQ(pairs(parse_prompt_attention("\\(literal\\]", nullptr)), (Pairs{{"(literal]", 1.0}}));
  EXPECT_EQ(pairs(parse_prompt_attention("(unnecessary)(parens)", nullptr)), (Pairs{{"unnecessaryparens", 1.1}}));
  EXPECT_EQ(pairs(parse_prompt_attention("a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).", nullptr)),
            (Pairs{{"a ", 1.0},
                   {"house", 1.5730000000000004},
                   {" ", 1.1},
                   {"on", 1.0},
                   {" a ", 1.1},
                   {"hill", 0.55},
                   {", sun, ", 1.1},
                   {"sky", 1.4641000000000006},
                   {".", 1.1}}));
}

TEST(PromptParser, WeightsAndNesting) {
  EXPECT_EQ(
      pairs(parse_prompt_attention("[a] [[b]] (c:1.3) ( d : 0.5 )", nullptr)),
      (Pairs{
          {"a", 1 / 1.1}, {" ", 1.0}, {"b", (1 / 1.1) * (1 / 1.1)}, {" ", 1.0}, {"c", 1.3}, {" ", 1.0}, {" d ", 0.5}}));
  EXPECT_EQ(pairs(parse_prompt_attention("((a:2):3)", nullptr)), (Pairs{{"a", 6.0}}));
  EXPECT_EQ(pairs(parse_prompt_attention("(a:-1)(b:+.5)(c:2.)", nullptr)),
            (Pairs{{"a", -1.0}, {"b", 0.5}, {"c", 2.0}}));
  // Python's \d is Unicode: float("１.５") == 1.5.
  EXPECT_EQ(pairs(parse_prompt_attention("(a:\xef\xbc\x91.\xef\xbc\x95)", nullptr)), (Pairs{{"a", 1.5}}));
  EXPECT_EQ(pairs(parse_prompt_attention("\\\\(a)", nullptr)), (Pairs{{"\\", 1.0}, {"a", 1.1}}));
}

TEST(PromptParser, BreakFragments) {
  auto f = parse_prompt_attention("a BREAK b", nullptr);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].text, "a");
  EXPECT_TRUE(f[1].is_break);
  EXPECT_EQ(f[1].text, "BREAK");
  EXPECT_EQ(f[1].weight, -1.0);
  EXPECT_EQ(f[2].text, "b");
  // \b: BREAK must stand alone as a word.
  f = parse_prompt_attention("aBREAK BREAKb BREAK_x BREAKING", nullptr);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_FALSE(f[0].is_break);
  f = parse_prompt_attention("x BREAK, y", nullptr);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_TRUE(f[1].is_break);
  EXPECT_EQ(f[2].text, ", y");
  // Inside brackets the BREAK entry takes the brackets' weight and is a word (A1111).
  std::vector<PromptWarning> w;
  f = parse_prompt_attention("(a BREAK b)", &w);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_FALSE(f[1].is_break);
  EXPECT_DOUBLE_EQ(f[1].weight, -1.1);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].position, 3u);
}

std::vector<PromptWarning> warnings_of(const std::string& prompt) {
  std::vector<PromptWarning> w;
  parse_prompt_attention(prompt, &w);
  return w;
}

TEST(PromptParser, WarningsNamePositionAndProblem) {
  auto w = warnings_of("a (b");
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].position, 2u);
  EXPECT_NE(w[0].message.find("unclosed '('"), std::string::npos) << w[0].message;

  w = warnings_of("x ] [y");
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].position, 2u);
  EXPECT_NE(w[0].message.find("unmatched ']'"), std::string::npos) << w[0].message;
  EXPECT_EQ(w[1].position, 4u);
  EXPECT_NE(w[1].message.find("unclosed '['"), std::string::npos) << w[1].message;

  // Positions count code points: "猫" is one, though three bytes.
  w = warnings_of("\xe7\x8c\xab ) y");
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].position, 2u);
  EXPECT_NE(w[0].message.find("unmatched ')'"), std::string::npos) << w[0].message;

  // A1111 would raise on float("1.2.3"): kept as text, the "(" stays open.
  std::vector<PromptWarning> ww;
  const auto f = parse_prompt_attention("(a:1.2.3) b", &ww);
  EXPECT_EQ(pairs(f), (Pairs{{"a:1.2.3) b", 1.1}}));
  ASSERT_EQ(ww.size(), 2u);
  EXPECT_EQ(ww[0].position, 0u);
  EXPECT_EQ(ww[1].position, 2u);
  EXPECT_NE(ww[1].message.find("'1.2.3' is not a usable number"), std::string::npos) << ww[1].message;

  w = warnings_of("a:1.5) b");
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].position, 1u);
  EXPECT_NE(w[0].message.find("closes no '('"), std::string::npos) << w[0].message;

  w = warnings_of("a \\ b");
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].position, 2u);

  EXPECT_TRUE(warnings_of("fine (prompt:1.2), [ok], \\(x\\) BREAK y").empty());
}

TEST(PromptParser, WeightsStayFinite) {
  std::vector<PromptWarning> w;
  auto f = parse_prompt_attention("(a:1" + std::string(60, '0') + ")", &w);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].weight, 1.1);  // the number is text, the "(" unclosed
  EXPECT_EQ(w.size(), 2u);

  w.clear();
  const std::string big = "1" + std::string(37, '0');  // 1e37: fits a float, its square does not
  f = parse_prompt_attention("((a:" + big + "):" + big + ")", &w);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].weight, static_cast<double>(std::numeric_limits<float>::max()));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].message.find("clamped"), std::string::npos);

  std::string deep;
  for (int i = 0; i < 2000; ++i) deep += "(";
  deep += "x";
  f = parse_prompt_attention(deep, nullptr);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_TRUE(std::isfinite(f[0].weight));
  std::vector<PromptWarning> deep_warnings;
  parse_prompt_attention(deep, &deep_warnings);
  EXPECT_EQ(deep_warnings.size(), 2001u);  // 2000 unclosed '(' and one clamp
}

TEST(PromptParser, EmptyAndOddBytesNeverThrow) {
  EXPECT_EQ(pairs(parse_prompt_attention("", nullptr)), (Pairs{{"", 1.0}}));
  EXPECT_EQ(pairs(parse_prompt_attention("()", nullptr)), (Pairs{{"", 1.0}}));
  const std::string odd = std::string("\xff(\xc3", 3) + std::string(1, '\0') + "\xe7\x8c" + ")]\\";
  std::vector<PromptWarning> w;
  EXPECT_NO_THROW(parse_prompt_attention(odd, &w));
  EXPECT_FALSE(w.empty());
}

// ---------------------------------------------------------------- chunks, by hand

TEST(PromptChunks, ShortPromptEqualsPaddedEncoding) {
  REQUIRE_STOCK("prompts.json");
  for (const ClipTokenizer* tok : {st->tokenizer, st->tokenizer_2}) {
    for (const std::string prompt : {"", "a photo of a cat", "masterpiece, best quality, 8k"}) {
      const auto chunks = tokenize_prompt(*tok, prompt, nullptr);
      ASSERT_EQ(chunks.size(), 1u);
      EXPECT_EQ(chunks[0].ids, tok->encode_padded(prompt)) << escaped(prompt);
      EXPECT_EQ(chunks[0].multipliers, std::vector<float>(77, 1.0f));
    }
  }
}

TEST(PromptChunks, LayoutBosTokensEosPad) {
  REQUIRE_STOCK("prompts.json");
  const ClipTokenizer& tok = *st->tokenizer_2;
  const auto chunks = tokenize_prompt(tok, "(cat:1.5) dog", nullptr);
  ASSERT_EQ(chunks.size(), 1u);
  const auto& c = chunks[0];
  ASSERT_EQ(c.ids.size(), 77u);
  ASSERT_EQ(c.multipliers.size(), 77u);
  EXPECT_EQ(c.ids[0], tok.bos_id());
  EXPECT_EQ(c.ids[1], tok.encode("cat")[0]);
  EXPECT_EQ(c.ids[2], tok.encode("dog")[0]);
  EXPECT_EQ(c.ids[3], tok.eos_id());
  for (size_t i = 4; i < 77; ++i) EXPECT_EQ(c.ids[i], tok.pad_id()) << i;
  EXPECT_EQ(c.multipliers[0], 1.0f);
  EXPECT_EQ(c.multipliers[1], 1.5f);
  EXPECT_EQ(c.multipliers[2], 1.0f);
  EXPECT_EQ(c.multipliers[3], 1.0f);
}

TEST(PromptChunks, ChunkCountOfLongPrompts) {
  REQUIRE_STOCK("prompts.json");
  const ClipTokenizer& tok = *st->tokenizer;
  ASSERT_EQ(tok.encode(repeat_words(10, "cat")).size(), 10u);  // one token per word
  for (const auto& [words, k] :
       {std::pair<size_t, size_t>{1, 1}, {75, 1}, {76, 2}, {150, 2}, {151, 3}, {300, 4}, {301, 5}}) {
    const auto got = tokenize_prompt_counted(tok, repeat_words(words, "cat"), nullptr);
    EXPECT_EQ(got.chunks.size(), k) << words << " words";
    size_t used = 0;
    for (size_t u : got.tokens_used) used += u;
    EXPECT_EQ(used, words);
    for (const auto& c : got.chunks) {
      EXPECT_EQ(c.ids.size(), 77u);
      EXPECT_EQ(c.ids.front(), tok.bos_id());
      EXPECT_EQ(c.ids.back(), tok.eos_id());
    }
  }
}

TEST(PromptChunks, CommaBacktrackWithinTwentyTokens) {
  REQUIRE_STOCK("prompts.json");
  const ClipTokenizer& tok = *st->tokenizer;
  // Comma at chunk index 55: 75 - 55 <= 20, the 19 words after it move on.
  auto got = tokenize_prompt_counted(tok, repeat_words(55, "cat") + ", " + repeat_words(40, "dog"), nullptr);
  EXPECT_EQ(got.tokens_used, (std::vector<size_t>{56, 40}));
  EXPECT_EQ(got.token_count, 115u);
  // Comma at index 54: 21 tokens back, too far: a hard cut at 75.
  got = tokenize_prompt_counted(tok, repeat_words(54, "cat") + ", " + repeat_words(40, "dog"), nullptr);
  EXPECT_EQ(got.tokens_used, (std::vector<size_t>{75, 20}));
}

TEST(PromptChunks, BreakEndsTheChunk) {
  REQUIRE_STOCK("prompts.json");
  const ClipTokenizer& tok = *st->tokenizer;
  auto got = tokenize_prompt_counted(tok, "cat BREAK dog", nullptr);
  EXPECT_EQ(got.tokens_used, (std::vector<size_t>{1, 1}));
  got = tokenize_prompt_counted(tok, "BREAK cat", nullptr);
  EXPECT_EQ(got.tokens_used, (std::vector<size_t>{0, 1}));
  got = tokenize_prompt_counted(tok, "cat BREAK", nullptr);
  EXPECT_EQ(got.tokens_used, (std::vector<size_t>{1}));
  got = tokenize_prompt_counted(tok, "cat BREAK BREAK dog", nullptr);
  EXPECT_EQ(got.tokens_used, (std::vector<size_t>{1, 0, 1}));
  EXPECT_EQ(got.chunks[1].ids, empty_chunk(tok).ids);
}

TEST(PromptChunks, PadChunks) {
  REQUIRE_STOCK("prompts.json");
  for (const ClipTokenizer* tok : {st->tokenizer, st->tokenizer_2}) {
    auto chunks = tokenize_prompt(*tok, "a cat", nullptr);
    const auto first = chunks[0].ids;
    pad_chunks(*tok, chunks, 3);
    ASSERT_EQ(chunks.size(), 3u);
    EXPECT_EQ(chunks[0].ids, first);
    const PromptChunk empty = empty_chunk(*tok);
    EXPECT_EQ(empty.ids, tok->encode_padded(""));
    EXPECT_EQ(empty.multipliers, std::vector<float>(77, 1.0f));
    EXPECT_EQ(chunks[1].ids, empty.ids);
    EXPECT_EQ(chunks[2].multipliers, empty.multipliers);
    pad_chunks(*tok, chunks, 1);  // never removes
    EXPECT_EQ(chunks.size(), 3u);
    // Positive and negative end up with the same count.
    auto pos = tokenize_prompt(*tok, repeat_words(200, "cat"), nullptr);
    auto neg = tokenize_prompt(*tok, "", nullptr);
    const size_t n = std::max(pos.size(), neg.size());
    pad_chunks(*tok, pos, n);
    pad_chunks(*tok, neg, n);
    EXPECT_EQ(pos.size(), 3u);
    EXPECT_EQ(neg.size(), 3u);
  }
}

}  // namespace
}  // namespace sdxl
