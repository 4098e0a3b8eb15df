// The LoRA set an image applies: the LoRAs of --lora, a task and its
// characters, then the prompt's tags. torch-free.
#pragma once

#include <filesystem>
#include <vector>

#include "lora/lora.h"

namespace sdxl {

// `loras` followed by `tags`, each tag resolved with resolve_lora. A file
// named more than once counts once at the same weight; at another weight it
// is a UsageError naming both (naming a LoRA twice never applies it twice).
std::vector<LoraRef> merge_lora_tags(const std::vector<LoraRef>& loras, const std::vector<LoraTag>& tags,
                                     const LoraRegistry& registry, const std::vector<std::filesystem::path>& dirs);

}  // namespace sdxl
