// `sdxl-batch keys`: every task key of a batch file from the library's table — type and range,
// default, the A1111 field it writes, its place in the manifest, whether it splits a UNet batch,
// its `generate` flag. --markdown prints the table docs/batch-files.md holds, --json the entries.
// A client of the public API alone.
#include <sdxl_batch/sdxl_batch.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"

namespace sdxl::cli {

struct KeysArgs {
  bool json = false, markdown = false;
};

CLI::App* add_keys(CLI::App& app, std::shared_ptr<KeysArgs>& args) {
  args = std::make_shared<KeysArgs>();
  auto* cmd = app.add_subcommand("keys", "List the task keys of a batch file: type, range, default, A1111 field, "
                                         "manifest field, batching, generate flag");
  auto* json = cmd->add_flag("--json", args->json, "One JSON array of the keys");
  cmd->add_flag("--markdown", args->markdown, "The table of docs/batch-files.md")->excludes(json);
  return cmd;
}

namespace {

// A table cell: "–" when empty, "|" escaped.
std::string cell(const std::string& v) {
  if (v.empty()) return "–";
  std::string out;
  for (const char c : v) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

std::string code(const std::string& v) { return v.empty() ? "–" : "`" + v + "`"; }

void print_markdown(const std::vector<sdxl_batch::TaskKeyInfo>& keys) {
  std::cout << "| key | type | range | default | in defaults | A1111 field | manifest | splits a batch | remakes | "
               "generate | what |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& k : keys)
    std::cout << "| `" << k.name << "` | " << k.type << " | " << cell(k.range) << " | " << cell(k.default_text)
              << " | " << (k.in_defaults ? "yes" : "no") << " | " << cell(k.a1111) << " | " << code(k.manifest)
              << " | " << k.split << " | " << (k.remakes ? "yes" : "no") << " | " << code(k.generate_flag) << " | "
              << cell(k.summary) << " |\n";
}

nlohmann::json keys_json(const std::vector<sdxl_batch::TaskKeyInfo>& keys) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& k : keys) {
    nlohmann::json j = {{"name", k.name},         {"type", k.type},
                        {"in_defaults", k.in_defaults}, {"range", k.range},
                        {"default", k.default_text}, {"a1111", k.a1111},
                        {"manifest", k.manifest}, {"split", k.split},
                        {"remakes", k.remakes},   {"generate_flag", k.generate_flag},
                        {"summary", k.summary}};
    if (k.type == "integer" || k.type == "number" || k.type == "duration") {
      j["minimum"] = k.lo;
      j["maximum"] = k.hi;
    }
    if (k.multiple_of > 0) j["multiple_of"] = k.multiple_of;
    if (!k.choices.empty()) j["choices"] = k.choices;
    out.push_back(j);
  }
  return out;
}

}  // namespace

int run_keys(const KeysArgs& args) {
  const std::vector<sdxl_batch::TaskKeyInfo> keys = sdxl_batch::task_keys();
  if (args.json) {
    std::cout << keys_json(keys).dump(2) << "\n";
  } else if (args.markdown) {
    print_markdown(keys);
  } else {
    for (const auto& k : keys)
      std::cout << k.name << " (" << k.type << (k.range.empty() ? "" : ", " + k.range)
                << (k.in_defaults ? "" : ", task only") << "): " << k.summary << "\n";
  }
  return 0;
}

}  // namespace sdxl::cli
