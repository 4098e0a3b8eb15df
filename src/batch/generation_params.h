// What one image needs: prompt, negative prompt, seed and sampling settings,
// plus its A1111-style `parameters` text (the PNG metadata users paste into
// other tools). torch-free.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "batch/lora_ref.h"

namespace sdxl {

// One ControlNet of a task (diffusers' StableDiffusionXLControlNetPipeline):
// a ControlNet folder (export_sdxl.py --controlnet), its control image (a PNG,
// resized to the task's size as diffusers' control image processor does), its
// strength (controlnet_conditioning_scale) and the fraction of the model calls
// it acts in (control_guidance_start / _end). A Union ControlNet
// (StableDiffusionXLControlNetUnionPipeline) names each image's control type;
// the images of one call (diffusers' control_mode list, a batch file's
// "images") are consecutive entries of the same folder, each after the first
// marked same_call.
struct ControlNetUse {
  std::string model;  // the folder
  std::string image;  // the control image
  double strength = 1.0;
  double start = 0.0, end = 1.0;
  std::string type;        // a Union ControlNet's control type ("openpose"); "" for a plain ControlNet
  bool same_call = false;  // one call with the entry before (a Union ControlNet's several images)
  bool operator==(const ControlNetUse&) const = default;
};

// A task's IP-Adapter (diffusers' load_ip_adapter + ip_adapter_image): an
// IP-Adapter folder (export_sdxl.py --ip-adapter), its reference images (PNGs;
// several give one token row, in this order) and its scale (set_ip_adapter_scale).
struct IpAdapterUse {
  std::string model;  // the folder; "" = no IP-Adapter
  std::vector<std::string> images;
  double scale = 1.0;
  bool on() const { return !model.empty(); }
  bool operator==(const IpAdapterUse&) const = default;
};

// One region of a panel (attention couple, docs/story-tools.md#regions): where it is (a box in
// fractions of the panel, or a mask PNG whose grey levels / 255 weigh each place), its prompt and
// negative (final texts: a named character's joined and the style applied when the batch file was
// read), its weight, and a reference picture acting only inside it (the character's, with its scale;
// "" none). In every cross-attention layer the prompts' attentions are mixed by the normalised weights
// weight_i * mask_i (regions) and 1 - (1 - region_base) * max_i mask_i (the task's own prompt).
struct RegionUse {
  double x0 = 0, y0 = 0, x1 = 1, y1 = 1;  // the box (when mask is "")
  std::string mask;                       // a mask PNG (absolute once read); "" = the box
  std::string mask_sha256;                // the mask file's (the manifest compares it)
  std::string prompt, negative;
  double weight = 1.0;
  std::string character;                  // the character named, "" none
  std::string reference;                  // its reference picture (a PNG), "" none
  double reference_scale = 1.0;
  bool operator==(const RegionUse&) const = default;
};

// A task's final upscale (its frame; image/frame_upscale.h makes it): an upscaler folder (export_sdxl.py
// --upscaler) or "Lanczos" (no model), then LANCZOS by a factor (scale > 0) or to width x height with a
// fit ("stretch", "crop", "pad"). weights_sha256 is the folder's upscaler file's as its model.json
// records it (filled when the folder is checked): the manifest compares it, so a new export makes the
// frame again.
struct UpscaleUse {
  std::string model;  // the folder, "Lanczos", or "" = no final upscale
  double scale = 0;
  int width = 0, height = 0;
  std::string fit = "stretch";
  std::string weights_sha256;
  bool on() const { return !model.empty(); }
  bool uses_model() const { return on() && model != kLanczosUpscaler; }  // an upscaler folder's passes first
  bool operator==(const UpscaleUse&) const = default;
  static constexpr const char* kLanczosUpscaler = "Lanczos";
};
// "Lanczos" for "lanczos" in any case (no model), else `name` as given.
std::string canonical_upscale_model(const std::string& name);

// Whether a (canonical) hires upscaler is an upscaler folder, not one of hires_upscaler_names().
bool is_hires_upscaler_folder(const std::string& upscaler);

// One unit of a task's "detailer" (ADetailer's semantics, docs/detailer.md): a detector folder
// (export_sdxl.py --detector) finds regions in the decoded image; each region's mask (its box, or its
// segment), dilated (> 0) or eroded (< 0) by `dilate` px, is inpainted "only masked" at the task's
// size with `blur`, `padding` and denoising strength `denoise`, seed = the image's seed + the region's
// index. prompt / negative: "" = the task's; "[PROMPT]" stands for the task's. max: the k largest
// regions (0 = all); steps: 0 = the task's. weights_sha256: the detector file's as its model.json
// records it (the manifest compares it).
struct DetailerUse {
  std::string detector;
  std::string prompt, negative;
  double confidence = 0.3;
  int dilate = 4;
  int blur = 4;
  double denoise = 0.4;
  int padding = 32;
  int max = 0;
  int steps = 0;
  std::string weights_sha256;
  bool operator==(const DetailerUse&) const = default;
};
// A detailer prompt against the image's: "" -> `image_prompt`; each "[PROMPT]" replaced by it.
std::string detailer_prompt(const std::string& unit_prompt, const std::string& image_prompt);
// ADetailer's suffix of unit k (0-based) in the PNG's parameters: "", " 2nd", " 3rd", " 4th", ...
std::string detailer_unit_suffix(int k);

// 8-bit RGB pixels held in memory (a detailer region's init image and mask), row-major.
struct PixelImage {
  int width = 0, height = 0;
  std::vector<std::uint8_t> rgb;
};

struct GenerationParams {
  std::string prompt;
  std::string negative_prompt;
  std::int64_t seed = 0;  // noise seed of this image (task seed + image index)
  int steps = 28;
  double cfg = 7.0;
  int width = 1024;
  int height = 1024;
  std::string sampler = "Euler";       // A1111 sampler name (sdxl/sampler_plan.h), canonical after validation
  std::string schedule = "Automatic";  // A1111 schedule type; Automatic = the model's own (diffusers leading, offset 1)
  double guidance_rescale = 0.0;       // diffusers' guidance_rescale (0 = off; the model's default fills in)
  // diffusers' set_timesteps(timesteps=...): the UNet's timesteps, strictly decreasing; the step
  // count is their number. Empty = the sampler's own spacing of `steps`.
  std::vector<int> timesteps;
  double eta = 0.3;                    // TCD's eta (its gamma): 0 deterministic .. 1 fully stochastic
  // Clip skip, counted from the end as A1111 does: 0 = not set; 1 and 2 give
  // SDXL's default (the penultimate hidden states); N >= 3 takes hidden_states[-N]
  // of both text encoders (diffusers' clip_skip = N - 2). Pooled outputs unchanged.
  int clip_skip = 0;
  // img2img (StableDiffusionXLImg2ImgPipeline): the input PNG, at width x height
  // exactly (no resampling), and the denoising strength. "" = text-to-image.
  std::string init_image;
  // A VAE folder (export_sdxl.py --vae-only) that encodes and decodes this
  // image instead of the model's VAE; "" = the model's.
  std::string vae;
  double strength = 0.75;
  // Inpainting (StableDiffusionXLInpaintPipeline, 4-channel UNet): a mask PNG
  // beside an init image (white = repaint, black = keep), Gaussian-blurred by
  // mask_blur (PIL radius; 0 = none), resized to width x height (Lanczos) and
  // binarised at 0.5; "" = no mask. mask_sha256 is the file's when it was read
  // (the manifest compares it: an edited mask makes the image again).
  std::string mask;
  std::string mask_sha256;
  int mask_blur = 4;
  // "whole": the whole image is sampled; "masked" (diffusers' padding_mask_crop,
  // A1111's "Only masked"): the box around the blurred mask grown by
  // inpaint_padding pixels and to the task's aspect ratio is cut out, sampled at
  // width x height and pasted back through the blurred mask.
  std::string inpaint_area = "whole";
  int inpaint_padding = 32;
  bool inpaint() const { return !mask.empty() || mask_pixels != nullptr; }
  bool inpaint_masked() const { return inpaint() && inpaint_area == "masked"; }
  // A detailer region's pass: its init image and mask in memory (not files). init_image and mask
  // then only name them in logs; the pipeline reads these instead.
  std::shared_ptr<const PixelImage> init_pixels, mask_pixels;
  // Hires fix as A1111 offers it: a second pass at int(width * scale) rounded
  // down to a multiple of 8 (same for height), starting from the first result
  // upscaled in latent space or in pixel space, with its own steps (0 = steps)
  // and denoising strength. scale 0 = off. `upscaler` is one of
  // hires_upscaler_names() or an upscaler folder (export_sdxl.py --upscaler, an
  // absolute path once read); weights_sha256 is that folder's upscaler file's as
  // its model.json records it (the manifest compares it: a new export makes the
  // image again).
  struct Hires {
    double scale = 0.0;
    std::string upscaler = "Latent";
    int steps = 0;
    double denoise = 0.7;
    std::string weights_sha256;
  } hires;

