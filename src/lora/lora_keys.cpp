#include "lora/lora_keys.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <set>

#include "core/error.h"

namespace sdxl {
namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
bool contains(const std::string& s, const std::string& p) { return s.find(p) != std::string::npos; }

std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == '.') out.emplace_back();
    else out.back().push_back(c);
  }
  return out;
}
std::string join_dots(const std::vector<std::string>& v, size_t from = 0) {
  std::string s;
  for (size_t i = from; i < v.size(); ++i) s += (s.empty() ? "" : ".") + v[i];
  return s;
}
std::string dots_to_underscores(std::string s) {
  std::replace(s.begin(), s.end(), '.', '_');
  return s;
}
bool is_uint(const std::string& s) { return !s.empty() && std::all_of(s.begin(), s.end(), ::isdigit); }

// diffusers ResnetBlock2D member -> SGM ResBlock member.
std::string sgm_resnet_member(const std::string& rest) {
  static const std::map<std::string, std::string> m = {
      {"norm1", "in_layers.0"}, {"conv1", "in_layers.2"},  {"time_emb_proj", "emb_layers.1"},
      {"norm2", "out_layers.0"}, {"conv2", "out_layers.3"}, {"conv_shortcut", "skip_connection"}};
  auto it = m.find(rest);
  return it == m.end() ? "" : it->second;
}

// Which role a file key plays, and the module it names (prefix-specific spelling).
enum class Role { kDown, kUp, kAlpha, kOther };

struct Split {
  std::string module;  // "" when the key is no LoRA factor we know
  Role role = Role::kOther;
};

Split split_kohya(const std::string& key) {
  const auto dot = key.find('.');
  if (dot == std::string::npos) return {};
  const std::string name = key.substr(0, dot), suffix = key.substr(dot + 1);
  if (suffix == "lora_down.weight") return {name, Role::kDown};
  if (suffix == "lora_up.weight") return {name, Role::kUp};
  if (suffix == "alpha") return {name, Role::kAlpha};
  return {};  // lora_mid (Tucker), LoHa/LoKr factors, dora_scale: not supported
}

// diffusers/peft spellings after the "unet." / "text_encoder." prefix.
Split split_diffusers(std::string rest, bool text_encoder) {
  struct Suffix {
    const char* s;
    Role r;
  };
  static const Suffix suffixes[] = {
      {".lora_A.weight", Role::kDown}, {".lora_B.weight", Role::kUp},
      {".lora_linear_layer.down.weight", Role::kDown}, {".lora_linear_layer.up.weight", Role::kUp},
      {".lora.down.weight", Role::kDown}, {".lora.up.weight", Role::kUp},
      {"_lora.down.weight", Role::kDown}, {"_lora.up.weight", Role::kUp},  // old attention-processor names
      {".alpha", Role::kAlpha}};
  for (const auto& sf : suffixes) {
    if (!ends_with(rest, sf.s)) continue;
    std::string module = rest.substr(0, rest.size() - std::char_traits<char>::length(sf.s));
    // Old diffusers attention processors: "attn1.processor.to_q_lora" = attn1.to_q
    // (utils/state_dict_utils.py, DIFFUSERS_OLD_TO_PEFT / DIFFUSERS_TO_PEFT).
    if (auto p = module.find(".processor"); p != std::string::npos) module.erase(p, 10);
    if (std::string(sf.s).front() == '_') {
      static const std::map<std::string, std::pair<std::string, std::string>> old = {
          {"to_q", {"to_q", "q_proj"}}, {"to_k", {"to_k", "k_proj"}}, {"to_v", {"to_v", "v_proj"}},
          {"to_out", {"to_out.0", "out_proj"}}};
      const auto last = module.rfind('.');
      const std::string head = last == std::string::npos ? "" : module.substr(0, last + 1);
      const auto it = old.find(module.substr(last == std::string::npos ? 0 : last + 1));
      if (it == old.end()) return {};
      module = head + (text_encoder ? it->second.second : it->second.first);
    }
    return {module, sf.r};
  }
  return {};
}

