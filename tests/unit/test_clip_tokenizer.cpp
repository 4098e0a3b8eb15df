// ClipTokenizer against transformers' CLIPTokenizer goldens (both SDXL tokenizers),
// plus a hand-made vocabulary and the loading errors. The stock tokenizers and the
// goldens come from $SDXL_FIXTURES_DIR (tiny-model/tokenizer{,_2}, goldens/tokenizer.json,
// made by scripts/export/clip_vocab.py and tests/reference/gen_tokenizer_goldens.py); tests that
// need them skip when the variable is unset.
#include <gtest/gtest.h>

#include "stock_fixtures.h"

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "text/clip_tokenizer.h"
#include "core/error.h"

namespace sdxl {
namespace {

namespace fs = std::filesystem;

using fixtures::escaped;


void check_goldens(const ClipTokenizer& tok, const nlohmann::json& golden, const std::string& name) {
  size_t checked = 0;
  for (const auto& c : golden.at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    const auto& want = c.at(name);
    EXPECT_EQ(tok.encode(text), want.at("ids").get<std::vector<int32_t>>()) << name << " encode " << escaped(text);
    EXPECT_EQ(tok.encode_padded(text), want.at("padded").get<std::vector<int64_t>>())
        << name << " encode_padded " << escaped(text);
    ++checked;
  }
  EXPECT_GE(checked, 200u);
}

TEST(ClipTokenizerGolden, Tokenizer1MatchesTransformers) {
  REQUIRE_STOCK("tokenizer.json");
  check_goldens(*st->tokenizer, st->golden, "tokenizer");
}

TEST(ClipTokenizerGolden, Tokenizer2MatchesTransformers) {
  REQUIRE_STOCK("tokenizer.json");
  check_goldens(*st->tokenizer_2, st->golden, "tokenizer_2");
}

TEST(ClipTokenizerGolden, SpecialTokenIds) {
  REQUIRE_STOCK("tokenizer.json");
  for (const auto& [name, tok] : {std::pair{"tokenizer", st->tokenizer}, {"tokenizer_2", st->tokenizer_2}}) {
    const auto& meta = st->golden.at("tokenizers").at(name);
    EXPECT_EQ(tok->bos_id(), meta.at("bos_id").get<int32_t>()) << name;
    EXPECT_EQ(tok->eos_id(), meta.at("eos_id").get<int32_t>()) << name;
    EXPECT_EQ(tok->pad_id(), meta.at("pad_id").get<int32_t>()) << name;
    EXPECT_EQ(tok->vocab_size(), meta.at("vocab_size").get<size_t>()) << name;
    EXPECT_EQ(tok->token_text(tok->bos_id()), "<|startoftext|>");
    EXPECT_EQ(tok->token_text(tok->eos_id()), "<|endoftext|>");
    EXPECT_EQ(tok->token_text(tok->pad_id()), meta.at("pad_token").get<std::string>());
    EXPECT_EQ(tok->token_text(-1), "");
    EXPECT_EQ(tok->token_text(static_cast<int32_t>(tok->vocab_size())), "");
  }
  EXPECT_EQ(st->tokenizer->bos_id(), 49406);
  EXPECT_EQ(st->tokenizer->eos_id(), 49407);
  EXPECT_EQ(st->tokenizer->pad_id(), 49407);
  EXPECT_EQ(st->tokenizer_2->pad_id(), 0);
  EXPECT_EQ(st->tokenizer->token_text(320), "a</w>");
}

TEST(ClipTokenizerGolden, PadIdsDifferBetweenTokenizers) {
  REQUIRE_STOCK("tokenizer.json");
  EXPECT_NE(st->tokenizer->pad_id(), st->tokenizer_2->pad_id());
  const auto p1 = st->tokenizer->encode_padded("a cat");
  const auto p2 = st->tokenizer_2->encode_padded("a cat");
  ASSERT_EQ(p1.size(), 77u);
  ASSERT_EQ(p2.size(), 77u);
  EXPECT_EQ(std::vector<int64_t>(p1.begin(), p1.begin() + 4), std::vector<int64_t>(p2.begin(), p2.begin() + 4));
  EXPECT_EQ(p1[4], 49407);
  EXPECT_EQ(p2[4], 0);
  // "!" is a special token of the second tokenizer only: split out, never merged.
  EXPECT_EQ(st->tokenizer_2->encode("wow!!"), (std::vector<int32_t>{st->tokenizer_2->encode("wow")[0], 0, 0}));
  EXPECT_EQ(st->tokenizer->encode("wow!!").size(), 2u);
}

TEST(ClipTokenizerGolden, TruncatesToSeventySevenIds) {
  REQUIRE_STOCK("tokenizer.json");
  const ClipTokenizer& tok = *st->tokenizer;
  std::string long_text;
  for (int i = 0; i < 120; ++i) long_text += "word ";
  const auto ids = tok.encode(long_text);
  ASSERT_EQ(ids.size(), 120u);  // encode never truncates
  const auto padded = tok.encode_padded(long_text);
  ASSERT_EQ(padded.size(), static_cast<size_t>(ClipTokenizer::kMaxLength));
  EXPECT_EQ(padded.front(), tok.bos_id());
  EXPECT_EQ(padded.back(), tok.eos_id());
  for (size_t i = 0; i < 75; ++i) EXPECT_EQ(padded[i + 1], ids[i]) << i;

  const auto empty = st->tokenizer_2->encode_padded("");
  ASSERT_EQ(empty.size(), 77u);
  EXPECT_EQ(empty[0], 49406);
  EXPECT_EQ(empty[1], 49407);
  for (size_t i = 2; i < 77; ++i) EXPECT_EQ(empty[i], 0) << i;
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(ClipTokenizerGolden, ConcurrentUseGivesSameIds) {
  REQUIRE_STOCK("tokenizer.json");
  const ClipTokenizer& tok = *st->tokenizer_2;
  std::vector<std::string> texts;
  for (const auto& c : st->golden.at("cases")) texts.push_back(c.at("text").get<std::string>());
  std::vector<std::vector<int32_t>> expected;
  for (const auto& t : texts) expected.push_back(tok.encode(t));
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < texts.size(); ++i) {
        const size_t k = (i + static_cast<size_t>(t) * 37) % texts.size();
        if (tok.encode(texts[k]) != expected[k]) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(ClipTokenizerGolden, InvalidUtf8BecomesReplacementCharacter) {
  REQUIRE_STOCK("tokenizer.json");
  const ClipTokenizer& tok = *st->tokenizer;
  EXPECT_EQ(tok.encode("a\xff" "b"), tok.encode("a\xEF\xBF\xBD" "b"));
  EXPECT_EQ(tok.encode("\xE6\x97"), tok.encode("\xEF\xBF\xBD"));  // truncated 3-byte sequence
  EXPECT_EQ(tok.encode("\xED\xA0\x80"), tok.encode("\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"));  // surrogate
}

// ---------------------------------------------------------------- hand-made vocabularies

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("sdxl_tok_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  void write(const std::string& name, const std::string& content) const {
    std::ofstream(path_ / name, std::ios::binary) << content;
  }

 private:
  fs::path path_;
};

// A 13-entry vocabulary: no byte symbols beyond these, so anything else is unknown.
const char* kTinyVocab = R"({"<|startoftext|>": 0, "<|endoftext|>": 1, "l": 2, "o</w>": 3, "h": 4, "e": 5,
  "he": 6, "ll": 7, "llo</w>": 8, "hello</w>": 9, "x</w>": 10, "!</w>": 11, "e</w>": 12})";
const char* kTinyMerges = "#version: 0.2\nh e\nl l\nll o</w>\nhe llo</w>\n";

TEST(ClipTokenizerTiny, EncodesWithHandMadeVocabulary) {
  TempDir dir;
  dir.write("vocab.json", kTinyVocab);
  dir.write("merges.txt", kTinyMerges);
  const ClipTokenizer tok = ClipTokenizer::from_dir(dir.path(), "<|endoftext|>");
  EXPECT_EQ(tok.vocab_size(), 13u);
  EXPECT_EQ(tok.bos_id(), 0);
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.pad_id(), 1);
  EXPECT_EQ(tok.token_text(9), "hello</w>");
  EXPECT_EQ(tok.encode("hello"), (std::vector<int32_t>{9}));
  EXPECT_EQ(tok.encode("  HeLLo\tX  "), (std::vector<int32_t>{9, 10}));
  EXPECT_EQ(tok.encode("hex"), (std::vector<int32_t>{6, 10}));          // "h e" merges, "e x</w>" does not exist
  EXPECT_EQ(tok.encode("hello!"), (std::vector<int32_t>{9, 11}));       // punctuation is its own word
  EXPECT_EQ(tok.encode("he"), (std::vector<int32_t>{4, 12}));           // "h e</w>" is not a merge
  EXPECT_EQ(tok.encode("z"), (std::vector<int32_t>{1}));                // unknown symbol -> "<|endoftext|>"
  EXPECT_EQ(tok.encode("hello<|endoftext|>x"), (std::vector<int32_t>{9, 1, 10}));
  const auto padded = tok.encode_padded("hello x");
  ASSERT_EQ(padded.size(), 77u);
  EXPECT_EQ(padded[0], 0);
  EXPECT_EQ(padded[1], 9);
  EXPECT_EQ(padded[2], 10);
  EXPECT_EQ(padded[3], 1);
  EXPECT_EQ(padded[76], 1);
}

