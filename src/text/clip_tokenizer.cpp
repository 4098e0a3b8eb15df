// CLIP byte-level BPE, mirroring the `tokenizers` pipeline that transformers'
// CLIPTokenizer builds (transformers 5.x, tokenizers 0.23):
//   1. special tokens (bos, eos, pad) are split out of the raw text, longest
//      match first; they are not normalised ("!" is one when it is the pad token);
//   2. each remaining segment: NFC, every \s+ run -> " ", per-code-point lowercase;
//   3. CLIP's regex <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|
//      [\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+ keeps its matches and drops the rest;
//   4. ByteLevel re-splits every match with the GPT-2 regex (only changes the
//      special-token look-alikes: "<|endoftext|>" -> "<|", "endoftext", "|>"),
//      maps bytes to printable symbols, "</w>" marks the last symbol of a word;
//   5. BPE merges by rank, lowest first, ties to the leftmost pair, exactly as
//      tokenizers' Word::merge_all (a priority queue with stale-entry checks).
// Character classes, lowercasing and NFC data come from unicode_data.cpp, which
// is probed from tokenizers itself (its components use different Unicode versions).
#include "text/clip_tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <queue>
#include <sstream>
#include <system_error>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/unicode_data.h"

namespace sdxl {
namespace {

namespace ud = unicode_data;

constexpr char32_t kReplacementChar = 0xFFFD;
constexpr char32_t kHangulSBase = 0xAC00, kHangulLBase = 0x1100, kHangulVBase = 0x1161, kHangulTBase = 0x11A7;
constexpr char32_t kHangulLCount = 19, kHangulVCount = 21, kHangulTCount = 28;
constexpr char32_t kHangulNCount = kHangulVCount * kHangulTCount, kHangulSCount = kHangulLCount * kHangulNCount;

// ---------------------------------------------------------------- UTF-8

// Decodes UTF-8; each maximal invalid subsequence becomes U+FFFD (as Python's
// bytes.decode(errors="replace")), so any byte string tokenizes.
std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      out.push_back(b0);
      ++i;
      continue;
    }
    int len = 0;
    char32_t cp = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = 2, cp = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      len = 3, cp = b0 & 0x0F;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;  // no surrogates
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      len = 4, cp = b0 & 0x07;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    } else {
      out.push_back(kReplacementChar);
      ++i;
      continue;
    }
    size_t j = 1;
    for (; j < static_cast<size_t>(len) && i + j < s.size(); ++j) {
      const auto b = static_cast<unsigned char>(s[i + j]);
      if (j == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
      cp = (cp << 6) | (b & 0x3F);
    }
    if (j == static_cast<size_t>(len)) {
      out.push_back(cp);
    } else {
      out.push_back(kReplacementChar);
    }
    i += j;
  }
  return out;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// ---------------------------------------------------------------- classes

bool in_ranges(std::span<const ud::Range> ranges, char32_t cp) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), cp,
                             [](char32_t c, const ud::Range& r) { return c < r.first; });
  return it != ranges.begin() && cp <= std::prev(it)->last;
}

bool is_letter(char32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return in_ranges(ud::kLetters, cp);
}

bool is_number(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_ranges(ud::kNumbers, cp);
}

bool is_space(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= '\t' && cp <= '\r');
  return in_ranges(ud::kSpaces, cp);
}

void append_lower(char32_t cp, std::u32string& out) {
  if (cp < 0x80) {
    out.push_back(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
    return;
  }
  auto it = std::upper_bound(ud::kLowerRuns.begin(), ud::kLowerRuns.end(), cp,
                             [](char32_t c, const ud::LowerRun& r) { return c < r.first; });
  if (it != ud::kLowerRuns.begin()) {
    const ud::LowerRun& run = *std::prev(it);
    if (cp <= run.last && (cp - run.first) % run.stride == 0) {
      out.push_back(static_cast<char32_t>(static_cast<int64_t>(cp) + run.delta));
      return;
    }
  }
  for (const ud::MultiLower& m : ud::kMultiLower) {
    if (m.cp == cp) {
      out.append(m.lower, m.length);
      return;
    }
  }
  out.push_back(cp);
}

// ---------------------------------------------------------------- NFC

uint8_t combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  auto it = std::upper_bound(ud::kCombiningClasses.begin(), ud::kCombiningClasses.end(), cp,
                             [](char32_t c, const ud::CombiningClass& r) { return c < r.first; });
  if (it == ud::kCombiningClasses.begin()) return 0;
  const ud::CombiningClass& r = *std::prev(it);
  return cp <= r.last ? r.ccc : 0;
}

