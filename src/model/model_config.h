// The model directory contract (docs/models-and-export.md): model.json describes the exported
// TorchScript modules, tokenizers, dims, dtype, scheduler defaults and limits.
// load_model_config() reads and validates it; every error is a ModelError that
// names the file and the JSON pointer of the bad field. torch-free.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace sdxl {

struct SchedulerConfig {
  int num_train_timesteps = 1000;
  double beta_start = 0.00085;
  double beta_end = 0.012;
  std::string beta_schedule = "scaled_linear";  // scaled_linear | linear
  std::string timestep_spacing = "leading";     // leading | trailing | linspace
  int steps_offset = 1;
  std::string prediction_type = "epsilon";      // epsilon | v_prediction
  // diffusers' rescale_betas_zero_snr: betas rescaled to zero terminal SNR
  // (rescale_zero_terminal_snr), the schedulers' alphas_cumprod[-1] as each sets it.
  bool rescale_betas_zero_snr = false;
  bool v_prediction() const { return prediction_type == "v_prediction"; }
};

struct TextEncoderConfig {
  std::string file;
  std::string tokenizer;  // folder name inside the model dir
  std::string pad_token;
  int hidden_dim = 0;
  int pooled_dim = 0;  // 0 when the pooled output is not used
  // How many hidden states the module's hidden_states() method returns
  // (layers + 1: the embeddings', then each layer's); 0 when the export has no
  // such method (exported before clip skip), which then allows no clip skip >= 3.
  int hidden_states = 0;
};

// A file the model was exported from, as model.json records it ("source_file":
// the checkpoint, "vae_file": a separate VAE): its file name and sha256 (64
// lowercase hex digits). Both empty when the export recorded none (--tiny,
// --random-full, a diffusers folder).
struct ExportSourceFile {
  std::string name;
  std::string sha256;
  bool recorded() const { return !sha256.empty(); }
  // A1111's short hash of the file ("Model hash", "VAE hash"): the first 10 hex digits.
  std::string short_hash() const { return sha256.substr(0, 10); }
};

struct ModelLimits {
  int batch_max = 8;
  int width_min = 64, width_max = 4096;
  int height_min = 64, height_max = 4096;
  int size_multiple = 8;
  int context_chunks_max = 1;
};

// An AOTInductor package in model.json (optional; written by export_sdxl.py
// --aoti): unet.aoti (the UNet), unet.fp8.aoti, vae_decoder.aoti (the VAE
// decoder). The module compiled without its weights, and the input ranges it
// was compiled for (rows = batch rows incl. CFG, tokens = context length, none
// for the VAE; latent sizes in latent pixels; min == max when fixed).
struct AotiConfig {
  std::string file;    // "" when the model has no AOTI package
  std::string device;  // cpu | cuda: the device it was compiled for
  std::string dtype;   // fp32 | fp16 | bf16: the dtype of its inputs and weights
  // The GPU it was compiled on (cuda; "" when not recorded): its kernels are
  // built for that compute capability ("9.0") and run on no other.
  std::string gpu, capability;
  int rows_min = 1, rows_max = 1;
  int tokens_min = 77, tokens_max = 77;
  int latent_height_min = 1, latent_height_max = 1;
  int latent_width_min = 1, latent_width_max = 1;

  // Whether `rows` latents of latent_h x latent_w are inside the compiled ranges.
  bool covers_latents(std::int64_t rows, std::int64_t latent_h, std::int64_t latent_w) const {
    auto in = [](std::int64_t v, int lo, int hi) { return v >= lo && v <= hi; };
    return in(rows, rows_min, rows_max) && in(latent_h, latent_height_min, latent_height_max) &&
           in(latent_w, latent_width_min, latent_width_max);
  }
};

// unet.control in model.json: the ControlNet residuals unet.ts's forward_control
// method adds (diffusers' down_block_additional_residuals, then the mid block's),
// each one's channels and downscale from the latent. Empty in models exported
// before ControlNet support, which then take no ControlNet.
struct UnetControlInputs {
  std::vector<int> channels, downscales;  // the down residuals, then the mid one
  bool supported() const { return !channels.empty(); }
};

