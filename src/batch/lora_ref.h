// LoRA references as users write them (`--lora FILE[:WEIGHT]`, batch-file
// entries, A1111 prompt tags `<lora:NAME:WEIGHT>`) and how names resolve to
// files.
// torch-free; all functions are pure except resolve_lora (reads the disk).
// Errors are UsageError naming the flag, tag or the directories searched.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace sdxl {

struct LoraRef {
  std::string name;             // display name (registry name, tag name or file stem)
  std::filesystem::path path;   // resolved file
  double weight = 1.0;
  bool pin = false;             // never evicted from the cache
  bool operator==(const LoraRef& o) const { return path == o.path && weight == o.weight; }
};

struct LoraRegistryEntry {
  std::filesystem::path path;
  bool pin = false;
};
using LoraRegistry = std::map<std::string, LoraRegistryEntry>;

// "FILE[:WEIGHT]" (the weight is the text after the last ':' when it parses as a
// number, so Windows-style paths with ':' still work). Throws UsageError.
LoraRef parse_lora_arg(const std::string& arg);

// A1111 extra-network tags: every `<lora:NAME>` / `<lora:NAME:WEIGHT>` (A1111
// reads `<(\w+):([^>]+)>` and splits the inside at ':') is removed from the
// text; further fields (A1111's separate UNet weight) are ignored.
struct LoraTag {
  std::string name;
  double weight = 1.0;
};
struct PromptLoras {
  std::string text;  // prompt without the tags
  std::vector<LoraTag> tags;
};
PromptLoras extract_lora_tags(const std::string& prompt);

// NAME -> file: the registry first, then NAME.safetensors / NAME in each
// directory. Throws UsageError naming every place searched.
LoraRef resolve_lora(const std::string& name, double weight, const LoraRegistry& registry,
                     const std::vector<std::filesystem::path>& dirs);

// `loras` followed by `tags`, each tag resolved with resolve_lora: the LoRA set
// an image applies (--lora, a task and its characters, then the prompt's tags).
// A file named more than once counts once at the same weight; at another weight
// it is a UsageError naming both (naming a LoRA twice never applies it twice).
std::vector<LoraRef> merge_lora_tags(const std::vector<LoraRef>& loras, const std::vector<LoraTag>& tags,
                                     const LoraRegistry& registry, const std::vector<std::filesystem::path>& dirs);

}  // namespace sdxl
