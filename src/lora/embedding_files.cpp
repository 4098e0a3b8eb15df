#include "lora/embedding_files.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "core/error.h"
#include "core/input_file.h"
#include "core/input_text.h"
#include "lora/safetensors.h"

namespace sdxl {

std::vector<std::filesystem::path> list_embedding_files(const std::vector<std::filesystem::path>& dirs) {
  std::vector<std::filesystem::path> out;
  for (const auto& dir : dirs) {
    std::error_code ec;
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      std::string ext = e.path().extension().string();
      std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
      if (ext == ".safetensors") {
        // The confinement rule (core/input_file.h): no link out of the embedding folder.
        if (const std::string why = outside_folder_problem(e.path(), dir); !why.empty())
          throw UsageError("embedding '" + e.path().string() + "' " + why);
        if (const std::string why = text_problem(e.path().stem().string(), TextKind::kName); !why.empty())
          throw UsageError("embedding '" + e.path().string() + "': its name (the file name) " + why);
        files.push_back(e.path());
      }
      if (ext == ".pt" || ext == ".pth" || ext == ".bin" || ext == ".ckpt")  // refused as LoRA pickles are
        throw UsageError("embedding '" + e.path().string() + "' is a pickle file (" + ext +
                         "); sdxl-batch does not load pickles because unpickling can run arbitrary code. Convert it "
                         "to NAME.safetensors with clip_l and clip_g, or move it out of the embedding folder");
    }
    if (ec) throw UsageError("embedding folder '" + dir.string() + "': " + ec.message());
    std::sort(files.begin(), files.end());
    out.insert(out.end(), files.begin(), files.end());
  }
  return out;
}

std::vector<EmbeddingFile> scan_embedding_files(const std::vector<std::filesystem::path>& dirs) {
  std::vector<EmbeddingFile> out;
  for (const auto& path : list_embedding_files(dirs)) {
    const SafetensorsFile f = SafetensorsFile::open(path);
    const SafetensorsTensor* l = f.find("clip_l");
    const SafetensorsTensor* g = f.find("clip_g");
    if (l == nullptr || g == nullptr)
      throw UsageError("embedding '" + f.label() + "' has no '" + (l == nullptr ? "clip_l" : "clip_g") +
                       "' tensor: an SDXL embedding holds clip_l and clip_g (an SD 1.x embedding, with emb_params " +
                       "or string_to_param, does not fit SDXL)");
    if (l->shape.size() != 2 || g->shape.size() != 2 || l->shape[0] != g->shape[0] || l->shape[0] < 1)
      throw UsageError("embedding '" + f.label() + "': clip_l and clip_g must be [n, width] with the same n");
    EmbeddingFile e;
    e.name = path.stem().string();
    e.path = path;
    e.vectors = static_cast<int>(l->shape[0]);
    out.push_back(e);
  }
  return out;
}

namespace {

// Whether every element of a float tensor is finite: its exponent bits are not all ones.
template <class Bits>
bool all_finite(const SafetensorsTensor& t, Bits exponent) {
  for (size_t at = 0; at + sizeof(Bits) <= t.bytes.size(); at += sizeof(Bits)) {
    Bits v{};
    std::memcpy(&v, t.bytes.data() + at, sizeof(Bits));  // the mapping may be unaligned
    if ((v & exponent) == exponent) return false;
  }
  return true;
}

void check_rows(const SafetensorsTensor& t, const std::string& label, std::int64_t width) {
  bool finite = true;
  if (t.dtype == "F32") finite = all_finite<std::uint32_t>(t, 0x7F800000u);
  else if (t.dtype == "F16") finite = all_finite<std::uint16_t>(t, 0x7C00u);
  else if (t.dtype == "BF16") finite = all_finite<std::uint16_t>(t, 0x7F80u);
  else if (t.dtype == "F64") finite = all_finite<std::uint64_t>(t, 0x7FF0000000000000ull);
  else
    throw UsageError("embedding '" + label + "': tensor '" + t.name + "' has dtype " + t.dtype +
                     "; expected F32, F16, BF16 or F64");
  if (width > 0 && t.shape[1] != width)
    throw UsageError("embedding '" + label + "': '" + t.name + "' has shape [" + std::to_string(t.shape[0]) + ", " +
                     std::to_string(t.shape[1]) + "], this model needs [n, " + std::to_string(width) + "]");
  if (!finite)
    throw UsageError("embedding '" + label + "': tensor '" + t.name + "' contains NaN or Inf (a broken training run?)");
}

}  // namespace

void check_embedding_vectors(const SafetensorsFile& f, std::int64_t width_l, std::int64_t width_g) {
  check_rows(*f.find("clip_l"), f.label(), width_l);  // scan_embedding_files checked both are there, 2-D
  check_rows(*f.find("clip_g"), f.label(), width_g);
}

void add_embedding_tokens(ClipTokenizer& tokenizer, const std::vector<EmbeddingFile>& files, std::int32_t first_id) {
  std::int32_t next = first_id;
  for (const EmbeddingFile& e : files) {
    try {
      tokenizer.add_embedding(e.name, next, e.vectors);
    } catch (const ModelError& err) {
      throw UsageError("'" + e.path.string() + "': " + err.what());
    }
    next += e.vectors;
  }
}

void collect_used_embeddings(const ClipTokenizer& tokenizer, const std::vector<PromptChunk>& chunks,
                             std::vector<std::string>& names) {
  for (const PromptChunk& c : chunks)
    for (const std::int64_t id : c.ids) {
      const std::string* name = tokenizer.embedding_name(static_cast<std::int32_t>(id));
      if (name != nullptr && std::find(names.begin(), names.end(), *name) == names.end()) names.push_back(*name);
    }
}

}  // namespace sdxl