void append_decomposed(char32_t cp, std::u32string& out) {
  if (cp >= kHangulSBase && cp < kHangulSBase + kHangulSCount) {
    const char32_t s = cp - kHangulSBase;
    out.push_back(kHangulLBase + s / kHangulNCount);
    out.push_back(kHangulVBase + (s % kHangulNCount) / kHangulTCount);
    if (s % kHangulTCount != 0) out.push_back(kHangulTBase + s % kHangulTCount);
    return;
  }
  auto it = std::lower_bound(ud::kDecompositions.begin(), ud::kDecompositions.end(), cp,
                             [](const ud::Decomposition& d, char32_t c) { return d.cp < c; });
  if (it != ud::kDecompositions.end() && it->cp == cp) {
    out.append(&ud::kDecompositionPool[it->offset], it->length);
  } else {
    out.push_back(cp);
  }
}

// The primary composite of a + b, or 0.
char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= kHangulLBase && a < kHangulLBase + kHangulLCount && b >= kHangulVBase && b < kHangulVBase + kHangulVCount) {
    return kHangulSBase + ((a - kHangulLBase) * kHangulVCount + (b - kHangulVBase)) * kHangulTCount;
  }
  if (a >= kHangulSBase && a < kHangulSBase + kHangulSCount && (a - kHangulSBase) % kHangulTCount == 0 &&
      b > kHangulTBase && b < kHangulTBase + kHangulTCount) {
    return a + (b - kHangulTBase);
  }
  auto it = std::lower_bound(ud::kCompositions.begin(), ud::kCompositions.end(), std::pair{a, b},
                             [](const ud::Composition& c, const std::pair<char32_t, char32_t>& key) {
                               return std::pair{c.first, c.second} < key;
                             });
  return it != ud::kCompositions.end() && it->first == a && it->second == b ? it->composite : 0;
}