struct Partial {
  LoraTarget target;
  std::string param;
  std::string down, up, alpha;
};

}  // namespace

const char* lora_target_name(LoraTarget t) {
  switch (t) {
    case LoraTarget::kTextEncoder: return "text_encoder";
    case LoraTarget::kTextEncoder2: return "text_encoder_2";
    case LoraTarget::kUnet: return "unet";
  }
  return "?";
}

std::string sgm_module_name(const std::string& m, int down_layers, int up_layers,
                            const std::vector<bool>& up_block_has_attentions) {
  const auto t = split_dots(m);
  auto num = [&](size_t i) { return (i < t.size() && is_uint(t[i])) ? std::stoi(t[i]) : -1; };
  if (m == "conv_in") return "input_blocks.0.0";
  if (m == "conv_out") return "out.2";
  if (m == "time_embedding.linear_1") return "time_embed.0";
  if (m == "time_embedding.linear_2") return "time_embed.2";
  if (m == "add_embedding.linear_1") return "label_emb.0.0";
  if (m == "add_embedding.linear_2") return "label_emb.0.2";
  if (t.size() < 4) return "";
  const std::string rest = join_dots(t, 4);
  if (t[0] == "down_blocks" && num(1) >= 0 && num(3) >= 0) {
    const int b = num(1), l = num(3);
    const int stride = down_layers + 1;
    if (t[2] == "resnets") {
      const std::string r = sgm_resnet_member(rest);
      return r.empty() ? "" : "input_blocks." + std::to_string(1 + b * stride + l) + ".0." + r;
    }
    if (t[2] == "attentions") return "input_blocks." + std::to_string(1 + b * stride + l) + ".1." + rest;
    if (t[2] == "downsamplers" && l == 0 && rest == "conv") return "input_blocks." + std::to_string((b + 1) * stride) + ".0.op";
    return "";
  }
  if (t[0] == "up_blocks" && num(1) >= 0 && num(3) >= 0) {
    const int b = num(1), l = num(3);
    if (t[2] == "resnets") {
      const std::string r = sgm_resnet_member(rest);
      return r.empty() ? "" : "output_blocks." + std::to_string(b * up_layers + l) + ".0." + r;
    }
    if (t[2] == "attentions") return "output_blocks." + std::to_string(b * up_layers + l) + ".1." + rest;
    if (t[2] == "upsamplers" && l == 0 && rest == "conv") {
      const bool attn = static_cast<size_t>(b) < up_block_has_attentions.size() && up_block_has_attentions[b];
      return "output_blocks." + std::to_string(b * up_layers + up_layers - 1) + (attn ? ".2.conv" : ".1.conv");
    }
    return "";
  }
  if (t[0] == "mid_block" && num(2) >= 0) {
    const std::string rest3 = join_dots(t, 3);
    if (t[1] == "resnets") {
      const std::string r = sgm_resnet_member(rest3);
      return r.empty() ? "" : "middle_block." + std::to_string(num(2) == 0 ? 0 : 2) + "." + r;
    }
    if (t[1] == "attentions" && num(2) == 0) return "middle_block.1." + rest3;
  }
  return "";
}

