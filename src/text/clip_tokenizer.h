// CLIP byte-level BPE tokenizer, id-for-id compatible with transformers'
// CLIPTokenizer for any CLIP-format vocabulary (vocab.json + merges.txt).
// Owns its vocabulary and merge ranks; immutable after construction, so one
// instance may be used from several threads. Loading throws ModelError naming
// the file and what is wrong with it. torch-free.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sdxl {

class ClipTokenizer {
 public:
  static constexpr int kMaxLength = 77;  // CLIP context length, bos + 75 + eos

  // Reads DIR/vocab.json and DIR/merges.txt. pad_token is "<|endoftext|>" for
  // SDXL's first tokenizer and "!" for the second.
  static ClipTokenizer from_dir(const std::filesystem::path& dir, const std::string& pad_token);

  // BPE ids of the text, without start/end tokens, not truncated.
  std::vector<int32_t> encode(std::string_view text) const;

  // As CLIPTokenizer(text, padding="max_length", max_length=77, truncation=True):
  // bos, the first 75 ids, eos, then pad ids up to 77.
  std::vector<int64_t> encode_padded(std::string_view text) const;

  // Adds a textual-inversion embedding of `count` vectors as diffusers'
  // load_textual_inversion does: its name matches anywhere in the normalised
  // (NFC, lower-case, whitespace-collapsed) text, longest name first, and
  // stands for the ids first_id .. first_id + count - 1. Call before the
  // tokenizer is shared between threads. Throws ModelError when the name is
  // empty or already a token.
  void add_embedding(const std::string& name, int32_t first_id, int32_t count);
  size_t embedding_count() const { return embeddings_.size(); }
  // The name (as added) of the embedding whose vectors include `id`; nullptr
  // when `id` is not an embedding's.
  const std::string* embedding_name(int32_t id) const;

  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t pad_id() const { return pad_id_; }
  size_t vocab_size() const { return vocab_.size(); }
  // The vocabulary entry of an id ("" if out of range), e.g. for `tokens` output.
  const std::string& token_text(int32_t id) const;

 private:
  ClipTokenizer() = default;
  std::vector<int32_t> bpe_word(const std::string& word_bytes) const;

  struct Merge {
    int32_t rank;
    int32_t new_id;
  };

  void encode_segment(std::u32string_view segment, std::vector<int32_t>& ids) const;
  void encode_normalized(std::u32string_view text, std::vector<int32_t>& ids) const;

  struct AddedEmbedding {
    std::u32string name;  // normalised
    int32_t first_id;
    int32_t count;
    std::vector<std::string> texts;  // "name", "name_1", ... (token_text)
  };
  std::vector<AddedEmbedding> embeddings_;  // longest name first

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> rank, merged id
  std::vector<int32_t> byte_ids_;                // byte -> id of its symbol (unk if absent)
  std::vector<int32_t> byte_end_ids_;            // byte -> id of its symbol + "</w>"
  std::vector<std::pair<std::u32string, int32_t>> special_tokens_;  // split out before normalising
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  int32_t pad_id_ = -1;
};

}  // namespace sdxl