// Unicode normalisation form C (UAX #15: decompose, reorder marks, recompose).
std::u32string nfc(std::u32string_view text) {
  if (std::all_of(text.begin(), text.end(), [](char32_t c) { return c < 0xC0; })) {
    return std::u32string(text);  // nothing below U+00C0 decomposes, combines or composes
  }
  std::u32string d;
  d.reserve(text.size() + 8);
  for (char32_t cp : text) append_decomposed(cp, d);

  // Canonical ordering: stable sort of each run of nonzero-class marks.
  for (size_t i = 0; i < d.size();) {
    if (combining_class(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && combining_class(d[j]) != 0) ++j;
    if (j - i > 1) {
      std::stable_sort(d.begin() + static_cast<std::ptrdiff_t>(i), d.begin() + static_cast<std::ptrdiff_t>(j),
                       [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    }
    i = j;
  }

  // Canonical composition.
  if (d.empty()) return d;
  size_t starter_pos = 0;
  int last_class = combining_class(d[0]);
  if (last_class != 0) last_class = 256;  // a leading mark blocks nothing but composes with nothing
  size_t out_pos = 1;
  for (size_t i = 1; i < d.size(); ++i) {
    const char32_t ch = d[i];
    const int ch_class = combining_class(ch);
    const char32_t composite = compose_pair(d[starter_pos], ch);
    if (composite != 0 && (last_class < ch_class || last_class == 0)) {
      d[starter_pos] = composite;
      continue;
    }
    if (ch_class == 0) starter_pos = out_pos;
    last_class = ch_class;
    d[out_pos++] = ch;
  }
  d.resize(out_pos);
  return d;
}

// ---------------------------------------------------------------- pre-tokenizer

bool starts_with_ascii(std::u32string_view s, size_t pos, std::string_view prefix) {
  if (s.size() - pos < prefix.size()) return false;
  for (size_t k = 0; k < prefix.size(); ++k) {
    if (s[pos + k] != static_cast<char32_t>(static_cast<unsigned char>(prefix[k]))) return false;
  }
  return true;
}

constexpr std::array<std::string_view, 2> kSpecialLookalikes = {"<|startoftext|>", "<|endoftext|>"};
constexpr std::array<std::string_view, 7> kContractions = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};

// Calls emit(begin, end) for each match of CLIP's regex in order, in the
// leftmost-first alternation order of the regex; unmatched text (\s) is dropped.
template <typename Emit>
void clip_pre_tokenize(std::u32string_view s, Emit&& emit) {
  size_t i = 0;
  while (i < s.size()) {
    size_t len = 0;
    for (std::string_view lit : kSpecialLookalikes) {
      if (s[i] == '<' && starts_with_ascii(s, i, lit)) {
        len = lit.size();
        break;
      }
    }
    if (len == 0 && s[i] == '\'') {
      for (std::string_view lit : kContractions) {
        if (starts_with_ascii(s, i, lit)) {
          len = lit.size();
          break;
        }
      }
    }
    if (len == 0) {
      if (is_letter(s[i])) {
        len = 1;
        while (i + len < s.size() && is_letter(s[i + len])) ++len;
      } else if (is_number(s[i])) {
        len = 1;
      } else if (!is_space(s[i])) {
        len = 1;
        while (i + len < s.size() && !is_space(s[i + len]) && !is_letter(s[i + len]) && !is_number(s[i + len])) ++len;
      }
    }
    if (len == 0) {
      ++i;  // whitespace: removed
      continue;
    }
    emit(i, i + len);
    i += len;
  }
}

// GPT-2/CLIP byte -> printable code point map (bytes_to_unicode()).
const std::array<char32_t, 256>& byte_to_unicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[static_cast<size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

std::string read_text_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw ModelError(path.string() + ": tokenizer file is missing (expected a CLIP vocab.json and merges.txt)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ModelError(path.string() + ": cannot open tokenizer file");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw ModelError(path.string() + ": cannot read tokenizer file");
  return ss.str();
}

}  // namespace

// ---------------------------------------------------------------- loading

ClipTokenizer ClipTokenizer::from_dir(const std::filesystem::path& dir, const std::string& pad_token) {
  ClipTokenizer tok;
  const std::filesystem::path vocab_path = dir / "vocab.json";
  const std::filesystem::path merges_path = dir / "merges.txt";
  const std::string vocab_text = read_text_file(vocab_path);
  const std::string merges_text = read_text_file(merges_path);

  nlohmann::json vocab_json;
  try {
    vocab_json = nlohmann::json::parse(vocab_text);
  } catch (const nlohmann::json::exception& e) {
    throw ModelError(vocab_path.string() + ": not valid JSON (" + e.what() + ")");
  }
  if (!vocab_json.is_object() || vocab_json.empty()) {
    throw ModelError(vocab_path.string() + ": expected a non-empty JSON object mapping tokens to ids");
  }
  int64_t max_id = -1;
  tok.vocab_.reserve(vocab_json.size());
  for (const auto& [token, value] : vocab_json.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      throw ModelError(vocab_path.string() + ": id of token \"" + token + "\" is not a non-negative 32-bit integer");
    }
    const auto id = static_cast<int32_t>(value.get<int64_t>());
    tok.vocab_.emplace(token, id);
    max_id = std::max<int64_t>(max_id, id);
  }
  tok.id_to_token_.resize(static_cast<size_t>(max_id) + 1);
  for (const auto& [token, id] : tok.vocab_) tok.id_to_token_[static_cast<size_t>(id)] = token;

  auto require = [&](const std::string& token, const char* role) {
    auto it = tok.vocab_.find(token);
    if (it == tok.vocab_.end()) {
      throw ModelError(vocab_path.string() + ": " + role + " token \"" + token + "\" is not in the vocabulary");
    }
    return it->second;
  };
  tok.bos_id_ = require("<|startoftext|>", "bos");
  tok.eos_id_ = require("<|endoftext|>", "eos");  // also the unknown token
  tok.pad_id_ = require(pad_token, "pad");
  for (const std::string& special : {std::string("<|startoftext|>"), std::string("<|endoftext|>"), pad_token}) {
    std::u32string s = decode_utf8(special);
    const bool seen = std::any_of(tok.special_tokens_.begin(), tok.special_tokens_.end(),
                                  [&](const auto& entry) { return entry.first == s; });
    if (!seen && !s.empty()) tok.special_tokens_.emplace_back(std::move(s), tok.vocab_.at(special));
  }

  // Byte symbols; an absent one becomes the unknown token, as in tokenizers' BPE.
  const auto& b2u = byte_to_unicode();
  tok.byte_ids_.resize(256);
  tok.byte_end_ids_.resize(256);
  for (size_t b = 0; b < 256; ++b) {
    std::string sym;
    append_utf8(b2u[b], sym);
    auto it = tok.vocab_.find(sym);
    tok.byte_ids_[b] = it == tok.vocab_.end() ? tok.eos_id_ : it->second;
    it = tok.vocab_.find(sym + "</w>");
    tok.byte_end_ids_[b] = it == tok.vocab_.end() ? tok.eos_id_ : it->second;
  }

  // merges.txt: "#version" lines skipped, then one "left right" pair per line;
  // rank = index among the pairs; a repeated pair keeps its last rank.
  std::istringstream merges_in(merges_text);
  std::string line;
  int32_t rank = 0;
  size_t line_no = 0;
  while (std::getline(merges_in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.starts_with("#version")) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      throw ModelError(merges_path.string() + ":" + std::to_string(line_no) +
                       ": expected two symbols separated by one space, got \"" + line + "\"");
    }
    const std::string left = line.substr(0, space);
    const std::string right = line.substr(space + 1);
    auto id_of = [&](const std::string& token) {
      auto it = tok.vocab_.find(token);
      if (it == tok.vocab_.end()) {
        throw ModelError(merges_path.string() + ":" + std::to_string(line_no) + ": token \"" + token +
                         "\" is not in " + vocab_path.string());
      }
      return it->second;
    };
    const int32_t left_id = id_of(left);
    const int32_t right_id = id_of(right);
    const int32_t merged_id = id_of(left + right);
    tok.merges_.insert_or_assign(pair_key(left_id, right_id), Merge{rank, merged_id});
    ++rank;
  }
  return tok;
}

