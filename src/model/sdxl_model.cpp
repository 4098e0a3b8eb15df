#include "model/sdxl_model.h"

#include <spdlog/spdlog.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>

#include <functional>
#include <unordered_set>

#include "device/device.h"
#include "core/error.h"
#include "device/device_errors.h"

namespace sdxl {
namespace {

torch::jit::Module load_module(const ModelConfig& cfg, const std::string& rel, const torch::Device& device,
                               torch::Dtype exported, torch::Dtype dtype) {
  return load_traced_module(cfg.path_of(rel), device, exported, dtype, cfg.torch_version);
}

}  // namespace

// A module exported in `exported` that runs in another `dtype` has its floating
// weights converted and the dtype constants its trace baked in rewritten
// (retyped_module), so `--dtype bf16` works on an fp16 or fp32 export.
torch::jit::Module load_traced_module(const std::filesystem::path& path, const torch::Device& device,
                                      torch::Dtype exported, torch::Dtype dtype, const std::string& torch_version) {
  torch::jit::Module m;
  try {
    // Loaded on the CPU, then moved: tensor constants of the traced code stay on
    // the CPU, where they act as scalars. Loaded straight onto the GPU, a traced
    // `inner_dim // heads` becomes a GPU tensor turned into an int -- a host
    // sync in every attention layer, which also makes CUDA graph capture
    // impossible (bench/probes/gpu_graph_probe.py shows both).
    m = torch::jit::load(path.string(), torch::kCPU);
  } catch (const c10::Error& e) {
    throw ModelError("cannot load TorchScript module '" + path.string() + "': " + e.what_without_backtrace() +
                     " (was it exported with scripts/export_sdxl.py and torch " + torch_version + "?)");
  }
  m.eval();
  const std::string rel = path.filename().string();
  if (dtype != exported) {
    int rewritten = 0;
    m = retyped_module(m, exported, dtype, &rewritten);
    spdlog::debug("{}: cast from {} to {}, {} dtype constant(s) of the trace rewritten", rel, c10::toString(exported),
                  c10::toString(dtype), rewritten);
  }
  m.to(device);
  if (const int n = retarget_device_literals(m, device); n > 0)
    spdlog::debug("{}: {} device literal(s) of the traced code moved to {}", rel, n, device.str());
  return m;
}

// Device literals of traced code: a module traced on cuda:0 creates some
// tensors with `device=cuda:0` written into its graph (the text encoders'
// causal mask, for one), which module.to() does not change. On another GPU
// (--devices) those become cuda:N here, before the graphs first run. CPU
// literals stay: they are deliberate host-side scalars.
int retarget_device_literals(torch::jit::Module& m, const torch::Device& device) {
  if (!device.is_cuda()) return 0;
  int changed = 0;
  std::function<void(torch::jit::Block*)> visit = [&](torch::jit::Block* block) {
    for (torch::jit::Node* n : block->nodes()) {
      if (n->kind() == c10::prim::Constant && n->outputs().size() == 1 &&
          n->output()->type()->kind() == c10::TypeKind::DeviceObjType && n->hasAttribute(c10::attr::value)) {
        const c10::Device literal(n->s(c10::attr::value));
        if (literal.is_cuda() && literal != device) {
          n->s_(c10::attr::value, device.str());
          ++changed;
        }
      }
      for (torch::jit::Block* b : n->blocks()) visit(b);
    }
  };
  for (const torch::jit::Module& sub : m.modules())
    for (const torch::jit::Method& method : sub.get_methods()) visit(method.graph()->block());
  return changed;
}


std::unique_ptr<SdxlModel> SdxlModel::load(const ModelConfig& config, const torch::Device& device,
                                           const std::string& dtype_override) {
  auto m = std::make_unique<SdxlModel>();
  m->config = config;
  m->device = device;
  const torch::Dtype exported = parse_dtype(config.dtype);
  m->dtype = dtype_override.empty() ? exported : parse_dtype(dtype_override);
  // The VAE stays as exported; the decode dtype is chosen apart (--vae-dtype,
  // set_vae_decode_dtype in image/vae_decode.h).
  m->vae_dtype = parse_dtype(config.vae_dtype);
  m->vae_decode_dtype = m->vae_dtype;
  if (device.is_cuda() && config.export_device == "cpu")
    spdlog::warn("model '{}' was exported on the CPU; traced modules may hold CPU constants. "
                 "If generation fails, re-export with scripts/export_sdxl.py --device cuda",
                 config.name);
  if (device.is_cpu() && m->dtype == torch::kFloat16)
    spdlog::warn("fp16 on the CPU is slow and not all operators support it; use --dtype fp32 there");

  m->tokenizer = std::make_unique<ClipTokenizer>(
      ClipTokenizer::from_dir(config.path_of(config.text_encoders[0].tokenizer), config.text_encoders[0].pad_token));
  m->tokenizer_2 = std::make_unique<ClipTokenizer>(
      ClipTokenizer::from_dir(config.path_of(config.text_encoders[1].tokenizer), config.text_encoders[1].pad_token));
  m->text_encoder = load_module(config, config.text_encoders[0].file, device, exported, m->dtype);
  m->text_encoder_2 = load_module(config, config.text_encoders[1].file, device, exported, m->dtype);
  m->unet = load_module(config, config.unet_file, device, exported, m->dtype);
  m->vae_decoder = load_module(config, config.vae_decoder_file, device, m->vae_dtype, m->vae_dtype);
  return m;
}

std::unique_ptr<SdxlModel> SdxlModel::load_vae(const ModelConfig& vae_config, const SdxlModel& model) {
  check_vae_fits(vae_config, model.config);
  auto m = std::make_unique<SdxlModel>();
  m->config = vae_config;
  m->device = model.device;
  m->dtype = model.dtype;
  m->vae_dtype = parse_dtype(vae_config.vae_dtype);
  m->vae_decode_dtype = m->vae_dtype;
  m->vae_decoder = load_module(vae_config, vae_config.vae_decoder_file, m->device, m->vae_dtype, m->vae_dtype);
  return m;
}

torch::jit::Module& vae_encoder_module(SdxlModel& model) {
  if (!model.vae_encoder) {
    if (model.config.vae_encoder_file.empty())
      throw ModelError("model '" + model.config.name + "' has no vae_encoder.ts (needed for img2img and the hires fix "
                       "in pixel space): re-export it with scripts/export_sdxl.py");
    model.vae_encoder = load_module(model.config, model.config.vae_encoder_file, model.device,
                                    parse_dtype(model.config.vae_dtype), model.vae_dtype);
  }
  return *model.vae_encoder;
}

torch::jit::Module& vae_decoder_fp32_module(SdxlModel& model) {
  if (!model.vae_decoder_fp32) {
    torch::jit::Module m =
        load_module(model.config, model.config.vae_decoder_file, model.device, model.vae_dtype, model.vae_dtype);
    model.vae_decoder_fp32 = model.vae_dtype == torch::kFloat32 ? m : retyped_module(m, model.vae_dtype, torch::kFloat32);
  }
  return *model.vae_decoder_fp32;
}

namespace {

// Replaces every constant `dtype` argument equal to `from` by `to` in a block
// and its sub-blocks; returns how many.
int rewrite_dtype_constants(torch::jit::Graph& graph, torch::jit::Block* block, std::int64_t from, std::int64_t to) {
  int n = 0;
  for (torch::jit::Node* node : block->nodes()) {
    for (torch::jit::Block* sub : node->blocks()) n += rewrite_dtype_constants(graph, sub, from, to);
    const c10::FunctionSchema* schema = node->maybeSchema();
    if (schema == nullptr) continue;
    const auto& args = schema->arguments();
    for (size_t i = 0; i < args.size() && i < node->inputs().size(); ++i) {
      if (args[i].name() != "dtype") continue;
      torch::jit::Value* v = node->input(i);
      if (v->node()->kind() != c10::prim::Constant) continue;
      const std::optional<c10::IValue> iv = torch::jit::toIValue(v);
      if (!iv || !iv->isInt() || iv->toInt() != from) continue;
      torch::jit::WithInsertPoint here(node);
      node->replaceInput(i, graph.insertConstant(to));
      ++n;
    }
  }
  return n;
}

}  // namespace

torch::jit::Module retyped_module(const torch::jit::Module& module, torch::Dtype from, torch::Dtype to, int* rewritten) {
  torch::jit::Module copy = module.clone();  // own graphs and tensors
  int n = 0;
  if (from != to) {
    std::unordered_set<const torch::jit::Graph*> seen;  // submodules of one type share their graphs
    for (const torch::jit::Module& sub : copy.modules()) {
      for (const torch::jit::Method& method : sub.get_methods()) {
        const std::shared_ptr<torch::jit::Graph> g = method.graph();
        if (seen.insert(g.get()).second) n += rewrite_dtype_constants(*g, g->block(), static_cast<std::int64_t>(from),
                                                                      static_cast<std::int64_t>(to));
      }
    }
    // Floating tensors only (Module::to(dtype) would cast integer buffers too).
    for (at::Tensor p : copy.parameters())
      if (p.is_floating_point()) p.set_data(p.to(to));
    for (at::Tensor b : copy.buffers())
      if (b.is_floating_point()) b.set_data(b.to(to));
  }
  if (rewritten != nullptr) *rewritten = n;
  return copy;
}

std::map<std::string, at::Tensor> named_tensors(const torch::jit::Module& module) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) out.emplace(p.name, p.value);
  for (const auto& b : module.named_buffers(/*recurse=*/true)) out.emplace(b.name, b.value);
  return out;
}

c10::IValue run_module(torch::jit::Module& module, const char* name, std::vector<c10::IValue> inputs) {
  return translate_device_errors(name, [&] { return module.forward(std::move(inputs)); });
}

}  // namespace sdxl