TEST(ClipTokenizerTiny, PadTokenIsSplitOutAsSpecial) {
  TempDir dir;
  dir.write("vocab.json", kTinyVocab);
  dir.write("merges.txt", kTinyMerges);
  const ClipTokenizer tok = ClipTokenizer::from_dir(dir.path(), "he");
  EXPECT_EQ(tok.pad_id(), 6);
  EXPECT_EQ(tok.encode("hello"), (std::vector<int32_t>{6, 8}));  // "he" special, then "llo</w>"
  EXPECT_EQ(tok.encode_padded("").back(), 6);
}

std::string error_of(const fs::path& dir, const std::string& pad = "<|endoftext|>") {
  try {
    (void)ClipTokenizer::from_dir(dir, pad);
  } catch (const ModelError& e) {
    return e.what();
  }
  return "(no ModelError thrown)";
}

TEST(ClipTokenizerErrors, MissingFilesNameTheFile) {
  TempDir dir;
  std::string msg = error_of(dir.path());
  EXPECT_NE(msg.find((dir.path() / "vocab.json").string()), std::string::npos) << msg;
  dir.write("vocab.json", kTinyVocab);
  msg = error_of(dir.path());
  EXPECT_NE(msg.find((dir.path() / "merges.txt").string()), std::string::npos) << msg;
  msg = error_of(dir.path() / "does-not-exist");
  EXPECT_NE(msg.find("vocab.json"), std::string::npos) << msg;
}