// unet.ip_adapter in model.json: unet.ts's forward_ip / forward_control_ip take
// an IP-Adapter's keys and values for each cross-attention layer (diffusers'
// IPAdapterAttnProcessor2_0 with one adapter): their widths, in diffusers'
// attn_processors order, and the text width they were made for. Empty in
// models exported before IP-Adapter support, which then take no IP-Adapter.
struct UnetIpInputs {
  std::vector<int> layers;
  int cross_attention_dim = 0;
  bool supported() const { return !layers.empty(); }
};

// unet.regions in model.json: unet.ts's forward_regional methods (attention couple,
// docs/story-tools.md#regions) take each row's prompts [B, R, L, C] and, for each downscale here (of
// the blocks with cross-attention, relative to the latent, ascending), the prompts' weights per cell
// [B, R, n_d]; max_regions bounds R - 1. Empty in models exported before regional prompts.
struct UnetRegionInputs {
  std::vector<int> downscales;
  int max_regions = 0;
  bool supported() const { return !downscales.empty(); }
};

// unet.fp8 in model.json (optional; written by export_sdxl.py --fp8): a second
// UNet, unet_fp8.ts, whose transformer-block linear layers are FP8 e4m3 with
// static per-tensor scales (each such weight has a `<layer>.weight_scale`
// buffer; docs/models-and-export.md#fp8-unet), and its AOTInductor package.
struct UnetFp8Config {
  std::string file;      // "" when the model has no FP8 UNet
  std::string format;    // what the export says of its scales
  int layers = 0;        // how many linear layers are FP8
  AotiConfig aoti;       // .file empty: no unet_fp8.pt2
};

struct GenerationDefaults {
  int width = 1024, height = 1024, steps = 28;
  double cfg = 7.0;
  // A task's guidance_rescale when it gives none (model.json /defaults/guidance_rescale;
  // export_sdxl.py --guidance-rescale: 0.7 for v-prediction with zero-SNR, else 0).
  double guidance_rescale = 0.0;
};

struct ModelConfig {
  std::filesystem::path dir;
  int format_version = 0;
  std::string name;
  std::string source;
  std::string architecture;
  std::string dtype;          // fp32 | fp16 | bf16
  std::string vae_dtype;      // dtype the VAE modules were exported in
  std::string export_device;  // cpu | cuda
  std::string torch_version;
  double vae_scaling_factor = 0.13025;
  int vae_downsample = 8;
  int latent_channels = 4;
  std::vector<TextEncoderConfig> text_encoders;  // exactly two for SDXL
  std::string unet_file;
  int unet_context_dim = 0;
  int unet_pooled_dim = 0;
  int unet_time_ids_dim = 6;
  // /unet/in_channels: latent_channels, or 2 * latent_channels + 1 for an
  // inpainting UNet (the latents, the mask and the masked image's latents).
  int unet_in_channels = 4;
  bool inpainting_unet() const { return unet_in_channels == 2 * latent_channels + 1; }
  AotiConfig unet_aoti;      // .file empty: no unet.pt2
  UnetFp8Config unet_fp8;    // .file empty: no unet_fp8.ts
  // The UNet's precision: "" = the model dtype (unet_file as exported); "fp8"
  // after with_unet_precision, which points unet_file / unet_aoti at the FP8 UNet.
  std::string unet_precision;
  UnetControlInputs unet_control;
  UnetIpInputs unet_ip;
  UnetRegionInputs unet_regions;
  std::string vae_decoder_file;
  AotiConfig vae_decoder_aoti;   // .file empty: no vae_decoder.pt2
  std::string vae_encoder_file;  // optional ("" when absent)
  SchedulerConfig scheduler;
  GenerationDefaults defaults;
  ModelLimits limits;
  std::map<std::string, std::uint64_t> file_bytes;  // relative path -> size
  std::map<std::string, std::string> file_sha256;   // relative path -> sha256 (hex), when the export recorded it
  ExportSourceFile source_file;  // the checkpoint file of the export, when recorded
  ExportSourceFile vae_file;     // the VAE file of the export, when recorded

  std::filesystem::path path_of(const std::string& rel) const { return dir / rel; }
};

inline constexpr int kModelFormatVersion = 1;

// Reads DIR/model.json, validates fields and that every listed file exists
// with the recorded size. Throws ModelError.
ModelConfig load_model_config(const std::filesystem::path& dir);

// --verify-model: every file whose sha256 model.json records is read and
// hashed; a mismatch (a flipped byte, a file from another export) throws
// ModelError naming the file. Returns how many files were checked (0 for a
// model exported before the sums were recorded).
int verify_model_files(const ModelConfig& cfg);

