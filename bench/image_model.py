"""A tiny random-weight Stable Diffusion pipeline in the diffusers folder layout, built offline.

A small UNet, VAE and CLIP text encoder with a CLIP tokenizer of a few hundred tokens, written
with `save_pretrained` so the server loads it through diffusers' real `from_pretrained`. It
draws noise, quickly: a 64x64 image in a few steps takes well under a second on one core.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The words the tokenizer knows whole; any other text falls back to single characters.
VOCABULARY = """
a an the of in on with and cat dog bird red green blue small large house tree river city
sky sun moon night day photo painting drawing portrait landscape bright dark
"""

# The VAE halves the image once (64x64 pixels -> 32x32 latents), the UNet halves it once more.
SAMPLE_SIZE = 32
CROSS_DIM = 32


def write_tokenizer(folder: Path, max_length: int = 16) -> None:
    """A CLIP BPE tokenizer whose vocabulary is every byte-level character and a few words,
    padding prompts to `max_length` tokens."""
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = list(bytes_to_unicode().values())
    vocab = [*chars, *(c + "</w>" for c in chars)]
    merges: list[tuple[str, str]] = []
    for word in VOCABULARY.split():
        pieces = [*word[:-1], word[-1] + "</w>"]
        while len(pieces) > 1:
            merges.append((pieces[0], pieces[1]))
            pieces = [pieces[0] + pieces[1], *pieces[2:]]
            vocab.append(pieces[0])
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    ids = {token: i for i, token in enumerate(dict.fromkeys(vocab))}
    tokenizer = CLIPTokenizer(vocab=ids, merges=list(dict.fromkeys(merges)))
    tokenizer.model_max_length = max_length
    tokenizer.save_pretrained(folder)


def build_pipeline(folder: Path, seed: int = 0) -> Path:
    """Write a tiny text-to-image pipeline to `folder` (diffusers layout); return `folder`."""
    import torch
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    write_tokenizer(folder / "tokenizer")
    tokenizer = CLIPTokenizer.from_pretrained(folder / "tokenizer")
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        block_out_channels=(8, 16),
        layers_per_block=1,
        sample_size=SAMPLE_SIZE,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=CROSS_DIM,
        attention_head_dim=4,
        norm_num_groups=4,
    )
    vae = AutoencoderKL(
        block_out_channels=(8, 16),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=4,
        norm_num_groups=4,
        sample_size=SAMPLE_SIZE * 2,
    )
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            hidden_size=CROSS_DIM,
            intermediate_size=37,
            num_attention_heads=4,
            num_hidden_layers=2,
            vocab_size=len(tokenizer),
            max_position_embeddings=tokenizer.model_max_length,
        )
    )
    scheduler = DDIMScheduler(clip_sample=False, set_alpha_to_one=False, steps_offset=1)
    return save_pipeline(
        folder, {"vae": vae, "text_encoder": text_encoder, "unet": unet}, scheduler
    )


def save_pipeline(folder: Path, models: dict[str, Any], scheduler: Any) -> Path:
    """Write a text-to-image pipeline of `models` (its unet, vae and text_encoder), the
    scheduler and `folder`'s tokenizer to `folder`, weights as safetensors; return `folder`."""
    from diffusers import StableDiffusionPipeline
    from transformers import CLIPTokenizer

    pipeline = StableDiffusionPipeline(
        **models,
        tokenizer=CLIPTokenizer.from_pretrained(folder / "tokenizer"),
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.save_pretrained(folder, safe_serialization=True)
    return folder
