// libFuzzer target: the report reader (`sdxl-batch report DIR`, the last shard of an array) must never
// crash, hang, grow without bound or read outside its folder on any run report or manifest planted in a
// shared output folder; a bad file is an sdxl::Error or a report left out, nothing else.
//
// The input is up to three files split at a line "----": report-shard-0-of-2.json,
// manifest-shard-0-of-2.jsonl and report-shard-1-of-2.json, written into a folder of this process; the
// folder is merged (merge_run_reports) and its page rendered, and the first file is also rendered alone as
// a run's own report.html would be.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_shape.h"
#include "report/report_html.h"
#include "scheduler/night_report.h"

namespace {

namespace fs = std::filesystem;

const fs::path& fuzz_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("sdxl_fuzz_report_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

std::vector<std::string> split_parts(const std::string& text) {
  static const std::string sep = "\n----\n";
  std::vector<std::string> parts;
  size_t at = 0;
  while (parts.size() < 2) {
    const size_t next = text.find(sep, at);
    if (next == std::string::npos) break;
    parts.push_back(text.substr(at, next - at));
    at = next + sep.size();
  }
  parts.push_back(text.substr(at));
  return parts;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // the warnings for reports left out are expected here
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<std::string> parts = split_parts(std::string(reinterpret_cast<const char*>(data), size));
  const fs::path& dir = fuzz_dir();
  const char* names[] = {"report-shard-0-of-2.json", "manifest-shard-0-of-2.jsonl", "report-shard-1-of-2.json"};
  for (size_t i = 0; i < 3; ++i) {
    std::error_code ec;
    fs::remove(dir / names[i], ec);
    if (i < parts.size()) std::ofstream(dir / names[i], std::ios::binary) << parts[i];
  }
  try {
    const nlohmann::json merged = sdxl::merge_run_reports(dir);
    (void)sdxl::render_report_html(merged, {});
    (void)merged.dump();
  } catch (const sdxl::Error&) {
  }
  // A run report rendered alone (the page tolerates any JSON of a depth the reader accepts).
  if (!sdxl::check_json_shape(parts[0]).too_deep) {
    const nlohmann::json r = nlohmann::json::parse(parts[0], nullptr, /*allow_exceptions=*/false);
    if (!r.is_discarded()) (void)sdxl::render_report_html(r, {"data:image/png;base64,AAAA"});
  }
  return 0;
}
