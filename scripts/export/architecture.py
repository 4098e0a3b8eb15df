"""The SDXL architecture the export builds: SDXL base 1.0's configs written out (nothing is
downloaded), the tiny model's (the same structure, small widths), the tiny-aoti model's (the tiny
model with a shallower UNet) and a --config folder's."""
from __future__ import annotations

import json
from pathlib import Path

SDXL_SCHEDULER = dict(
    num_train_timesteps=1000,
    beta_start=0.00085,
    beta_end=0.012,
    beta_schedule="scaled_linear",
    trained_betas=None,
    prediction_type="epsilon",
    interpolation_type="linear",
    use_karras_sigmas=False,
    timestep_spacing="leading",
    steps_offset=1,
)

# --- SDXL base 1.0 configs, written out (nothing is downloaded) --------------
FULL_UNET = dict(
    sample_size=128,
    in_channels=4,
    out_channels=4,
    center_input_sample=False,
    flip_sin_to_cos=True,
    freq_shift=0,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    mid_block_type="UNetMidBlock2DCrossAttn",
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    only_cross_attention=False,
    block_out_channels=(320, 640, 1280),
    layers_per_block=2,
    downsample_padding=1,
    mid_block_scale_factor=1,
    act_fn="silu",
    norm_num_groups=32,
    norm_eps=1e-5,
    cross_attention_dim=2048,
    transformer_layers_per_block=(1, 2, 10),
    attention_head_dim=(5, 10, 20),
    dual_cross_attention=False,
    use_linear_projection=True,
    upcast_attention=False,
    resnet_time_scale_shift="default",
    addition_embed_type="text_time",
    addition_time_embed_dim=256,
    projection_class_embeddings_input_dim=2816,
    time_embedding_type="positional",
    conv_in_kernel=3,
    conv_out_kernel=3,
)
FULL_VAE = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    block_out_channels=(128, 256, 512, 512),
    layers_per_block=2,
    act_fn="silu",
    latent_channels=4,
    norm_num_groups=32,
    sample_size=1024,
    scaling_factor=0.13025,
    force_upcast=True,
)
FULL_TE1 = dict(  # CLIP ViT-L/14 text tower
    vocab_size=49408, hidden_size=768, intermediate_size=3072, projection_dim=768,
    num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77,
    hidden_act="quick_gelu", layer_norm_eps=1e-5,
    bos_token_id=49406, eos_token_id=49407, pad_token_id=49407,
)
FULL_TE2 = dict(  # OpenCLIP ViT-bigG/14 text tower
    vocab_size=49408, hidden_size=1280, intermediate_size=5120, projection_dim=1280,
    num_hidden_layers=32, num_attention_heads=20, max_position_embeddings=77,
    hidden_act="gelu", layer_norm_eps=1e-5,
    bos_token_id=49406, eos_token_id=49407, pad_token_id=0,  # pad "!" = id 0
)

# --- tiny: same structure, small widths ---------------------------------------
TINY_TE1 = dict(FULL_TE1, hidden_size=32, intermediate_size=64, projection_dim=32,
                num_hidden_layers=3, num_attention_heads=4)
TINY_TE2 = dict(FULL_TE2, hidden_size=32, intermediate_size=64, projection_dim=32,
                num_hidden_layers=3, num_attention_heads=4)
TINY_TIME_DIM = 8
TINY_UNET = dict(
    FULL_UNET,
    sample_size=32,
    block_out_channels=(32, 64, 64),
    layers_per_block=2,
    norm_num_groups=16,
    transformer_layers_per_block=(1, 1, 2),
    attention_head_dim=(2, 4, 4),
    cross_attention_dim=TINY_TE1["hidden_size"] + TINY_TE2["hidden_size"],
    addition_time_embed_dim=TINY_TIME_DIM,
    projection_class_embeddings_input_dim=6 * TINY_TIME_DIM + TINY_TE2["projection_dim"],
)
TINY_VAE = dict(FULL_VAE, block_out_channels=(8, 16, 16, 16), layers_per_block=1,
                norm_num_groups=4, sample_size=256)
# tiny-aoti: the tiny model with one resnet and one transformer layer per UNet block (SDXL's three
# levels, the first without attention, the mid block, the skip connections: the same structure, about
# half the ops). AOTInductor's CPU compile time grows with the op count (Inductor's lowering and C++
# code generation, not the widths): the AOTI test's package (tests/e2e/test_aoti.py) compiles from it.
# The text encoders and the VAE are the tiny model's.
TINY_AOTI_UNET = dict(TINY_UNET, layers_per_block=1, transformer_layers_per_block=(1, 1, 1))

# The architectures --tiny, --tiny-aoti and --random-full build (--print-config ARCH prints them);
# the two tiny ones share the tiny model's limits, defaults, dtype and threads.
TINY_KINDS = ("tiny", "tiny-aoti")
ARCHITECTURES = {
    "tiny": (TINY_TE1, TINY_TE2, TINY_UNET, TINY_VAE),
    "tiny-aoti": (TINY_TE1, TINY_TE2, TINY_AOTI_UNET, TINY_VAE),
    "full": (FULL_TE1, FULL_TE2, FULL_UNET, FULL_VAE),
}


def architecture(arch: str) -> dict:
    """The configs --tiny ("tiny"), --tiny-aoti ("tiny-aoti") or --random-full ("full") builds, by component."""
    te1, te2, unet, vae = ARCHITECTURES[arch]
    return {"scheduler": SDXL_SCHEDULER, "text_encoder": te1, "text_encoder_2": te2, "unet": unet, "vae": vae}


def configs_of(config_dir: Path | None) -> dict:
    """The architecture of a single-file checkpoint: SDXL base's, or config_dir's (a diffusers
    folder; only its config files are read)."""
    if config_dir is None:
        return architecture("full")
    out = {}
    for key, rel in (("unet", "unet/config.json"), ("vae", "vae/config.json"),
                     ("text_encoder", "text_encoder/config.json"), ("text_encoder_2", "text_encoder_2/config.json"),
                     ("scheduler", "scheduler/scheduler_config.json")):
        f = config_dir / rel
        if not f.is_file():
            raise SystemExit(f"--config {config_dir}: {rel} is missing (a diffusers-layout folder is needed)")
        out[key] = json.loads(f.read_text())
    return out

