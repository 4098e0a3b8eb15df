// The task keys of a batch file in one table. For each key it says: its JSON name and where it may
// stand (a task, /defaults), its type and range, its default, the A1111 field it writes into a PNG's
// parameters, its place in a manifest line, whether images that differ in it may share a UNet call,
// and its `sdxl-batch generate` flag.
//
// Who reads it: the parser (batch_file.cpp: the keys allowed, the plain keys' values), the manifest
// (manifest.cpp: a line's "params"), same_settings (resume), batch_group_key (the queue's batches and
// the generator's check), the `keys` command and the public API (sdxl_batch::task_keys). Checked
// against it by tests: configs/batch.schema.json, a1111_parameters and docs/batch-files.md.
// Adding a key: docs/architecture.md#adding-a-task-key. torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "batch/generation_params.h"

namespace sdxl {

// Bounds that hold without a model (validation checks the model's own limits too).
inline constexpr int kMaxSteps = 200;
inline constexpr int kMaxCount = 1000;
inline constexpr int kMaxClipSkip = 256;
inline constexpr int kMaxMaskBlur = 64;          // A1111's slider limit
inline constexpr int kMaxInpaintPadding = 256;   // A1111's slider limit

enum class KeyType { kString, kPath, kInteger, kNumber, kObject, kArray, kDuration };

// Where a key may stand: in a task only, or in a task and in /defaults.
enum class KeyScope { kTask, kTaskAndDefaults };

// Which part of the parser reads a key: the settings reader (GenerationParams, for a task and for
// /defaults alike, in the table's order), the task's own code (id, seed, count, priority, deadline,
// timeout, init_image) or the story tools (characters, style, expand, max_images).
enum class KeyPart { kSettings, kTask, kStory };

// Whether images that differ in a key may share a UNet call: yes (kNo), only with equal values
// (kValue), only when both have it or both lack it (kPresence), or by some of its parts (kParts: the
// key's hooks say which).
enum class KeySplit { kNo, kValue, kPresence, kParts };

// The GenerationParams field of a plain key (read, compared, recorded and grouped by the table's
// generic code); std::monostate for the others.
using ParamField = std::variant<std::monostate, std::string GenerationParams::*, int GenerationParams::*,
                                double GenerationParams::*, std::int64_t GenerationParams::*>;

// What the generic code cannot do for a structured key (hires, ControlNets, ...): compare it, record
// it in a manifest line's "params" and read it back, and add its part of the batch group key.
struct KeyHooks {
  bool (*same)(const GenerationParams& a, const GenerationParams& b);
  void (*record)(const GenerationParams& p, nlohmann::json& params);
  void (*restore)(const nlohmann::json& params, GenerationParams& p);
  void (*group)(const GenerationParams& p, std::string& key);
};

struct TaskKey {
  std::string_view name{};
  KeyType type{};
  KeyScope scope{};
  KeyPart part{};
  double lo = 0, hi = 0;          // an integer's or number's range
  int multiple_of = 0;            // an integer's step (sizes: 8)
  std::string_view choices{};       // a string's values, "|" between them ("" any)
  std::string_view default_text{};  // the default, as docs and `keys` give it
  std::string_view a1111{};         // the A1111 field(s) it writes ("" none)
  std::string_view manifest{};      // its JSON pointer in a manifest line's "params" ("" not recorded)
  KeySplit split = KeySplit::kNo;
  std::string_view generate_flag{}; // "" none
  std::string_view summary{};       // what it does, one line
  ParamField field{};
  // Null: the value always matters. Else it is compared, recorded and grouped only when this holds
  // (strength only for img2img).
  bool (*matters)(const GenerationParams&) = nullptr;
  bool compared = true;           // false: a change does not remake the image (it changes no pixel)
  bool recorded_always = false;   // recorded in the manifest even at its default
  const KeyHooks* hooks = nullptr;

  bool plain() const { return !std::holds_alternative<std::monostate>(field); }
  bool in_defaults() const { return scope == KeyScope::kTaskAndDefaults; }
};

// Every key, in the order the parser reads a task's image settings.
const std::vector<TaskKey>& task_keys();
// The key named `name`, or null.
const TaskKey* find_task_key(std::string_view name);
// The names allowed in a task (defaults = false) or in /defaults (true).
std::vector<std::string> task_key_names(bool defaults);

// Whether a manifest entry's settings `a` make the image `b` asks for (every compared key).
bool same_settings(const GenerationParams& a, const GenerationParams& b);
// The key of images that may share a UNet call: equal keys share one (every splitting key).
std::string batch_group_key(const GenerationParams& p);
// The LoRA set of an image (its LoRA list and prompt tags); "" = none. The queue prefers the set
// applied now, so switches are rare.
std::string lora_set_key(const GenerationParams& p);

// A manifest line's "params" object of `p` (every recorded key), and `p` read back from one (keys
// absent: their defaults). Throws nlohmann's errors on values of the wrong type.
nlohmann::json params_to_manifest(const GenerationParams& p);
void params_from_manifest(const nlohmann::json& params, GenerationParams& p);

// A key's type as messages, docs and the schema name it ("integer", "number", "string", ...).
std::string_view key_type_name(KeyType t);
// Its range or values as docs give them ("1..200, a multiple of 8", "whole | masked"; "" none).
std::string key_range_text(const TaskKey& k);

}  // namespace sdxl