namespace {

using KohyaNames = std::map<std::string, std::pair<LoraTarget, std::string>>;

[[noreturn]] void refuse_other_base(const std::string& label, const std::string& why) {
  throw UsageError("LoRA '" + label + "' was made for another base model (" + why +
                   "), not SDXL; sdxl-batch runs SDXL LoRAs only (hint: pick the SDXL version of this LoRA)");
}

// kohya name (module path with '.' -> '_', diffusers and SGM spellings) -> parameter.
KohyaNames kohya_names(const ModelParamShapes& model) {
  KohyaNames kohya;
  const std::pair<LoraTarget, const char*> kohya_prefixes[] = {
      {LoraTarget::kTextEncoder, "lora_te1_"}, {LoraTarget::kTextEncoder2, "lora_te2_"}, {LoraTarget::kUnet, "lora_unet_"}};
  int down_layers = 0, up_layers = 0;
  std::vector<bool> up_attn;
  for (const auto& [name, shape] : model.of(LoraTarget::kUnet)) {
    const auto t = split_dots(name);
    if (t.size() > 4 && t[0] == "down_blocks" && t[1] == "0" && t[2] == "resnets" && is_uint(t[3]))
      down_layers = std::max(down_layers, std::stoi(t[3]) + 1);
    if (t.size() > 4 && t[0] == "up_blocks" && t[1] == "0" && t[2] == "resnets" && is_uint(t[3]))
      up_layers = std::max(up_layers, std::stoi(t[3]) + 1);
    if (t.size() > 3 && t[0] == "up_blocks" && is_uint(t[1]) && t[2] == "attentions") {
      const size_t b = std::stoul(t[1]);
      if (up_attn.size() <= b) up_attn.resize(b + 1, false);
      up_attn[b] = true;
    }
  }
  for (const auto& [target, prefix] : kohya_prefixes) {
    for (const auto& [name, shape] : model.of(target)) {
      if (!ends_with(name, ".weight")) continue;
      const std::string module = name.substr(0, name.size() - 7);
      kohya.emplace(prefix + dots_to_underscores(module), std::make_pair(target, name));
      if (target == LoraTarget::kUnet) {
        const std::string sgm = sgm_module_name(module, down_layers, up_layers, up_attn);
        if (!sgm.empty()) kohya.emplace(prefix + dots_to_underscores(sgm), std::make_pair(target, name));
      }
    }
  }
  return kohya;
}

// Which file formats the keys use, and whether one is SD 1.x/2.x's single-encoder prefix.
struct KeyFormats {
  bool kohya = false, diffusers = false, te1_only = false;
};

// The parameter a key's factor belongs to (nullopt: none); `s` gets its role.
std::optional<std::pair<LoraTarget, std::string>> key_target(const std::string& key, const KohyaNames& kohya,
                                                             const ModelParamShapes& model, Split& s, KeyFormats& f) {
  if (starts_with(key, "lora_te_")) f.te1_only = true;
  if (starts_with(key, "lora_")) {
    f.kohya = true;
    s = split_kohya(key);
    if (s.role == Role::kOther) return std::nullopt;
    auto it = kohya.find(s.module);
    if (it != kohya.end()) return it->second;
    return std::nullopt;
  }
  const std::pair<const char*, LoraTarget> prefixes[] = {{"unet.", LoraTarget::kUnet},
                                                         {"text_encoder.", LoraTarget::kTextEncoder},
                                                         {"text_encoder_2.", LoraTarget::kTextEncoder2}};
  for (const auto& [prefix, target] : prefixes) {
    if (!starts_with(key, prefix)) continue;
    f.diffusers = true;
    s = split_diffusers(key.substr(std::char_traits<char>::length(prefix)), target != LoraTarget::kUnet);
    if (s.role != Role::kOther) {
      const std::string param = s.module + ".weight";
      if (model.of(target).count(param)) return std::make_pair(target, param);
    }
    return std::nullopt;
  }
  return std::nullopt;
}

std::string shape_str(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

std::int64_t prod_from(const std::vector<std::int64_t>& v, size_t from) {
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(std::min(from, v.size())), v.end(), std::int64_t{1},
                         std::multiplies<>());
}

// Checks a down/up pair against its weight. Returns false (with the reason in
// `out.unmatched`) for a form that is not supported; throws for shapes that do not fit.
bool check_pair(const Partial& p, const ModelParamShapes& model, const std::map<std::string, const SafetensorsTensor*>& by_name,
                const std::string& label, LoraKeyMap& out) {
  const auto& wshape = model.of(p.target).at(p.param);
  const auto& up = by_name.at(p.up)->shape;
  const auto& down = by_name.at(p.down)->shape;
  const bool ok = wshape.size() >= 2 && up.size() >= 2 && down.size() >= 2 && up[0] == wshape[0] &&
                  up[1] == down[0] && prod_from(up, 2) == 1 && down[1] == wshape[1] && down.size() == wshape.size() &&
                  (down.size() == 2 || prod_from(down, 2) == prod_from(wshape, 2) || prod_from(down, 2) == 1);
  if (!ok) {
    const std::string msg = "factors '" + p.down + "' " + shape_str(down) + " and '" + p.up + "' " + shape_str(up) +
                            " do not fit " + lora_target_name(p.target) + " weight '" + p.param + "' " + shape_str(wshape);
    if (down.size() >= 2 && (down[1] == 768 || down[1] == 1024) && contains(p.param, "attn2.to_") &&
        (contains(p.param, "to_k") || contains(p.param, "to_v")))
      refuse_other_base(label, "cross-attention input width " + std::to_string(down[1]) +
                                   " is SD 1.x/2.x's text width; " + msg);
    throw UsageError("LoRA '" + label + "': " + msg + " (hint: made for another base model?)");
  }
  // A 1x1 conv down factor for a kxk conv is LoCon's Tucker form: not supported.
  if (down.size() == 4 && prod_from(down, 2) == 1 && prod_from(wshape, 2) != 1) {
    out.unmatched.push_back(p.down + " (1x1 down factor of a kxk conv: Tucker/lora_mid form, not supported)");
    return false;
  }
  return true;
}

}  // namespace