TEST(ClipTokenizerErrors, MalformedVocabNamesTheFile) {
  TempDir dir;
  dir.write("merges.txt", kTinyMerges);
  const std::string vocab_path = (dir.path() / "vocab.json").string();
  for (const char* bad : {R"({"a": 1,)", "not json", "[1, 2, 3]", "{}", R"({"<|endoftext|>": "one"})",
                          R"({"<|endoftext|>": -4})", R"({"<|endoftext|>": 1.5})"}) {
    dir.write("vocab.json", bad);
    const std::string msg = error_of(dir.path());
    EXPECT_NE(msg.find(vocab_path), std::string::npos) << bad << " -> " << msg;
  }
}

TEST(ClipTokenizerErrors, PadTokenNotInVocabNamesFileAndToken) {
  TempDir dir;
  dir.write("vocab.json", kTinyVocab);
  dir.write("merges.txt", kTinyMerges);
  const std::string msg = error_of(dir.path(), "<pad>");
  EXPECT_NE(msg.find((dir.path() / "vocab.json").string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("<pad>"), std::string::npos) << msg;
  dir.write("vocab.json", R"({"<|endoftext|>": 0})");
  EXPECT_NE(error_of(dir.path()).find("<|startoftext|>"), std::string::npos);
}

TEST(ClipTokenizerErrors, MalformedMergesNameFileAndLine) {
  TempDir dir;
  dir.write("vocab.json", kTinyVocab);
  const std::string merges_path = (dir.path() / "merges.txt").string();
  dir.write("merges.txt", "#version: 0.2\nh e\nl l x\n");
  std::string msg = error_of(dir.path());
  EXPECT_NE(msg.find(merges_path + ":3"), std::string::npos) << msg;
  dir.write("merges.txt", "h e\nq r\n");
  msg = error_of(dir.path());
  EXPECT_NE(msg.find(merges_path + ":2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"q\""), std::string::npos) << msg;
  dir.write("merges.txt", "h l\n");  // "hl" is not in the vocabulary
  msg = error_of(dir.path());
  EXPECT_NE(msg.find("\"hl\""), std::string::npos) << msg;
}

}  // namespace
}  // namespace sdxl
