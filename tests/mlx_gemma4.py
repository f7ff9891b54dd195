"""A tiny random-weight Gemma 4 in mlx-vlm's format, built offline for the tests: a model that
sees and hears (a SigLIP-style vision tower, a USM conformer audio tower), per-layer inputs,
sliding and full attention, and layers that share the KV of earlier ones, as the E2B/E4B
models have.

mlx-vlm's own Gemma4Processor reads the folder: the tokenizer names its media tokens
(`extra_special_tokens`), processor_config.json its image processor and audio feature
extractor (log-mel, 16 kHz; one audio token per 40 ms)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.mlx_model import (
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    KV_HEADS,
    MAX_POSITIONS,
    _tokenizer_config,
    _train_tokenizer,
    _write_json,
    added_token,
)
from tests.mlx_qwen2vl import save_weights

MEDIA_TOKENS = {
    "image_token": "<|image|>",
    "boi_token": "<|image>",
    "eoi_token": "<image|>",
    "audio_token": "<|audio|>",
    "boa_token": "<|audio>",
    "eoa_token": "<audio|>",
    "video_token": "<|video|>",
}
PATCH = 4
POOLING = 2
MAX_SOFT_TOKENS = 16
"""An image is at most this many tokens: (side / PATCH / POOLING) squared, within it."""
MS_PER_TOKEN = 40
AUDIO_SEQ_LENGTH = 750
"""A clip is one token a 40 ms, at most 750 (30 s)."""
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
SHARED_KV_LAYERS = 2
"""The last two layers attend over the KV of the first two (one of each kind)."""


def _config(vocab: int, ids: dict[str, int]) -> dict[str, Any]:
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "image_token_id": ids["image_token"],
        "audio_token_id": ids["audio_token"],
        "video_token_id": ids["video_token"],
        "boi_token_id": ids["boi_token"],
        "eoi_token_id": ids["eoi_token"],
        "boa_token_id": ids["boa_token"],
        "eoa_token_id": ids["eoa_token"],
        "pad_token_id": 0,
        "vision_soft_tokens_per_image": MAX_SOFT_TOKENS,
        "audio_ms_per_token": MS_PER_TOKEN,
        "tie_word_embeddings": True,
        "text_config": {
            "model_type": "gemma4_text",
            "hidden_size": HIDDEN,
            "intermediate_size": INTERMEDIATE,
            "num_hidden_layers": len(LAYER_TYPES),
            "layer_types": LAYER_TYPES,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS,
            "head_dim": HIDDEN // HEADS,
            "global_head_dim": HIDDEN // HEADS,
            "num_kv_shared_layers": SHARED_KV_LAYERS,
            "hidden_size_per_layer_input": 8,
            "vocab_size": vocab,
            "vocab_size_per_layer_input": vocab,
            "sliding_window": 512,
            "max_position_embeddings": MAX_POSITIONS,
            "use_double_wide_mlp": False,
            "tie_word_embeddings": True,
        },
        "vision_config": {
            "model_type": "gemma4_vision",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "global_head_dim": 16,
            "patch_size": PATCH,
            "pooling_kernel_size": POOLING,
            "position_embedding_size": 64,
            "default_output_length": MAX_SOFT_TOKENS,
        },
        "audio_config": {
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "subsampling_conv_channels": [8, 4],
            "output_proj_dims": 32,
        },
    }


def write_gemma4_files(target: Path) -> dict[str, Any]:
    """Write the tiny Gemma 4's tokenizer, processor config and config into `target` (every
    file but the weights); its config."""
    target.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer()
    tokenizer.add_special_tokens(list(MEDIA_TOKENS.values()))
    tokenizer.save(str(target / "tokenizer.json"))
    ids = {name: tokenizer.token_to_id(token) for name, token in MEDIA_TOKENS.items()}
    tokenizer_config = _tokenizer_config(tokenizer)
    for name, token_id in ids.items():
        tokenizer_config["added_tokens_decoder"][str(token_id)] = added_token(MEDIA_TOKENS[name])
    tokenizer_config["extra_special_tokens"] = MEDIA_TOKENS
    _write_json(target / "tokenizer_config.json", tokenizer_config)
    config = _config(tokenizer.get_vocab_size(), ids)
    _write_json(target / "config.json", config)
    _write_json(
        target / "processor_config.json",
        {
            "processor_class": "Gemma4Processor",
            "audio_seq_length": AUDIO_SEQ_LENGTH,
            "audio_ms_per_token": MS_PER_TOKEN,
            "image_processor": {
                "patch_size": PATCH,
                "max_soft_tokens": MAX_SOFT_TOKENS,
                "pooling_kernel_size": POOLING,
            },
            "feature_extractor": {"feature_size": 128, "sampling_rate": 16_000},
        },
    )
    eos = [tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")]
    _write_json(target / "generation_config.json", {"eos_token_id": eos})
    return config


def build_gemma4_model(target: Path, seed: int = 0) -> Path:
    """Write the tiny Gemma 4 (vision and audio towers, their embedders, the text model)."""
    import mlx.core as mx
    from mlx_vlm.models.gemma4 import Model, ModelConfig
    from mlx_vlm.models.gemma4.config import AudioConfig, TextConfig, VisionConfig

    config = write_gemma4_files(target)
    mx.random.seed(seed)
    model_config = ModelConfig.from_dict(dict(config))
    model_config.text_config = TextConfig.from_dict(config["text_config"])
    model_config.vision_config = VisionConfig.from_dict(config["vision_config"])
    model_config.audio_config = AudioConfig.from_dict(config["audio_config"])
    return save_weights(target, Model(model_config))