const std::string& ClipTokenizer::token_text(int32_t id) const {
  static const std::string empty;
  if (id >= 0 && static_cast<size_t>(id) < id_to_token_.size()) return id_to_token_[static_cast<size_t>(id)];
  for (const AddedEmbedding& e : embeddings_)
    if (id >= e.first_id && id < e.first_id + e.count) return e.texts[static_cast<size_t>(id - e.first_id)];
  return empty;
}

const std::string* ClipTokenizer::embedding_name(int32_t id) const {
  for (const AddedEmbedding& e : embeddings_)
    if (id >= e.first_id && id < e.first_id + e.count) return &e.texts.front();
  return nullptr;
}

// ---------------------------------------------------------------- encoding

std::vector<int32_t> ClipTokenizer::bpe_word(const std::string& word_bytes) const {
  struct Symbol {
    int32_t id;
    int32_t prev;  // -1: none
    int32_t next;  // -1: none
    bool removed;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word_bytes.size());
  for (size_t i = 0; i < word_bytes.size(); ++i) {
    const auto b = static_cast<unsigned char>(word_bytes[i]);
    const bool last = i + 1 == word_bytes.size();
    symbols.push_back(Symbol{last ? byte_end_ids_[b] : byte_ids_[b], static_cast<int32_t>(i) - 1,
                             last ? -1 : static_cast<int32_t>(i) + 1, false});
  }

  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto find_merge = [&](int32_t left, int32_t right) -> const Merge* {
    auto it = merges_.find(pair_key(left, right));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = find_merge(symbols[i].id, symbols[i + 1].id)) {
      queue.push(Candidate{m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& cur = symbols[static_cast<size_t>(top.pos)];
    if (cur.removed || cur.next == -1) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = symbols[static_cast<size_t>(next_pos)];
    const Merge* still = find_merge(cur.id, right.id);
    if (still == nullptr || still->new_id != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    cur.next = right.next;
    symbols[static_cast<size_t>(next_pos)].removed = true;
    if (right.next != -1) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (cur.prev != -1) {
      if (const Merge* m = find_merge(symbols[static_cast<size_t>(cur.prev)].id, cur.id)) {
        queue.push(Candidate{m->rank, cur.prev, m->new_id});
      }
    }
    if (cur.next != -1) {
      if (const Merge* m = find_merge(cur.id, symbols[static_cast<size_t>(cur.next)].id)) {
        queue.push(Candidate{m->rank, top.pos, m->new_id});
      }
    }
  }
  std::vector<int32_t> ids;
  for (const Symbol& s : symbols) {
    if (!s.removed) ids.push_back(s.id);
  }
  return ids;
}

void ClipTokenizer::encode_segment(std::u32string_view segment, std::vector<int32_t>& ids) const {
  if (segment.empty()) return;
  const std::u32string composed = nfc(segment);
  std::u32string text;
  text.reserve(composed.size());
  for (size_t i = 0; i < composed.size();) {
    if (is_space(composed[i])) {
      text.push_back(U' ');
      while (i < composed.size() && is_space(composed[i])) ++i;
    } else {
      append_lower(composed[i++], text);
    }
  }
  // Embedding names split the normalised text first (as added tokens do).
  size_t start = 0;
  for (size_t i = 0; i < text.size() && !embeddings_.empty();) {
    const AddedEmbedding* hit = nullptr;
    for (const AddedEmbedding& e : embeddings_)
      if (std::u32string_view(text).substr(i).starts_with(e.name)) {
        hit = &e;
        break;
      }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    encode_normalized(std::u32string_view(text).substr(start, i - start), ids);
    for (int32_t k = 0; k < hit->count; ++k) ids.push_back(hit->first_id + k);
    i += hit->name.size();
    start = i;
  }
  encode_normalized(std::u32string_view(text).substr(start), ids);
}

void ClipTokenizer::add_embedding(const std::string& name, int32_t first_id, int32_t count) {
  const std::u32string raw = decode_utf8(name);
  const std::u32string composed = nfc(raw);
  std::u32string norm;
  for (char32_t cp : composed) append_lower(cp, norm);
  if (norm.empty() || count <= 0) throw ModelError("embedding '" + name + "': empty name or no vectors");
  // Prompts find the name case-insensitively (NFC, lower case), so the name in
  // that form must not be a word: "Cat" claims the same text as "cat".
  std::string norm_utf8;
  for (char32_t cp : norm) append_utf8(cp, norm_utf8);
  if (vocab_.count(name) != 0 || vocab_.count(norm_utf8) != 0)
    throw ModelError("embedding '" + name + "': the name" +
                     (norm_utf8 == name ? "" : " ('" + norm_utf8 + "' as prompts match it)") +
                     " is already a word of the tokenizer; rename the file");
  for (const AddedEmbedding& e : embeddings_)
    if (e.name == norm) throw ModelError("embedding '" + name + "' is loaded twice (two files of that name?)");
  std::vector<std::string> texts{name};
  for (int32_t k = 1; k < count; ++k) texts.push_back(name + "_" + std::to_string(k));
  embeddings_.push_back({norm, first_id, count, texts});
  std::stable_sort(embeddings_.begin(), embeddings_.end(),
                   [](const AddedEmbedding& a, const AddedEmbedding& b) { return a.name.size() > b.name.size(); });
}

void ClipTokenizer::encode_normalized(std::u32string_view view, std::vector<int32_t>& ids) const {
  if (view.empty()) return;
  std::string word;
  auto encode_word = [&](std::u32string_view piece) {
    word.clear();
    for (char32_t cp : piece) append_utf8(cp, word);
    const std::vector<int32_t> word_ids = bpe_word(word);
    ids.insert(ids.end(), word_ids.begin(), word_ids.end());
  };
  clip_pre_tokenize(view, [&](size_t begin, size_t end) {
    const std::u32string_view piece = view.substr(begin, end - begin);
    // The ByteLevel step re-splits with the GPT-2 regex, which only changes the
    // two special-token look-alikes: "<|", the name, "|>" become separate words.
    const bool lookalike = std::any_of(kSpecialLookalikes.begin(), kSpecialLookalikes.end(), [&](std::string_view lit) {
      return piece.size() == lit.size() && starts_with_ascii(piece, 0, lit);
    });
    if (lookalike) {
      encode_word(piece.substr(0, 2));
      encode_word(piece.substr(2, piece.size() - 4));
      encode_word(piece.substr(piece.size() - 2));
    } else {
      encode_word(piece);
    }
  });
}

std::vector<int32_t> ClipTokenizer::encode(std::string_view text) const {
  const std::u32string text32 = decode_utf8(text);
  const std::u32string_view view(text32);
  std::vector<int32_t> ids;
  size_t segment_start = 0;
  size_t i = 0;
  while (i < view.size()) {
    const std::pair<std::u32string, int32_t>* best = nullptr;
    for (const auto& special : special_tokens_) {
      if (view.substr(i).starts_with(special.first) && (best == nullptr || special.first.size() > best->first.size())) {
        best = &special;
      }
    }
    if (best == nullptr) {
      ++i;
      continue;
    }
    encode_segment(view.substr(segment_start, i - segment_start), ids);
    ids.push_back(best->second);
    i += best->first.size();
    segment_start = i;
  }
  encode_segment(view.substr(segment_start), ids);
  return ids;
}

std::vector<int64_t> ClipTokenizer::encode_padded(std::string_view text) const {
  const std::vector<int32_t> ids = encode(text);
  std::vector<int64_t> out;
  out.reserve(kMaxLength);
  out.push_back(bos_id_);
  const size_t body = std::min<size_t>(ids.size(), kMaxLength - 2);
  out.insert(out.end(), ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(body));
  out.push_back(eos_id_);
  out.resize(kMaxLength, pad_id_);
  return out;
}

}  // namespace sdxl