// Parses model.json text (for tests); `origin` names the file in messages.
ModelConfig parse_model_config(const std::string& json_text, const std::filesystem::path& dir,
                               const std::string& origin, bool check_files);

// A VAE folder (export_sdxl.py --vae-only; model.json "kind": "vae"): a config
// with only the VAE's fields (dtypes, scaling factor, downsample, latent
// channels, vae_decoder / vae_encoder files, vae_file) and architecture "vae".
// Throws ModelError naming the folder or the field.
ModelConfig load_vae_config(const std::filesystem::path& dir);
ModelConfig parse_vae_config(const std::string& json_text, const std::filesystem::path& dir,
                             const std::string& origin, bool check_files);
// Throws ModelError when the VAE's latents are not the model's (channels, downsample).
void check_vae_fits(const ModelConfig& vae, const ModelConfig& model);

// What every folder a task names beside the model (a ControlNet, an IP-Adapter)
// records in its model.json besides its own fields.
struct TaskFolderConfig {
  std::filesystem::path dir;
  std::string name, dtype, export_device;
  ExportSourceFile source_file;  // the file it was exported from, when recorded
  std::map<std::string, std::string> file_sha256;
  // The name images give it: its source file's stem, else model.json's name.
  std::string display_name() const;
  // A1111's short hash ("[hash]" in a ControlNet unit's text): 8 hex digits of
  // the source file's sha256, else of `main_file`'s; "" when neither is recorded.
  std::string short_hash_of(const std::string& main_file) const;
};

// A ControlNet folder (export_sdxl.py --controlnet; model.json "kind": "controlnet"):
// controlnet.ts maps (latent, timestep, context, text_embeds, time_ids, control
// image [B,3,H,W] in [0,1]) to the residuals the UNet's forward_control takes.
// A Union ControlNet (controlnet.union in model.json) takes K control images
// [K,B,3,H,W], the one-hot of their types, their type indices and scales
// (scripts/export/controlnet.py states the contract).
struct ControlNetConfig : TaskFolderConfig {
  std::string file;
  int in_channels = 4, context_dim = 0, pooled_dim = 0, cond_channels = 3, downscale = 8;
  UnetControlInputs outputs;  // the residuals it makes
  int union_type_count = 0;               // > 0: a Union ControlNet with this many control types
  std::map<std::string, int> union_types;  // each type's names ("openpose", "canny", ...) -> its index
  bool is_union() const { return union_type_count > 0; }
  std::string short_hash() const { return short_hash_of(file); }
};

// Why `type` (a task's "type" of this ControlNet, "" for none) cannot drive
// `cn`, or "": a Union ControlNet needs one of its types' names, a plain one
// takes none.
std::string control_type_problem(const ControlNetConfig& cn, const std::string& type);

// Throws ModelError naming the folder or the field.
ControlNetConfig load_controlnet_config(const std::filesystem::path& dir);
ControlNetConfig parse_controlnet_config(const std::string& json_text, const std::filesystem::path& dir,
                                         const std::string& origin, bool check_files);
// Throws ModelError saying why the ControlNet cannot drive this model's UNet
// (an export without forward_control, other widths or residuals).
void check_controlnet_fits(const ControlNetConfig& cn, const ModelConfig& model);

// An IP-Adapter folder (export_sdxl.py --ip-adapter FILE --image-encoder DIR;
// model.json "kind": "ip_adapter"): image_encoder.ts maps CLIP pixels
// [N,3,S,S] to what the adapter takes (plain: image_embeds, plus: the
// penultimate hidden states); ip_adapter.ts maps that to the keys and values of
// every cross-attention layer, [N, tokens, width] each (k_0, v_0, k_1, ...).
struct IpAdapterConfig : TaskFolderConfig {
  std::string variant;  // plain | plus
  std::string encoder_file, adapter_file;
  int image_size = 224;  // the CLIP image processor's resize (shortest edge) and centre crop
  std::vector<double> mean, std;
  bool negative_zero_image = false;  // negative = the encoder on a zero image (plus), else zero embeds (plain)
  int tokens = 0, cross_attention_dim = 0;
  std::vector<int> layers;
  std::string short_hash() const { return short_hash_of(adapter_file); }
};

