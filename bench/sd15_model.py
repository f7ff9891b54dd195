"""A random-weight Stable Diffusion 1.5 pipeline at its real dimensions, built offline.

    python bench/sd15_model.py [--out DIR]

stable-diffusion.cpp fixes the dimensions of every SD 1.x part in its sources (a 320-channel
UNet of four levels, CLIP ViT-L/14's 768-wide 12-layer text encoder with its 49408-token
vocabulary, a 128-channel VAE; its tiny-UNet variants, BK-SDM and SDXS, only drop UNet blocks)
and tells the version from tensor names and shapes (the text encoder's width: 768 is SD 1.x,
1024 SD 2.x), so the tests' tiny pipeline (bench/image_model.py) does not load there. This one
does: the diffusers configs of SD 1.5 with random weights (about 1.07 B parameters, 4.3 GB in
float32), in the diffusers folder layout, which both engines read (stable-diffusion.cpp maps
the diffusers tensor names itself), so they run the very same weights. The tokenizer is the
tiny one of bench/image_model.py padded to CLIP's 77 tokens (stable-diffusion.cpp brings its
own CLIP vocabulary; every prompt costs both 77 positions). Built once into a cache outside
the repository (MLXCEL_BENCH_CACHE, else ~/.cache/mlxcel-bench).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from image_model import save_pipeline, write_tokenizer
from llama_server import CACHE_DIR

CONTEXT = 77
CLIP_VOCAB = 49408
LATENT_SIDE = 64


def build_sd15(folder: Path, seed: int = 0) -> Path:
    """Write the SD 1.5-shaped pipeline to `folder` (diffusers layout) once; return `folder`."""
    if (folder / "model_index.json").is_file():
        return folder
    import torch
    from diffusers import (
        AutoencoderKL,
        EulerDiscreteScheduler,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    write_tokenizer(folder / "tokenizer", CONTEXT)
    tokenizer = CLIPTokenizer.from_pretrained(folder / "tokenizer")
    torch.manual_seed(seed)
    # diffusers' UNet defaults are SD 1.x's but for the context width and the sample size.
    unet = UNet2DConditionModel(cross_attention_dim=768, sample_size=LATENT_SIDE)
    vae = AutoencoderKL(
        block_out_channels=(128, 256, 512, 512),
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=2,
        latent_channels=4,
        sample_size=LATENT_SIDE * 8,
    )
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            hidden_size=768,
            intermediate_size=3072,
            num_attention_heads=12,
            num_hidden_layers=12,
            projection_dim=768,
            vocab_size=CLIP_VOCAB,
            max_position_embeddings=CONTEXT,
        )
    )
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1
    )
    models = {"vae": vae, "text_encoder": text_encoder, "unet": unet}
    save_pipeline(folder, models, scheduler)
    _name_text_model(folder / "text_encoder" / "model.safetensors")
    return folder


def _name_text_model(path: Path) -> None:
    """Put back the `text_model.` level that transformers 5.6 dropped from CLIPTextModel's
    tensor names: stable-diffusion.cpp finds the text encoder (and so the SD version) by the
    names every published checkpoint has, and transformers still reads them."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    save_file(
        {
            f"text_model.{name}".replace("text_model.text_model.", "text_model."): t
            for name, t in tensors.items()
        },
        path,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=CACHE_DIR / "sd15-random")
    print(build_sd15(parser.parse_args().out))


if __name__ == "__main__":
    main()
