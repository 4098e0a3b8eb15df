// The embedding files of --embedding-dir / "embeddings_dir" without loading
// them into a model: their names and vector counts from the safetensors
// headers, for what counts tokens before a run (`validate`, `tokens`).
// torch-free (lora/embeddings.h loads them into the encoders).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "text/clip_tokenizer.h"
#include "text/prompt_chunks.h"

namespace sdxl {

class SafetensorsFile;

struct EmbeddingFile {
  std::string name;  // the file's stem: what prompts write
  std::filesystem::path path;
  int vectors = 0;
  std::string short_hash;  // A1111's: the first 12 hex digits of the file's sha256 (set by load_embeddings)
};

// Every *.safetensors of the folders, each folder's in name order.
std::vector<std::filesystem::path> list_embedding_files(const std::vector<std::filesystem::path>& dirs);

// Names and vector counts (clip_l's rows). Throws UsageError naming the file
// when it is not an SDXL embedding (no clip_l / clip_g, not 2-D, counts differ).
std::vector<EmbeddingFile> scan_embedding_files(const std::vector<std::filesystem::path>& dirs);

// What load_embeddings requires of a file's vectors before the model changes,
// checked without torch so that `validate` refuses what the run would:
// clip_l and clip_g of a float dtype (F32, F16, BF16, F64), `width_l` and
// `width_g` columns (the encoders' widths; 0: not checked), every value
// finite. Throws UsageError naming the file and the tensor.
void check_embedding_vectors(const SafetensorsFile& f, std::int64_t width_l, std::int64_t width_g);

// Adds the embeddings' tokens to a tokenizer, in the order given, with ids
// from `first_id` on (the row count of the encoder's token embedding, which
// the loaded model appends their vectors to; the vocabulary size otherwise).
// Throws UsageError naming the file for a name that is a token already.
void add_embedding_tokens(ClipTokenizer& tokenizer, const std::vector<EmbeddingFile>& files, std::int32_t first_id);

// Appends to `names` the embeddings whose vectors `chunks` hold (by
// ClipTokenizer::embedding_name), in order of first use, each name once.
void collect_used_embeddings(const ClipTokenizer& tokenizer, const std::vector<PromptChunk>& chunks,
                             std::vector<std::string>& names);

}  // namespace sdxl
