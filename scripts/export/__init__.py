"""The code of scripts/export_sdxl.py (the command users run): SDXL model folders, and the VAE,
ControlNet and IP-Adapter folders tasks name, each traced to TorchScript (with optional
AOTInductor and FP8 variants) and described by a model.json, written to a temporary folder and
published whole (docs/models-and-export.md).

Modules, top to bottom, one a line; each imports only modules listed below it, so the package has
no import circle (tests/lint/check_layers.py checks both, imports inside functions included: its
rules import-cycle and module-list). Nothing imports cli; no export kind imports another.
 the command
  cli                 the flags, their rules, the inputs checked before torch is imported, and the
                      dispatch to one export kind (cli.KINDS)
 the tiny sources
  tiny_adapters       --tiny-ip-adapter, --tiny-controlnet: a tiny random IP-Adapter or ControlNet drawn
                      (the test fixtures' and the example's), then exported by ip_adapter or controlnet
 the export kinds, one module each with export(a, job) -> exit code
  sdxl                --tiny, --tiny-aoti, --random-full, --from DIR|FILE: a model folder
  vae                 --vae-only: a VAE folder
  controlnet          --controlnet: a ControlNet folder
  ip_adapter          --ip-adapter with --image-encoder: an IP-Adapter folder
  upscaler            --upscaler FILE...: one upscaler folder per file, by spandrel (export_all(a))
  detector            --detector FILE.pt: an Ultralytics YOLO detector folder
 the model folder's steps
  sdxl_sources        random weights, diffusers folders, single files, tokenizers
  sdxl_checks         --check: the traced modules against eager
  fp8                 --fp8: calibrate, quantise, trace and package the FP8 UNet
  aoti                --aoti: AOTInductor packages
 the FP8 layers
  fp8_geglu           --fp8-geglu: the fused GEGLU feed-forward (a Triton op)
  fp8_conv            --fp8-conv: the FP8 3x3 convolution (a Triton op); load_quantized_state
  fp8_quant           the FP8 linear layer's contract, its calibration and quantisation
 building blocks
  sdxl_modules        the TorchScript wrappers, their layouts, example inputs
  checkpoint          single-file checkpoints and VAE files
  checkpoint_family   a single file's family from its header (torch-free)
  controlnet_family   a ControlNet source's layout from its headers (torch-free)
  ip_adapter_family   an IP-Adapter file's kind from its header (torch-free)
  architecture        SDXL's configs
  aoti_toolchain      the compiler AOTInductor links with
  clip_vocab          the CLIP vocabulary (also runs alone: scripts/fuzz.sh)
 helpers
  weights             finite weights, modules filled from state dicts
  common              the job, the log, tracing, checks against eager, hashes, publishing
  inputs              every input path and safetensors header checked before it is opened,
                      ExportError; the standard library only (cli runs it before importing torch)
A new export kind is a module beside controlnet.py with export(a, job), its flag in
cli.build_parser's source group and a row in cli.KINDS, and a line here.
"""
