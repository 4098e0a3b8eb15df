#include "check/folder_pins.h"

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string>

#include "core/error.h"
#include "core/input_file.h"
#include "core/sha256.h"

namespace sdxl {
namespace {

constexpr std::uint64_t kMaxModelJsonBytes = 16u << 20;

// Why folder `dir`'s files are not those its model.json (text `meta`) records, or "".
std::string listed_files_problem(const std::filesystem::path& dir, const std::string& meta) {
  const nlohmann::json j = nlohmann::json::parse(meta, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("files") || !j["files"].is_object() || j["files"].empty())
    return "its model.json lists no files: export the folder again to pin it";
  for (const auto& [name, info] : j["files"].items()) {
    const std::filesystem::path rel(name);
    bool outside = rel.is_absolute() || rel.empty();
    for (const auto& part : rel) outside |= part == "..";
    if (outside) return "its model.json lists '" + name + "', a file outside the folder";
    if (!info.is_object() || !info.contains("sha256") || !info["sha256"].is_string())
      return "its model.json records no sha256 of '" + name + "': export the folder again to pin it";
    const std::filesystem::path path = dir / rel;
    if (const std::string why = input_file_problem(path, UINT64_MAX, dir); !why.empty())
      return "'" + path.string() + "' " + why;
    const auto got = sha256_file_hex(path);
    if (!got) return "'" + path.string() + "' cannot be read";
    if (*got != info["sha256"].get<std::string>())
      return "'" + path.string() + "' has sha256 " + *got + ", its model.json records " +
             info["sha256"].get<std::string>() + ": the folder is not the one pinned";
  }
  return "";
}

}  // namespace

void check_folder_pins(const BatchFile& bf, std::vector<BatchProblem>& problems) {
  for (const BatchFile::FolderPin& pin : bf.pins) {
    const std::filesystem::path dir(pin.folder);
    std::string meta;
    try {
      meta = read_input_file(dir / "model.json", "the pinned folder's model.json", kMaxModelJsonBytes, dir);
    } catch (const UsageError& e) {
      problems.push_back({pin.pointer, e.what(), 0});
      continue;
    }
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(meta.data());
    const std::string got = sha256_hex(std::span<const std::uint8_t>(bytes, meta.size()));
    if (got != pin.sha256) {
      problems.push_back({pin.pointer, "'" + (dir / "model.json").string() + "' has sha256 " + got +
                                           ", the batch file pins " + pin.sha256 + ": the folder is not the one pinned",
                          0});
      continue;
    }
    if (const std::string why = listed_files_problem(dir, meta); !why.empty())
      problems.push_back({pin.pointer, why, 0});
  }
}

}  // namespace sdxl