LoraKeyMap map_lora_keys(const std::vector<SafetensorsTensor>& tensors, const ModelParamShapes& model,
                         const std::string& label) {
  LoraKeyMap out;
  const KohyaNames kohya = kohya_names(model);
  std::map<std::pair<int, std::string>, Partial> layers;
  KeyFormats formats;
  for (const auto& t : tensors) {
    Split s;
    const auto hit = key_target(t.name, kohya, model, s, formats);
    if (!hit) {
      out.unmatched.push_back(t.name);
      continue;
    }
    auto& p = layers[{static_cast<int>(hit->first), hit->second}];
    p.target = hit->first;
    p.param = hit->second;
    (s.role == Role::kDown ? p.down : s.role == Role::kUp ? p.up : p.alpha) = t.name;
  }
  out.format = formats.kohya && !formats.diffusers ? "kohya" : formats.diffusers && !formats.kohya ? "diffusers" : "mixed";

  // Another base model: SD 1.x/2.x kohya files have one text encoder
  // ("lora_te_"), and their UNets have attention in the first block and a
  // fourth down block, which SDXL has not.
  if (formats.te1_only) refuse_other_base(label, "its text-encoder keys use kohya's single-encoder prefix 'lora_te_' of SD 1.x/2.x");
  for (const auto& k : out.unmatched) {
    if (contains(k, "down_blocks_0_attentions") || contains(k, "down_blocks.0.attentions") ||
        contains(k, "input_blocks_1_1_") || contains(k, "down_blocks_3_") || contains(k, "down_blocks.3."))
      refuse_other_base(label, "key '" + k + "' names a UNet layer of SD 1.x/2.x");
  }

  std::map<std::string, const SafetensorsTensor*> by_name;
  for (const auto& t : tensors) by_name[t.name] = &t;
  for (auto& [id, p] : layers) {
    if (p.down.empty() || p.up.empty()) {  // half a pair is useless: report its keys
      for (const auto* k : {&p.down, &p.up, &p.alpha})
        if (!k->empty()) out.unmatched.push_back(*k + " (no matching " + (p.down.empty() ? "down" : "up") + " factor)");
      continue;
    }
    if (check_pair(p, model, by_name, label, out)) out.layers.push_back({p.target, p.param, p.down, p.up, p.alpha});
  }
  std::sort(out.unmatched.begin(), out.unmatched.end());
  return out;
}

}  // namespace sdxl
