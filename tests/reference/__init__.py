"""What sdxl-batch is tested against: Python references built on diffusers /
transformers, and the writers of the golden files and fixtures made from them.

Importable with tests/ on the path (ctest sets PYTHONPATH=<repo>/tests):
    from reference import compare_images
    from reference.reference_sdxl import a1111_embeds
and each module with a command line runs as
    PYTHONPATH=tests python -m reference.<module> --help

References:
  reference_sdxl          diffusers' StableDiffusionXLPipeline under A1111's prompt rules (parity image + latents)
  prompt_reference        A1111's prompt parsing and 75-token chunking; writes the prompt goldens
  a1111_schedulers        A1111 sampler / schedule names -> diffusers schedulers
  lora_reference          LoRA files fused into a diffusers pipeline (diffusers' key mapping, peft's merge)
  diffusers_loop          the diffusers for-loop over a batch file (the baseline bench/gpu_runtime.sh loop times)
  regions_reference       regional prompts (attention couple) and masked IP-Adapter images in a diffusers processor
  compare_images          PSNR / max difference of two images (and latents)
  architecture            the SDXL configs scripts/export_sdxl.py exports (asked from it as a program)
Golden files and fixtures (written into the build tree by ctest's fixture_* tests):
  gen_tokenizer_goldens   transformers' CLIPTokenizer ids
  gen_schedule_goldens    diffusers' Euler schedule and every sampler's plan
  gen_conditioning_goldens  the text encoders' conditioning under A1111's rules
  make_test_loras         random LoRA files in every supported format (tiny or full-size SDXL)

Nothing under scripts/ (the product) imports from here.
"""