  bool hires_on() const { return hires.scale > 0.0; }
  // The hires fix upscales by an upscaler folder's model (A1111's passes, then LANCZOS).
  bool hires_uses_model() const { return hires_on() && is_hires_upscaler_folder(hires.upscaler); }
  int hires_width() const { return static_cast<int>(width * hires.scale) / 8 * 8; }
  int hires_height() const { return static_cast<int>(height * hires.scale) / 8 * 8; }
  int hires_steps() const { return hires.steps > 0 ? hires.steps : steps; }
  std::vector<LoraRef> loras;          // resolved --lora / batch entries; prompt tags are added at generation
  std::vector<ControlNetUse> controlnets;  // summed per step, in this order
  IpAdapterUse ip_adapter;
  UpscaleUse upscale;  // the frame the PNG is written as
  std::vector<DetailerUse> detailer;  // after decode, before the frame, in this order
  // Regions (attention couple) and the weight of the task's own prompt inside them.
  std::vector<RegionUse> regions;
  double region_base = 0.2;
  bool has_regions() const { return !regions.empty(); }
  // Whether any region brings a reference picture (an IP-Adapter group of its own).
  bool region_references() const;
  std::string notes;  // the batch file's "notes": carried into the manifest, changes no pixel
};

// The frame size of a final upscale of a width x height image (image/frame_upscale.h's rule: by a
// factor, round(width x scale) x round(height x scale) (at least 1); else the size asked for).
std::pair<int, int> upscale_frame_size(const UpscaleUse& u, int width, int height);
// The size the decoded image has before its final upscale (the hires pass's when it is on).
std::pair<int, int> decoded_size(const GenerationParams& p);
// The limits of a frame: each side 8..kMaxFrameSide, a factor above 0 and at most kMaxUpscaleFactor.
inline constexpr int kMaxFrameSide = 16384;
inline constexpr double kMaxUpscaleFactor = 16;
// What is wrong with `u` for a width x height image ("" when fine), naming the key at fault
// ("scale": ..., "size": ..., "fit": ...): a factor <= 0, NaN or above the limit, a size or a
// frame outside the limits, an unknown fit, both or neither of scale and size.
std::string upscale_problem(const UpscaleUse& u, int width, int height, std::string& key);
// "1080x1920" -> 1080, 1920; false when the text is not WxH with two positive integers.
bool parse_frame_size(const std::string& text, int& width, int& height);
// A1111's postprocessing fields, as `sdxl-batch upscale` and the run's frames write them after the
// image's parameters: "Postprocess upscale by: S" or "Postprocess upscale to: WxH, Postprocess upscale
// fit: FIT", then ", Postprocess upscaler: NAME".
std::string postprocess_upscale_fields(double scale, int width, int height, const std::string& fit,
                                       const std::string& upscaler_name);

// Hires fix upscalers (A1111 names): latent space "Latent" (bilinear),
// "Latent (antialiased)", "Latent (bicubic)", "Latent (bicubic antialiased)",
// "Latent (nearest)", "Latent (nearest-exact)"; pixel space "Nearest" (VAE
// decode -> PIL-style nearest resize of the 8-bit image -> VAE encode) and
// "Lanczos" (the same with PIL's LANCZOS). Anything else names an upscaler folder
// (VAE decode -> the model's passes -> LANCZOS to the size -> VAE encode).
const std::vector<std::string>& hires_upscaler_names();
// The names as messages list them: "Latent", "Latent (antialiased)", ...
std::string hires_upscaler_name_list();
// The canonical name when `name` is one (case-insensitive), else "" (then it names a folder).
std::string hires_upscaler_name_of(const std::string& name);
// What images call an upscaler folder (A1111's "Hires upscaler"): the folder's name.
std::string upscaler_folder_name(const std::string& dir);

// A1111's infotext quote(): a value that contains ',', ':' or '"' in double quotes, '"' and '\\'
// escaped.
std::string quote_if_needed(const std::string& raw);

// Shortest decimal that reads back the same double: 7 -> "7", 7.5 -> "7.5".
std::string format_number(double v);

inline constexpr const char* kProgramName = "sdxl-batch";
inline constexpr const char* kProgramVersion = "0.1.0";

// What an image's PNG parameters name besides its settings: the model (and the
// A1111 short hashes of the files it was exported from, "" when not recorded),
// the applied LoRAs and the textual-inversion embeddings its prompts used.
struct ImageSources {
  std::string model_name;
  bool zero_terminal_snr = false;  // the model's betas are rescaled to zero terminal SNR ("Noise Schedule")
  std::string model_hash;  // "Model hash": first 10 hex digits of the checkpoint file's sha256
  std::string vae_name;    // "VAE": the VAE file's name (written with its hash)
  std::string vae_hash;    // "VAE hash": first 10 hex digits of the VAE file's sha256
  std::vector<std::pair<std::string, std::string>> lora_hashes;  // name, 12 hex digits ("Lora hashes")
  std::vector<std::pair<std::string, std::string>> ti_hashes;    // name, 12 hex digits ("TI hashes")
  // Per ControlNet of the task, in order: its name and A1111 short hash (8 hex digits, "" unknown).
  std::vector<std::pair<std::string, std::string>> controlnets;
  // The task's IP-Adapter: its name and short hash (8 hex digits, "" unknown), and
  // each reference image's file name and sha256 (first 10 hex digits, as A1111 shortens).
  std::string ip_adapter_name, ip_adapter_hash;
  std::vector<std::pair<std::string, std::string>> ip_images;
  // The final upscale's upscaler as images name it (its file's stem, or "Lanczos"; "" = none).
  std::string upscaler_name;
  // Per detailer unit of the task: the detector's name as images name it (its source file, e.g.
  // "face_yolov8n.pt"). Empty: the folder's name.
  std::vector<std::string> detailer_models;
  // The UNet's precision when not the model's dtype ("fp8": "UNet precision: fp8 e4m3").
  std::string unet_precision;
};

// A1111's format:
//   <prompt>
//   Negative prompt: <negative>          (omitted when empty)
//   Steps: 28, Sampler: Euler, Schedule type: Automatic, CFG scale: 7, Seed: 42,
//   Size: 1024x1024, Model hash: 0123456789, Model: <model name>, VAE hash: 0123456789, VAE: <file>,
//   Clip skip: 3, Lora hashes: "name: 0123456789ab", TI hashes: "name: 0123456789ab", Version: sdxl-batch 0.1.0
// "UNet precision: fp8 e4m3" comes before Version when the UNet ran in FP8 (--precision fp8);
// "Guidance rescale: <phi>" follows the CFG scale when it is not 0; the hashes
// only when known, "Clip skip" only when the task sets it;
// img2img adds "Denoising strength: S" before Clip skip and "Init image: <file
// name>" after it (an inpainting task then A1111's "Mask blur: N", and for
// "Only masked" "Inpaint area: Only masked, Masked area padding: P"); the hires fix adds A1111's "Denoising strength: D" (for
// text-to-image) and "Hires upscale: 2, Hires steps: N, Hires upscaler: U"
// (Size stays the first pass's, as in A1111). The prompt keeps its <lora:...>
// tags, as A1111 writes it. Each ControlNet adds, as A1111's ControlNet
// extension writes it (before Version): ControlNet N: "Module: none, Model:
// <name> [<hash>], Weight: W, Resize Mode: Just Resize, Guidance Start: S, Guidance End: E".
// An IP-Adapter adds (after the ControlNets): IP-Adapter: "Model: <name> [<hash>],
// Weight: <scale>, Images: <file> [<sha256 10>], <file2> [...]".
// A detailer adds ADetailer's fields per unit before Version ("ADetailer model", "ADetailer prompt" and
// "ADetailer negative prompt" when set, "ADetailer confidence", "ADetailer dilate erode", "ADetailer
// mask blur", "ADetailer denoising strength", "ADetailer inpaint only masked", "ADetailer inpaint
// padding", "ADetailer mask only top k largest" when set, "ADetailer use separate steps" and
// "ADetailer steps" when set), the 2nd unit's with " 2nd" and so on.
// Regions add, after the detailer's, Regional Prompter's "RP Active: True, RP Divide mode: Mask, RP Calc
// Mode: Attention, RP Base Ratios: B" and a "Region N" field each (batch/regions.h).
// A final upscale adds postprocess_upscale_fields after Version (as A1111's extras tab appends them).
std::string a1111_parameters(const GenerationParams& p, const ImageSources& sources);
// The same with only a model name and LoRA hashes.
std::string a1111_parameters(const GenerationParams& p, const std::string& model_name,
                             const std::vector<std::pair<std::string, std::string>>& lora_hashes = {});

// Seeds are drawn from a 63-bit range so seed + index never overflows.
std::int64_t random_seed();

}  // namespace sdxl
