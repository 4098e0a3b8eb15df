#include "model/model_config.h"
#include "model/upscaler_config.h"
#include "model/detector_config.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/input_file.h"
#include "core/input_text.h"
#include "core/json_shape.h"
#include "core/sha256.h"

namespace sdxl {
namespace {

using nlohmann::json;

// Reads fields of one JSON object and names the file + pointer in every error.
class Reader {
 public:
  Reader(const json& j, std::string origin, std::string pointer)
      : j_(j), origin_(std::move(origin)), pointer_(std::move(pointer)) {
    if (!j_.is_object()) fail(pointer_.empty() ? "/" : pointer_, "must be a JSON object");
  }

  [[noreturn]] void fail(const std::string& pointer, const std::string& msg) const {
    throw ModelError(origin_ + ": " + pointer + " " + msg +
                     " (re-export the model with scripts/export_sdxl.py)");
  }
  std::string at(const std::string& key) const { return pointer_ + "/" + key; }
  bool has(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  const json& raw(const std::string& key) const {
    if (!has(key)) fail(at(key), "is missing");
    return j_.at(key);
  }
  // Every string of a model.json is a name, a file name or a tag: one line of
  // UTF-8 without control characters (core/input_text.h).
  std::string str(const std::string& key) const {
    const json& v = raw(key);
    if (!v.is_string()) fail(at(key), "must be a string");
    std::string s = v.get<std::string>();
    if (const std::string why = text_problem(s, TextKind::kName); !why.empty()) fail(at(key), why);
    return s;
  }
  std::string str_or(const std::string& key, const std::string& dflt) const { return has(key) ? str(key) : dflt; }
  int integer(const std::string& key, int lo, int hi) const {
    const json& v = raw(key);
    if (!v.is_number_integer()) fail(at(key), "must be an integer");
    auto x = v.get<long long>();
    if (x < lo || x > hi) fail(at(key), "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(x));
    return static_cast<int>(x);
  }
  int integer_or(const std::string& key, int lo, int hi, int dflt) const { return has(key) ? integer(key, lo, hi) : dflt; }
  double number(const std::string& key, double lo, double hi) const {
    const json& v = raw(key);
    if (!v.is_number()) fail(at(key), "must be a number");
    double x = v.get<double>();
    if (!(x >= lo && x <= hi)) fail(at(key), "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return x;
  }
  std::string one_of(const std::string& key, std::initializer_list<const char*> allowed) const {
    std::string v = str(key);
    std::string list;
    for (const char* a : allowed) {
      if (v == a) return v;
      list += std::string(list.empty() ? "" : ", ") + a;
    }
    fail(at(key), "is '" + v + "', expected one of: " + list);
  }
  Reader child(const std::string& key) const { return Reader(raw(key), origin_, at(key)); }

 private:
  const json& j_;
  std::string origin_;
  std::string pointer_;
};

}  // namespace

namespace {

void read_text_encoders(const Reader& r, const std::string& origin, ModelConfig& c) {
  const json& tes = r.raw("text_encoders");
  if (!tes.is_array() || tes.size() != 2) r.fail("/text_encoders", "must be an array of the two SDXL text encoders");
  for (size_t i = 0; i < tes.size(); ++i) {
    Reader t(tes[i], origin, "/text_encoders/" + std::to_string(i));
    TextEncoderConfig te;
    te.file = t.str("file");
    te.tokenizer = t.str("tokenizer");
    te.pad_token = t.str("pad_token");
    te.hidden_dim = t.integer("hidden_dim", 1, 1 << 16);
    te.pooled_dim = t.integer_or("pooled_dim", 0, 1 << 16, 0);
    te.hidden_states = t.integer_or("hidden_states", 2, 1 << 12, 0);
    c.text_encoders.push_back(te);
  }
  if (c.text_encoders[1].pooled_dim <= 0) r.fail("/text_encoders/1/pooled_dim", "is missing (SDXL pools encoder 2)");
}

// /unet/aoti, /unet/fp8/aoti, /vae_decoder/aoti: the AOTInductor package and the
// input ranges it was compiled for (tokens: the UNet's only).
void read_aoti(const Reader& a, AotiConfig& x) {
  x.file = a.str("file");
  x.device = a.one_of("device", {"cpu", "cuda"});
  x.dtype = a.one_of("dtype", {"fp32", "fp16", "bf16"});
  x.gpu = a.str_or("gpu", "");
  x.capability = a.str_or("capability", "");
  auto range = [&](const char* key, int lo, int hi, int& mn, int& mx) {
    const json& v = a.raw(key);
    const std::string ptr = a.at(key);
    if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() || !v[1].is_number_integer())
      a.fail(ptr, "must be [min, max] (integers)");
    const auto v0 = v[0].get<long long>(), v1 = v[1].get<long long>();
    if (v0 < lo || v1 > hi || v0 > v1)
      a.fail(ptr, "must satisfy " + std::to_string(lo) + " <= min <= max <= " + std::to_string(hi));
    mn = static_cast<int>(v0);
    mx = static_cast<int>(v1);
  };
  range("rows", 1, 1 << 16, x.rows_min, x.rows_max);
  if (a.has("tokens")) range("tokens", 1, 1 << 20, x.tokens_min, x.tokens_max);
  range("latent_height", 1, 1 << 16, x.latent_height_min, x.latent_height_max);
  range("latent_width", 1, 1 << 16, x.latent_width_min, x.latent_width_max);
}

// /unet/control or /controlnet: the residuals' channels and downscales (the last is the mid block's).
void read_control_inputs(const Reader& r, UnetControlInputs& x) {
  const int n = r.integer("residuals", 1, 64);
  auto ints = [&](const char* key, std::vector<int>& out) {
    const json& v = r.raw(key);
    if (!v.is_array() || v.size() != static_cast<size_t>(n) + 1)
      r.fail(r.at(key), "must list " + std::to_string(n + 1) + " integers (each down residual, then the mid one)");
    for (const json& e : v) {
      if (!e.is_number_integer() || e.get<long long>() < 1 || e.get<long long>() > (1 << 16))
        r.fail(r.at(key), "must hold positive integers");
      out.push_back(e.get<int>());
    }
  };
  ints("channels", x.channels);
  ints("downscales", x.downscales);
}

// A non-empty array of positive integers (cross-attention widths).
std::vector<int> read_layer_widths(const Reader& r, const std::string& key) {
  const json& v = r.raw(key);
  if (!v.is_array() || v.empty()) r.fail(r.at(key), "must be a non-empty array of layer widths");
  std::vector<int> out;
  for (const json& e : v) {
    if (!e.is_number_integer() || e.get<long long>() < 1 || e.get<long long>() > (1 << 16))
      r.fail(r.at(key), "must hold positive integers");
    out.push_back(e.get<int>());
  }
  return out;
}

void read_unet(const Reader& r, ModelConfig& c) {
  Reader u = r.child("unet");
  c.unet_file = u.str("file");
  c.unet_context_dim = u.integer("context_dim", 1, 1 << 16);
  c.unet_pooled_dim = u.integer("pooled_dim", 1, 1 << 16);
  c.unet_time_ids_dim = u.integer_or("time_ids_dim", 1, 64, 6);
  c.unet_in_channels = u.integer_or("in_channels", 1, 129, c.latent_channels);
  if (c.unet_in_channels != c.latent_channels && !c.inpainting_unet())
    r.fail("/unet/in_channels", "must be /latent_channels (" + std::to_string(c.latent_channels) +
                                    ") or, for an inpainting UNet, 2 * latent_channels + 1 (" +
                                    std::to_string(2 * c.latent_channels + 1) + ")");
  if (c.unet_context_dim != c.text_encoders[0].hidden_dim + c.text_encoders[1].hidden_dim)
    r.fail("/unet/context_dim", "must equal the sum of the text encoders' hidden_dim");
  if (c.unet_pooled_dim != c.text_encoders[1].pooled_dim)
    r.fail("/unet/pooled_dim", "must equal /text_encoders/1/pooled_dim");
  if (u.has("aoti")) read_aoti(u.child("aoti"), c.unet_aoti);
  if (u.has("fp8")) {
    const Reader f = u.child("fp8");
    c.unet_fp8.file = f.str("file");
    c.unet_fp8.format = f.str_or("format", "");
    c.unet_fp8.layers = f.integer("layers", 1, 1 << 20);
    if (f.has("aoti")) read_aoti(f.child("aoti"), c.unet_fp8.aoti);
  }
  if (u.has("control")) read_control_inputs(u.child("control"), c.unet_control);
  if (u.has("ip_adapter")) {
    const Reader ip = u.child("ip_adapter");
    c.unet_ip.layers = read_layer_widths(ip, "layers");
    c.unet_ip.cross_attention_dim = ip.integer("cross_attention_dim", 1, 1 << 16);
  }
  if (u.has("regions")) {
    const Reader rg = u.child("regions");
    c.unet_regions.downscales = read_layer_widths(rg, "downscales");
    c.unet_regions.max_regions = rg.integer("max_regions", 1, 32);
  }
}

void read_scheduler(const Reader& r, ModelConfig& c) {
  Reader s = r.child("scheduler");
  c.scheduler.num_train_timesteps = s.integer("num_train_timesteps", 1, 100000);
  c.scheduler.beta_start = s.number("beta_start", 0.0, 1.0);
  c.scheduler.beta_end = s.number("beta_end", 0.0, 1.0);
  c.scheduler.beta_schedule = s.one_of("beta_schedule", {"scaled_linear", "linear"});
  c.scheduler.timestep_spacing = s.one_of("timestep_spacing", {"leading", "trailing", "linspace"});
  c.scheduler.steps_offset = s.integer_or("steps_offset", 0, 1000, 0);
  c.scheduler.prediction_type = s.one_of("prediction_type", {"epsilon", "v_prediction"});
  if (s.has("rescale_betas_zero_snr")) {
    const json& z = s.raw("rescale_betas_zero_snr");
    if (!z.is_boolean()) s.fail(s.at("rescale_betas_zero_snr"), "must be true or false");
    c.scheduler.rescale_betas_zero_snr = z.get<bool>();
  }
}

// /defaults and /limits, both optional.
void read_defaults_and_limits(const Reader& r, ModelConfig& c) {
  if (r.has("defaults")) {
    Reader d = r.child("defaults");
    c.defaults.width = d.integer_or("width", 8, 16384, c.defaults.width);
    c.defaults.height = d.integer_or("height", 8, 16384, c.defaults.height);
    c.defaults.steps = d.integer_or("steps", 1, 1000, c.defaults.steps);
    if (d.has("cfg")) c.defaults.cfg = d.number("cfg", 0.0, 100.0);
    if (d.has("guidance_rescale")) c.defaults.guidance_rescale = d.number("guidance_rescale", 0.0, 1.0);
  }
  if (r.has("limits")) {
    Reader l = r.child("limits");
    ModelLimits& m = c.limits;
    m.batch_max = l.integer_or("batch_max", 1, 4096, m.batch_max);
    m.width_min = l.integer_or("width_min", 8, 65536, m.width_min);
    m.width_max = l.integer_or("width_max", 8, 65536, m.width_max);
    m.height_min = l.integer_or("height_min", 8, 65536, m.height_min);
    m.height_max = l.integer_or("height_max", 8, 65536, m.height_max);
    m.size_multiple = l.integer_or("size_multiple", 1, 4096, m.size_multiple);
    m.context_chunks_max = l.integer_or("context_chunks_max", 1, 64, m.context_chunks_max);
    if (m.width_min > m.width_max) l.fail("/limits/width_min", "is larger than width_max");
    if (m.height_min > m.height_max) l.fail("/limits/height_min", "is larger than height_max");
  }
}

void read_file_sizes(const Reader& r, const std::string& origin, ModelConfig& c) {
  if (!r.has("files")) return;
  const json& files = r.raw("files");
  if (!files.is_object()) r.fail("/files", "must be an object of file -> {bytes}");
  for (const auto& [name, info] : files.items()) {
    Reader f(info, origin, "/files/" + name);
    const json& b = f.raw("bytes");
    if (!b.is_number_unsigned() && !b.is_number_integer()) f.fail(f.at("bytes"), "must be an integer");
    c.file_bytes[name] = b.get<std::uint64_t>();
    if (info.is_object() && info.contains("sha256")) {
      const json& h = info["sha256"];
      if (!h.is_string() || h.get<std::string>().size() != 64) f.fail(f.at("sha256"), "must be 64 hex digits");
      c.file_sha256[name] = h.get<std::string>();
    }
  }
}

// "source_file" / "vae_file": {"name": FILE, "sha256": 64 lowercase hex digits}, optional.
ExportSourceFile read_source_file(const Reader& r, const std::string& key) {
  ExportSourceFile f;
  if (!r.has(key)) return f;
  const Reader s = r.child(key);
  f.name = s.str("name");
  if (f.name.empty()) s.fail(s.at("name"), "is empty (the file name the export read)");
  f.sha256 = s.str("sha256");
  if (f.sha256.size() != 64 || f.sha256.find_first_not_of("0123456789abcdef") != std::string::npos)
    s.fail(s.at("sha256"), "must be 64 lowercase hex digits, got '" + f.sha256 + "'");
  return f;
}

// `rel` (model.json's `pointer`) names a file inside `dir` that exists with the size it records.
void check_model_file(const ModelConfig& c, const std::filesystem::path& dir, const std::string& rel,
                      const std::string& pointer, const std::string& origin) {
  const std::filesystem::path r(rel);
  bool leaves = r.is_absolute() || rel.empty();
  for (const auto& part : r) leaves |= part == "..";
  if (leaves)
    throw ModelError(origin + ": " + pointer + " names '" + rel +
                     "': model files must be inside the model directory (no absolute path, no '..')");
  const auto p = dir / r;
  // The confinement rule (core/input_file.h): no link out of the model folder.
  if (const std::string why = input_file_problem(p, std::numeric_limits<std::uint64_t>::max(), dir); !why.empty())
    throw ModelError(origin + ": " + pointer + " names '" + p.string() + "', which " + why);
  std::error_code ec;
  auto it = c.file_bytes.find(rel);
  if (it != c.file_bytes.end()) {
    auto size = std::filesystem::file_size(p, ec);
    if (!ec && size != it->second)
      throw ModelError("'" + p.string() + "' has " + std::to_string(size) + " bytes, model.json records " +
                       std::to_string(it->second) + ": the file is truncated or from another export");
  }
}

// Every file model.json names exists, with the size it records.
void check_model_files(const ModelConfig& c, const std::filesystem::path& dir, const std::string& origin) {
  auto need = [&](const std::string& rel, const std::string& pointer) { check_model_file(c, dir, rel, pointer, origin); };
  need(c.text_encoders[0].file, "/text_encoders/0/file");
  need(c.text_encoders[1].file, "/text_encoders/1/file");
  need(c.unet_file, "/unet/file");
  if (!c.unet_aoti.file.empty()) need(c.unet_aoti.file, "/unet/aoti/file");
  if (!c.unet_fp8.file.empty()) need(c.unet_fp8.file, "/unet/fp8/file");
  if (!c.unet_fp8.aoti.file.empty()) need(c.unet_fp8.aoti.file, "/unet/fp8/aoti/file");
  need(c.vae_decoder_file, "/vae_decoder/file");
  if (!c.vae_decoder_aoti.file.empty()) need(c.vae_decoder_aoti.file, "/vae_decoder/aoti/file");
  for (int i = 0; i < 2; ++i) {
    for (const char* f : {"vocab.json", "merges.txt"})
      need(c.text_encoders[i].tokenizer + "/" + f, "/text_encoders/" + std::to_string(i) + "/tokenizer");
  }
}

// model.json's text as JSON, after the shape checks (depth, duplicate keys).
json parse_json_text(const std::string& json_text, const std::string& origin) {
  const JsonShape shape = check_json_shape(json_text);
  if (!shape.problems.empty())
    throw ModelError(origin + ": " + shape.problems[0].first + ": " + shape.problems[0].second);
  try {
    return json::parse(json_text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers that overflow
    throw ModelError(origin + ": not valid JSON: " + e.what());
  }
}

// /format_version: the one this sdxl-batch reads.
int read_format_version(const Reader& r) {
  const int v = r.integer("format_version", 1, 1000);
  if (v != kModelFormatVersion)
    r.fail("/format_version", "is " + std::to_string(v) + ", this sdxl-batch reads version " +
                                  std::to_string(kModelFormatVersion));
  return v;
}

// The fields a model and a VAE folder share: format, name, dtypes, the VAE's geometry and files.
void read_common(const Reader& r, ModelConfig& c) {
  c.format_version = read_format_version(r);
  c.name = r.str("name");
  c.source = r.str_or("source", "");
  c.dtype = r.one_of("dtype", {"fp32", "fp16", "bf16"});
  c.vae_dtype = r.has("vae_dtype") ? r.one_of("vae_dtype", {"fp32", "fp16", "bf16"}) : c.dtype;
  c.export_device = r.one_of("export_device", {"cpu", "cuda"});
  c.torch_version = r.str_or("torch_version", "");
  c.vae_scaling_factor = r.number("vae_scaling_factor", 1e-6, 1e6);
  c.vae_downsample = r.integer("vae_downsample", 1, 64);
  c.latent_channels = r.integer("latent_channels", 1, 64);
  c.vae_decoder_file = r.child("vae_decoder").str("file");
  if (r.child("vae_decoder").has("aoti")) read_aoti(r.child("vae_decoder").child("aoti"), c.vae_decoder_aoti);
  if (r.has("vae_encoder")) c.vae_encoder_file = r.child("vae_encoder").str("file");
  c.vae_file = read_source_file(r, "vae_file");
}

// DIR/model.json's text; a ModelError names the folder as `what` (a model
// directory, a VAE folder) and the command that makes one.
std::string read_model_json(const std::filesystem::path& dir, const std::string& what, const std::string& make) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw ModelError(what + " '" + dir.string() + "' does not exist (make one with " + make + ")");
  const auto path = dir / "model.json";
  InputFile in(path, 16ull << 20, dir);  // the confinement rule: not a link out of the folder
  std::string text = in.ok() ? in.read_all() : std::string();
  if (!in.ok() && in.error() == "does not exist")
    throw ModelError("'" + path.string() + "' not found: '" + dir.string() + "' is not an sdxl-batch " + what +
                     " (make one with " + make + ")");
  if (!in.error().empty()) throw ModelError("'" + path.string() + "' " + in.error());
  return text;
}

}  // namespace

ModelConfig parse_model_config(const std::string& json_text, const std::filesystem::path& dir,
                               const std::string& origin, bool check_files) {
  const json j = parse_json_text(json_text, origin);
  Reader r(j, origin, "");
  if (j.is_object() && j.value("kind", "") == "vae")
    throw ModelError(origin + ": this is a VAE folder (export_sdxl.py --vae-only), not a model: give it to --vae "
                              "or a task's \"vae\"");
  if (j.is_object() && j.value("kind", "") == "controlnet")
    throw ModelError(origin + ": this is a ControlNet folder (export_sdxl.py --controlnet), not a model: give it to "
                              "--controlnet or a task's \"controlnets\"");
  if (j.is_object() && j.value("kind", "") == "ip_adapter")
    throw ModelError(origin + ": this is an IP-Adapter folder (export_sdxl.py --ip-adapter), not a model: give it to "
                              "--ip-adapter or a task's \"ip_adapter\"");
  if (j.is_object() && j.value("kind", "") == "upscaler")
    throw ModelError(origin + ": this is an upscaler folder (export_sdxl.py --upscaler), not a model: give it to "
                              "--upscale-model or a task's \"upscale\"");
  if (j.is_object() && j.value("kind", "") == "detector")
    throw ModelError(origin + ": this is a detector folder (export_sdxl.py --detector), not a model: give it to "
                              "sdxl-batch detect --detector");
  ModelConfig c;
  c.dir = dir;
  read_common(r, c);
  c.architecture = r.one_of("architecture", {"sdxl-base"});
  read_text_encoders(r, origin, c);
  read_unet(r, c);
  read_scheduler(r, c);
  read_defaults_and_limits(r, c);
  read_file_sizes(r, origin, c);
  c.source_file = read_source_file(r, "source_file");
  if (check_files) check_model_files(c, dir, origin);
  return c;
}

ModelConfig parse_vae_config(const std::string& json_text, const std::filesystem::path& dir,
                             const std::string& origin, bool check_files) {
  const json j = parse_json_text(json_text, origin);
  Reader r(j, origin, "");
  if (!j.is_object() || j.value("kind", "") != "vae")
    throw ModelError(origin + ": not a VAE folder (model.json has no \"kind\": \"vae\"; make one with "
                              "scripts/export_sdxl.py --vae-only --vae FILE|DIR)");
  ModelConfig c;
  c.dir = dir;
  c.architecture = "vae";
  read_common(r, c);
  read_file_sizes(r, origin, c);
  if (check_files) {
    check_model_file(c, dir, c.vae_decoder_file, "/vae_decoder/file", origin);
    if (!c.vae_encoder_file.empty()) check_model_file(c, dir, c.vae_encoder_file, "/vae_encoder/file", origin);
  }
  return c;
}

ModelConfig load_vae_config(const std::filesystem::path& dir) {
  const auto path = dir / "model.json";
  return parse_vae_config(read_model_json(dir, "VAE folder", "scripts/export_sdxl.py --vae-only --vae FILE|DIR"), dir,
                          path.string(), /*check_files=*/true);
}

void check_vae_fits(const ModelConfig& vae, const ModelConfig& model) {
  if (vae.latent_channels != model.latent_channels || vae.vae_downsample != model.vae_downsample)
    throw ModelError("VAE '" + vae.dir.string() + "' has " + std::to_string(vae.latent_channels) +
                     " latent channels and downsamples by " + std::to_string(vae.vae_downsample) + "; model '" +
                     model.name + "' needs " + std::to_string(model.latent_channels) + " and " +
                     std::to_string(model.vae_downsample));
}

std::string TaskFolderConfig::display_name() const {
  return source_file.recorded() ? std::filesystem::path(source_file.name).stem().string() : name;
}

std::string TaskFolderConfig::short_hash_of(const std::string& main_file) const {
  if (source_file.recorded()) return source_file.sha256.substr(0, 8);
  const auto it = file_sha256.find(main_file);
  return it == file_sha256.end() ? "" : it->second.substr(0, 8);
}

namespace {

// A task folder's kind: model.json's "kind", what it is called, how one is made.
struct FolderKind {
  const char* kind;
  const char* what;
  const char* make;
};

// The model.json of a task folder of kind `k`: the shared fields into `c`;
// returns the file list (for check_model_file).
ModelConfig read_task_folder(const json& j, const Reader& r, const FolderKind& k, const std::filesystem::path& dir,
                             const std::string& origin, TaskFolderConfig& c) {
  if (!j.is_object() || j.value("kind", "") != k.kind)
    throw ModelError(origin + ": not " + k.what + " (model.json has no \"kind\": \"" + k.kind + "\"; make one with " +
                     k.make + ")");
  ModelConfig files;  // the shared readers fill a ModelConfig
  files.dir = dir;
  c.dir = dir;
  (void)read_format_version(r);
  c.name = r.str("name");
  c.dtype = r.one_of("dtype", {"fp32", "fp16", "bf16"});
  c.export_device = r.one_of("export_device", {"cpu", "cuda"});
  c.source_file = read_source_file(r, "source_file");
  read_file_sizes(r, origin, files);
  c.file_sha256 = files.file_sha256;
  return files;
}

// controlnet.union: {"num_control_type": T, "types": {name: index < T, ...}}.
void read_union_types(const Reader& u, ControlNetConfig& c) {
  c.union_type_count = u.integer("num_control_type", 1, 256);
  const Reader names = u.child("types");
  for (const auto& item : u.raw("types").items()) {
    if (const std::string why = text_problem(item.key(), TextKind::kName); !why.empty()) names.fail(names.at(""), why);
    c.union_types[item.key()] = names.integer(item.key(), 0, c.union_type_count - 1);
  }
  if (c.union_types.empty()) u.fail(u.at("types"), "names no control type");
}

}  // namespace

std::string control_type_problem(const ControlNetConfig& cn, const std::string& type) {
  const std::string folder = "'" + cn.dir.string() + "'";
  if (!cn.is_union())
    return type.empty() ? "" : "is set, but ControlNet " + folder + " is no Union ControlNet (it has no control types)";
  std::string names;
  for (const auto& [name, index] : cn.union_types) names += (names.empty() ? "" : ", ") + name;
  if (type.empty()) return "is missing: Union ControlNet " + folder + " needs the control type (one of " + names + ")";
  if (!cn.union_types.count(type))
    return "'" + type + "': Union ControlNet " + folder + " has no such control type (it has " + names + ")";
  return "";
}

ControlNetConfig parse_controlnet_config(const std::string& json_text, const std::filesystem::path& dir,
                                         const std::string& origin, bool check_files) {
  const json j = parse_json_text(json_text, origin);
  Reader r(j, origin, "");
  ControlNetConfig c;
  const ModelConfig files = read_task_folder(
      j, r, {"controlnet", "a ControlNet folder", "scripts/export_sdxl.py --controlnet SRC --out DIR"}, dir, origin, c);
  const Reader cn = r.child("controlnet");
  c.file = cn.str("file");
  c.in_channels = cn.integer("in_channels", 1, 64);
  c.context_dim = cn.integer("context_dim", 1, 1 << 16);
  c.pooled_dim = cn.integer("pooled_dim", 1, 1 << 16);
  c.cond_channels = cn.integer("cond_channels", 1, 64);
  c.downscale = cn.integer("downscale", 1, 64);
  read_control_inputs(cn, c.outputs);
  if (cn.has("global_pool_conditions") && cn.raw("global_pool_conditions").is_boolean() &&
      cn.raw("global_pool_conditions").get<bool>())
    cn.fail(cn.at("global_pool_conditions"), "is true: ControlNets with pooled conditions (diffusers' guess mode, "
                                              "e.g. shuffle) are not supported");
  if (cn.has("union")) read_union_types(cn.child("union"), c);
  if (check_files) check_model_file(files, dir, c.file, "/controlnet/file", origin);
  return c;
}

UpscalerConfig parse_upscaler_config(const std::string& json_text, const std::filesystem::path& dir,
                                     const std::string& origin, bool check_files) {
  const json j = parse_json_text(json_text, origin);
  Reader r(j, origin, "");
  UpscalerConfig c;
  const ModelConfig files = read_task_folder(
      j, r, {"upscaler", "an upscaler folder", "scripts/export_sdxl.py --upscaler FILE --out DIR"}, dir, origin, c);
  c.file = r.child("upscaler").str("file");
  c.architecture = r.child("architecture").str("id");
  c.scale = r.integer("scale", 1, 16);
  const Reader tile = r.child("tile");
  const json& fixed = tile.raw("fixed");
  if (!fixed.is_boolean()) tile.fail(tile.at("fixed"), "must be true or false");
  c.fixed_tile = fixed.get<bool>();
  if (c.fixed_tile) c.tile_size = tile.integer("size", 8, 4096);
  if (check_files) check_model_file(files, dir, c.file, "/upscaler/file", origin);
  return c;
}

DetectorConfig parse_detector_config(const std::string& json_text, const std::filesystem::path& dir,
                                     const std::string& origin, bool check_files) {
  const json j = parse_json_text(json_text, origin);
  Reader r(j, origin, "");
  DetectorConfig c;
  const ModelConfig files = read_task_folder(
      j, r, {"detector", "a detector folder", "scripts/export_sdxl.py --detector FILE.pt --out DIR"}, dir, origin, c);
  c.file = r.child("detector").str("file");
  c.task = r.one_of("task", {"detect", "segment"});
  const json& classes = r.raw("classes");
  if (!classes.is_array() || classes.empty() || classes.size() > 100000) r.fail("/classes", "must be a non-empty list");
  for (const json& name : classes) {
    if (!name.is_string()) r.fail("/classes", "must hold class names (strings)");
    c.classes.push_back(name.get<std::string>());
  }
  const json& size = r.raw("imgsz");
  if (!size.is_array() || size.size() != 2 || !size[0].is_number_integer() || !size[1].is_number_integer())
    r.fail("/imgsz", "must be [height, width]");
  c.imgsz_h = size[0].get<int>();
  c.imgsz_w = size[1].get<int>();
  c.stride = r.integer("stride", 1, 1024);
  // The export's bound (scripts/export/detector.py IMGSZ_MAX): a folder edited past it is refused here too.
  constexpr int kMaxImgsz = 2048;
  if (c.imgsz_h < c.stride || c.imgsz_w < c.stride || c.imgsz_h > kMaxImgsz || c.imgsz_w > kMaxImgsz ||
      c.imgsz_h % c.stride || c.imgsz_w % c.stride)
    r.fail("/imgsz", "must be multiples of the stride, at most " + std::to_string(kMaxImgsz));
  if (c.task == "segment") c.mask_coefficients = r.integer("mask_coefficients", 1, 1024);
  c.ultralytics_version = r.str_or("ultralytics_version", "");
  if (check_files) check_model_file(files, dir, c.file, "/detector/file", origin);
  return c;
}

DetectorConfig load_detector_config(const std::filesystem::path& dir) {
  return parse_detector_config(
      read_model_json(dir, "detector folder", "scripts/export_sdxl.py --detector FILE.pt --out DIR"), dir,
      (dir / "model.json").string(), /*check_files=*/true);
}

UpscalerConfig load_upscaler_config(const std::filesystem::path& dir) {
  return parse_upscaler_config(read_model_json(dir, "upscaler folder", "scripts/export_sdxl.py --upscaler FILE --out DIR"),
                               dir, (dir / "model.json").string(), /*check_files=*/true);
}

ControlNetConfig load_controlnet_config(const std::filesystem::path& dir) {
  const auto path = dir / "model.json";
  return parse_controlnet_config(
      read_model_json(dir, "ControlNet folder", "scripts/export_sdxl.py --controlnet SRC --out DIR"), dir,
      path.string(), /*check_files=*/true);
}

void check_controlnet_fits(const ControlNetConfig& cn, const ModelConfig& model) {
  const std::string head = "ControlNet '" + cn.dir.string() + "' does not fit model '" + model.name + "': ";
  if (!model.unet_control.supported())
    throw ModelError(head + "the model was exported before ControlNet support (its unet.ts has no forward_control); "
                            "export it again with scripts/export_sdxl.py");
  if (cn.context_dim != model.unet_context_dim || cn.pooled_dim != model.unet_pooled_dim)
    throw ModelError(head + "it takes text of width " + std::to_string(cn.context_dim) + " (pooled " +
                     std::to_string(cn.pooled_dim) + "), the model's is " + std::to_string(model.unet_context_dim) +
                     " (pooled " + std::to_string(model.unet_pooled_dim) + ") - a ControlNet for another model family?");
  if (cn.in_channels != model.latent_channels || cn.downscale != model.vae_downsample)
    throw ModelError(head + "its latents have " + std::to_string(cn.in_channels) + " channels at 1/" +
                     std::to_string(cn.downscale) + " size, the model's " + std::to_string(model.latent_channels) +
                     " at 1/" + std::to_string(model.vae_downsample));
  if (cn.outputs.channels != model.unet_control.channels || cn.outputs.downscales != model.unet_control.downscales)
    throw ModelError(head + "it makes " + std::to_string(cn.outputs.channels.size()) +
                     " residuals whose channels or sizes are not the ones the UNet's blocks take (" +
                     std::to_string(model.unet_control.channels.size()) + ")");
}

namespace {

// /image_encoder of an IP-Adapter folder: the CLIP image processor's settings and the negative's rule.
void read_ip_image_encoder(const Reader& e, IpAdapterConfig& c) {
  c.encoder_file = e.str("file");
  c.image_size = e.integer("image_size", 1, 4096);
  auto triple = [&](const char* key, std::vector<double>& out) {
    const json& v = e.raw(key);
    if (!v.is_array() || v.size() != 3) e.fail(e.at(key), "must be 3 numbers (R, G, B)");
    for (const json& x : v) {
      if (!x.is_number()) e.fail(e.at(key), "must be 3 numbers (R, G, B)");
      out.push_back(x.get<double>());
    }
  };
  triple("mean", c.mean);
  triple("std", c.std);
  for (double s : c.std)
    if (!(s > 0)) e.fail(e.at("std"), "must be positive");
  (void)e.one_of("resample", {"bicubic"});
  c.negative_zero_image = e.one_of("negative", {"zero_embeds", "zero_image"}) == "zero_image";
}

}  // namespace

IpAdapterConfig parse_ip_adapter_config(const std::string& json_text, const std::filesystem::path& dir,
                                        const std::string& origin, bool check_files) {
  const json j = parse_json_text(json_text, origin);
  Reader r(j, origin, "");
  IpAdapterConfig c;
  const ModelConfig files = read_task_folder(
      j, r,
      {"ip_adapter", "an IP-Adapter folder", "scripts/export_sdxl.py --ip-adapter FILE --image-encoder DIR --out DIR"},
      dir, origin, c);
  c.variant = r.one_of("variant", {"plain", "plus"});
  read_ip_image_encoder(r.child("image_encoder"), c);
  const Reader a = r.child("adapter");
  c.adapter_file = a.str("file");
  c.tokens = a.integer("tokens", 1, 4096);
  c.cross_attention_dim = a.integer("cross_attention_dim", 1, 1 << 16);
  c.layers = read_layer_widths(a, "layers");
  if (check_files) {
    check_model_file(files, dir, c.encoder_file, "/image_encoder/file", origin);
    check_model_file(files, dir, c.adapter_file, "/adapter/file", origin);
  }
  return c;
}

IpAdapterConfig load_ip_adapter_config(const std::filesystem::path& dir) {
  const auto path = dir / "model.json";
  return parse_ip_adapter_config(read_model_json(dir, "IP-Adapter folder",
                                                 "scripts/export_sdxl.py --ip-adapter FILE --image-encoder DIR --out DIR"),
                                 dir, path.string(), /*check_files=*/true);
}

void check_ip_adapter_fits(const IpAdapterConfig& ip, const ModelConfig& model) {
  const std::string head = "IP-Adapter '" + ip.dir.string() + "' does not fit model '" + model.name + "': ";
  if (!model.unet_ip.supported())
    throw ModelError(head + "the model was exported before IP-Adapter support (its unet.ts has no forward_ip); "
                            "export it again with scripts/export_sdxl.py");
  if (ip.cross_attention_dim != model.unet_ip.cross_attention_dim)
    throw ModelError(head + "its image tokens are " + std::to_string(ip.cross_attention_dim) +
                     " wide, the UNet's cross-attention takes " + std::to_string(model.unet_ip.cross_attention_dim) +
                     " - an IP-Adapter for another model family (SD 1.x / 2.x)?");
  if (ip.layers != model.unet_ip.layers)
    throw ModelError(head + "it has " + std::to_string(ip.layers.size()) +
                     " cross-attention layers whose widths are not the UNet's (" +
                     std::to_string(model.unet_ip.layers.size()) + ")");
}

template <class Check>
void TaskFolderFits::once(const std::string& key, Check&& check) {
  auto [it, fresh] = errors_.try_emplace(key);
  if (fresh) {
    try {
      check();
    } catch (const ModelError& e) {
      it->second = e.what();
    }
  }
  if (!it->second.empty()) throw ModelError(it->second);
}

void TaskFolderFits::vae(const std::string& dir) {
  once("vae:" + dir, [&] { check_vae_fits(load_vae_config(dir), model_); });
}
void TaskFolderFits::controlnet(const std::string& dir) {
  once("controlnet:" + dir, [&] {
    ControlNetConfig c = load_controlnet_config(dir);
    check_controlnet_fits(c, model_);
    controlnets_.emplace(dir, std::move(c));
  });
}
std::string TaskFolderFits::control_type(const std::string& dir, const std::string& type) {
  controlnet(dir);
  return control_type_problem(controlnets_.at(dir), type);
}
void TaskFolderFits::ip_adapter(const std::string& dir) {
  once("ip_adapter:" + dir, [&] { check_ip_adapter_fits(load_ip_adapter_config(dir), model_); });
}

ModelConfig load_model_config(const std::filesystem::path& dir) {
  const auto path = dir / "model.json";
  return parse_model_config(read_model_json(dir, "model directory", "scripts/export_sdxl.py"), dir, path.string(),
                            /*check_files=*/true);
}

void check_generation_size(const ModelConfig& cfg, int width, int height, int batch) {
  const ModelLimits& l = cfg.limits;
  auto check = [&](const char* what, int v) {
    if (v < kSizeHardMin || v > kSizeHardMax || v % l.size_multiple != 0)
      throw UsageError(std::string(what) + " " + std::to_string(v) + " is outside what model '" + cfg.name +
                       "' can run: " + std::to_string(kSizeHardMin) + ".." + std::to_string(kSizeHardMax) +
                       " in multiples of " + std::to_string(l.size_multiple) + " (model.json /limits/size_multiple)");
  };
  check("width", width);
  check("height", height);
  if (batch < 1 || batch > l.batch_max)
    throw UsageError("batch " + std::to_string(batch) + " exceeds the model's batch_max " + std::to_string(l.batch_max));
}

std::string unchecked_size_note(const ModelConfig& cfg, int width, int height) {
  const ModelLimits& l = cfg.limits;
  if (width >= l.width_min && width <= l.width_max && height >= l.height_min && height <= l.height_max) return "";
  return std::to_string(width) + "x" + std::to_string(height) + " is outside the sizes model '" + cfg.name +
         "' was checked at (" + std::to_string(l.width_min) + ".." + std::to_string(l.width_max) + " x " +
         std::to_string(l.height_min) + ".." + std::to_string(l.height_max) +
         ", model.json /limits): it runs, but the export did not compare its traces with eager there";
}

int clip_skip_max(const ModelConfig& cfg) {
  int n = cfg.text_encoders.empty() ? 0 : std::numeric_limits<int>::max();
  for (const TextEncoderConfig& te : cfg.text_encoders) n = std::min(n, te.hidden_states);
  return std::max(n, 2);
}

void check_clip_skip(const ModelConfig& cfg, int clip_skip) {
  const int max = clip_skip_max(cfg);
  if (clip_skip >= 1 && clip_skip <= max) return;
  bool recorded = !cfg.text_encoders.empty();
  for (const TextEncoderConfig& te : cfg.text_encoders) recorded &= te.hidden_states > 0;
  if (!recorded && clip_skip > max)
    throw UsageError("clip skip " + std::to_string(clip_skip) + " needs the text encoders' hidden states, which model '" +
                     cfg.name + "' was exported without (it allows only 1 or 2, the default layer): export it again "
                     "with scripts/export_sdxl.py");
  throw UsageError("clip skip " + std::to_string(clip_skip) + " is outside what model '" + cfg.name + "' allows: 1.." +
                   std::to_string(max) + " (the hidden states of its smaller text encoder; model.json "
                   "/text_encoders/N/hidden_states)");
}

std::uint64_t module_file_bytes(const ModelConfig& cfg) {
  std::uint64_t sum = 0;
  for (const auto& [rel, bytes] : cfg.file_bytes)
    if (rel.size() > 3 && rel.compare(rel.size() - 3, 3, ".ts") == 0) sum += bytes;
  return sum;
}

namespace {

// Why package `a` cannot run on `device` in `dtype` on a GPU of `capability`;
// `flags`: the export_sdxl.py options that write it ("--aoti", "--fp8 --aoti").
std::string aoti_mismatch(const AotiConfig& a, const std::string& flags, const std::string& device,
                          const std::string& dtype, const std::string& capability) {
  if (a.device != device)
    return a.file + " was compiled for " + a.device + ", the model runs on " + device +
           "; re-export with scripts/export_sdxl.py " + flags + " --device " + device;
  if (a.dtype != dtype)
    return a.file + " was compiled for " + a.dtype + ", the model runs in " + dtype +
           " (--dtype); drop --dtype or re-export with --dtype " + dtype + " --aoti";
  if (device == "cuda" && !a.capability.empty() && !capability.empty() && a.capability != capability)
    return a.file + " was compiled on " + (a.gpu.empty() ? "a GPU" : a.gpu) + " (compute capability " + a.capability +
           "), whose kernels do not run on this GPU (compute capability " + capability +
           "); re-export with scripts/export_sdxl.py " + flags + " on this GPU kind";
  return "";
}

}  // namespace

std::string unet_aoti_mismatch(const ModelConfig& cfg, const std::string& device, const std::string& dtype,
                               const std::string& capability) {
  const bool fp8 = cfg.unet_precision == "fp8";
  if (cfg.unet_aoti.file.empty())
    return fp8 ? "the model has no unet_fp8.pt2 (model.json has no /unet/fp8/aoti); export it with scripts/export_sdxl.py "
                 "--fp8 --aoti"
               : "the model has no unet.pt2 (model.json has no /unet/aoti); export it with scripts/export_sdxl.py --aoti";
  return aoti_mismatch(cfg.unet_aoti, fp8 ? "--fp8 --aoti" : "--aoti", device, dtype, capability);
}

std::string vae_aoti_mismatch(const ModelConfig& cfg, const std::string& device, const std::string& dtype,
                              const std::string& capability) {
  if (cfg.vae_decoder_aoti.file.empty())
    return "the model has no vae_decoder.pt2 (model.json has no /vae_decoder/aoti); export it with "
           "scripts/export_sdxl.py --aoti";
  const AotiConfig& a = cfg.vae_decoder_aoti;
  if (a.device == device && a.dtype != dtype)
    return a.file + " was compiled to decode in " + a.dtype + ", the VAE decodes in " + dtype +
           " (--vae-dtype, or --dtype with --vae-dtype auto); decode in " + a.dtype + " to use it";
  return aoti_mismatch(a, "--aoti", device, dtype, capability);
}

ModelConfig with_unet_precision(const ModelConfig& cfg, const std::string& precision, const std::string& dtype_override) {
  if (precision == "default") return cfg;
  if (precision != "fp8") throw UsageError("--precision '" + precision + "' is not one of: default, fp8");
  if (cfg.unet_fp8.file.empty())
    throw ModelError("--precision fp8: model '" + cfg.name + "' (" + cfg.dir.string() +
                     ") has no FP8 UNet (model.json has no /unet/fp8); export it with scripts/export_sdxl.py --fp8");
  if (!dtype_override.empty() && dtype_override != cfg.dtype)
    throw UsageError("--precision fp8 runs the model's " + cfg.dtype + " UNet with FP8 linear layers; drop --dtype " +
                     dtype_override);
  ModelConfig c = cfg;
  c.unet_file = cfg.unet_fp8.file;
  c.unet_aoti = cfg.unet_fp8.aoti;
  c.unet_precision = "fp8";
  return c;
}

std::string resolve_unet_backend(const ModelConfig& cfg, const std::string& requested, const std::string& device,
                                 const std::string& dtype, std::string* why, const std::string& capability) {
  if (requested != "auto" && requested != "torchscript" && requested != "aoti")
    throw UsageError("--unet-backend '" + requested + "' is not one of: auto, torchscript, aoti");
  if (requested != "auto") return requested;
  const std::string unfit = unet_aoti_mismatch(cfg, device, dtype, capability);
  if (why) *why = unfit.empty() ? "the model has a " + cfg.unet_aoti.file + " for " + device + " " + dtype : unfit;
  return unfit.empty() ? "aoti" : "torchscript";
}

int verify_model_files(const ModelConfig& cfg) {
  int checked = 0;
  for (const auto& [rel, want] : cfg.file_sha256) {
    const std::filesystem::path p = cfg.path_of(rel);
    const auto got = sha256_file_hex(p);
    if (!got) throw ModelError("--verify-model: cannot read '" + p.string() + "'");
    if (*got != want)
      throw ModelError("--verify-model: '" + p.string() + "' has sha256 " + *got + ", model.json records " + want +
                       ": the file is damaged or from another export (export the model again)");
    ++checked;
  }
  return checked;
}

}  // namespace sdxl
