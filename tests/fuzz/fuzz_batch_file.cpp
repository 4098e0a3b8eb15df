// libFuzzer target: the batch-file parser, validator, line scanner and name
// templates must never crash, hang or read out of bounds on any input.
#include <cstddef>
#include <cstdint>
#include <string>

#include "batch/batch_file.h"
#include "core/error.h"
#include "core/units.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<sdxl::BatchProblem> problems;
  const sdxl::BatchFile bf = sdxl::parse_batch_text(text, "fuzz.json", sdxl::GenerationParams{}, &problems);
  (void)sdxl::json_pointer_lines(text);
  for (const auto& t : bf.tasks) {
    for (int i = 0; i < std::min(t.count, 3); ++i) (void)sdxl::output_file_name(t, i, t.params.seed, bf.name_template, "2026-01-01");
  }
  (void)sdxl::check_name_template(text);
  try {
    (void)sdxl::parse_shard(text);
  } catch (const sdxl::Error&) {
  }
  try {
    (void)sdxl::parse_duration_s(text);
  } catch (const sdxl::Error&) {
  }
  return 0;
}