// Throws ModelError naming the folder or the field.
IpAdapterConfig load_ip_adapter_config(const std::filesystem::path& dir);
IpAdapterConfig parse_ip_adapter_config(const std::string& json_text, const std::filesystem::path& dir,
                                        const std::string& origin, bool check_files);
// Throws ModelError saying why the adapter cannot feed this model's UNet (an
// export without forward_ip, another text width, other layers).
void check_ip_adapter_fits(const IpAdapterConfig& ip, const ModelConfig& model);

// The fit checks of the folders a batch's tasks name (VAE, ControlNet,
// IP-Adapter) against `model`: each folder's model.json is read and checked
// once, however many tasks name it. Each call throws the folder's ModelError.
class TaskFolderFits {
 public:
  explicit TaskFolderFits(const ModelConfig& model) : model_(model) {}
  void vae(const std::string& dir);
  void controlnet(const std::string& dir);
  // controlnet(dir), then control_type_problem of its config and `type`.
  std::string control_type(const std::string& dir, const std::string& type);
  void ip_adapter(const std::string& dir);

 private:
  template <class Check>
  void once(const std::string& key, Check&& check);
  const ModelConfig& model_;
  std::map<std::string, std::string> errors_;  // kind + folder -> "" or the error
  std::map<std::string, ControlNetConfig> controlnets_;  // the ControlNet folders that fit
};

// Bytes of the TorchScript files (*.ts) listed in model.json: what the resident
// weights take on the device when loaded in the exported dtype.
std::uint64_t module_file_bytes(const ModelConfig& cfg);

// Sizes: model.json's /limits range (width_min..width_max, height_min..height_max)
// is what the export checked its traces at. A multiple of size_multiple inside
// kSizeHardMin..kSizeHardMax but outside that range runs with a warning (nothing
// is known to break there; the traced graphs follow the size, but were not
// compared with eager at it): unchecked_size_note says so. Throws UsageError
// naming the value for a size that is not a multiple or is outside the hard
// bounds, and for a batch above batch_max.
inline constexpr int kSizeHardMin = 64;
inline constexpr int kSizeHardMax = 8192;
void check_generation_size(const ModelConfig& cfg, int width, int height, int batch);
// "" for a size inside the checked range, else the warning to log.
std::string unchecked_size_note(const ModelConfig& cfg, int width, int height);

// Clip skip N (A1111's count from the end; 1 and 2 both mean SDXL's default,
// the penultimate layer): the largest N the model allows, the hidden states
// both text encoders have (2 when the export recorded none).
int clip_skip_max(const ModelConfig& cfg);
// Throws UsageError naming the model and its limit when N is outside 1..clip_skip_max.
void check_clip_skip(const ModelConfig& cfg, int clip_skip);

// Why the model's unet.pt2 cannot run on `device` ("cpu" / "cuda") in `dtype`
// ("fp32" / "fp16" / "bf16") on a GPU of compute `capability` ("9.0"; "" =
// not known, not checked), with what to do about it; "" when it can.
std::string unet_aoti_mismatch(const ModelConfig& cfg, const std::string& device, const std::string& dtype,
                               const std::string& capability = "");

// The same for the model's vae_decoder.pt2, to decode in `dtype` (the VAE
// decode dtype, --vae-dtype).
std::string vae_aoti_mismatch(const ModelConfig& cfg, const std::string& device, const std::string& dtype,
                              const std::string& capability = "");

// --precision: "default" returns `cfg` unchanged; "fp8" returns it with
// unet_file / unet_aoti replaced by the FP8 UNet's and unet_precision "fp8".
// ModelError when the model has no FP8 UNet (export it with --fp8); UsageError
// for another value, or for fp8 with a --dtype (`dtype_override`, "" = none)
// other than the model's (the FP8 UNet's other layers are in the model dtype).
ModelConfig with_unet_precision(const ModelConfig& cfg, const std::string& precision, const std::string& dtype_override);

// The UNet backend to run for --unet-backend `requested` (auto, torchscript,
// aoti; anything else is a UsageError): auto is aoti when unet_aoti_mismatch
// finds nothing, else torchscript, and `why` (optional) says why; torchscript
// and aoti are returned as asked (AotiUnet refuses a mismatch).
std::string resolve_unet_backend(const ModelConfig& cfg, const std::string& requested, const std::string& device,
                                 const std::string& dtype, std::string* why = nullptr,
                                 const std::string& capability = "");

}  // namespace sdxl
