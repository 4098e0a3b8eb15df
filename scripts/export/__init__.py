"""The code of scripts/export_sdxl.py (the command users run): SDXL model folders, and the VAE,
ControlNet and IP-Adapter folders tasks name, each traced to TorchScript (with optional
AOTInductor and FP8 variants) and described by a model.json, written to a temporary folder and
published whole (docs/models-and-export.md).

Modules, top to bottom; each imports only modules below it (nothing imports cli, and no export
kind imports another kind):
  cli               the flags, their rules, and the dispatch to one export kind (cli.KINDS)
  export kinds      one module each, with export(a, job) -> exit code:
    sdxl              --tiny, --tiny-aoti, --random-full, --from DIR|FILE: a model folder
    vae               --vae-only: a VAE folder
    controlnet        --controlnet: a ControlNet folder
    ip_adapter        --ip-adapter with --image-encoder: an IP-Adapter folder
  the model's steps sdxl_sources (random weights, diffusers folders, single files, tokenizers),
                    sdxl_checks (--check), fp8 (--fp8), aoti (--aoti: AOTInductor packages)
  building blocks   sdxl_modules (the TorchScript wrappers, their layouts, example inputs),
                    checkpoint (single-file checkpoints and VAE files), architecture (SDXL's configs),
                    fp8_quant (the FP8 layer contract), aoti_toolchain, clip_vocab
  helpers           weights (finite weights, filling modules from state dicts), common (the job,
                    the log, tracing, checks against eager, hashes, publishing), inputs (every
                    input path and safetensors header checked before it is opened, ExportError;
                    standard library only: cli checks the inputs before torch is imported)
A new export kind (an upscaler, a detector) is a module beside controlnet.py with export(a, job),
its flag in cli.build_parser's source group and a row in cli.KINDS.
"""
