// libFuzzer target: the CLIP tokenizer on arbitrary bytes (invalid UTF-8,
// special-token look-alikes, long runs) with the stock vocabulary, loaded once
// from $SDXL_FUZZ_TOKENIZER_DIR.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "text/clip_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static std::unique_ptr<sdxl::ClipTokenizer> tok = [] {
    const char* dir = std::getenv("SDXL_FUZZ_TOKENIZER_DIR");
    if (!dir) std::abort();
    return std::make_unique<sdxl::ClipTokenizer>(sdxl::ClipTokenizer::from_dir(dir, "!"));
  }();
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto ids = tok->encode(text);
  for (int32_t id : ids)
    if (id < 0 || static_cast<size_t>(id) >= tok->vocab_size()) std::abort();
  if (tok->encode_padded(text).size() != sdxl::ClipTokenizer::kMaxLength) std::abort();
  return 0;
}
