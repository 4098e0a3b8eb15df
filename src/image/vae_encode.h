// VAE encoding of an 8-bit RGB image into the UNet's latent space, as
// StableDiffusionXLImg2ImgPipeline prepares init latents: pixels / 255 * 2 - 1,
// encode, scaling_factor * latent, in the model's dtype. It takes the mean of
// the latent distribution (diffusers samples it with the generator; the mean
// keeps an image independent of that draw). Throws TaskError on NaN.
#pragma once

#include <torch/types.h>

#include <cstdint>

#include "model/sdxl_model.h"

namespace sdxl {

// rgb: height * width * 3 bytes, row-major. Returns [1, 4, height/8, width/8].
torch::Tensor vae_encode_rgb8(SdxlModel& model, const std::uint8_t* rgb, int width, int height);

// The masked image of a 9-channel inpainting UNet (StableDiffusionXLInpaintPipeline:
// init_image * (mask < 0.5), encoded): `rgb` in [-1, 1] with every pixel whose
// `repaint` byte is non-zero set to 0 (mid grey), encoded as vae_encode_rgb8 does.
torch::Tensor vae_encode_masked_rgb8(SdxlModel& model, const std::uint8_t* rgb, const std::uint8_t* repaint,
                                     int width, int height);

}  // namespace sdxl
