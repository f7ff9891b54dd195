"""A tiny random-weight Qwen2-VL (M-RoPE) in mlx-vlm's format, built offline for the tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.mlx_model import (
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    KV_HEADS,
    LAYERS,
    MAX_POSITIONS,
    _tokenizer_config,
    _train_tokenizer,
    _write_json,
    added_token,
)

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
PATCH = 8
MERGE = 2
"""The vision tower's patch side and its spatial merge (MERGE x MERGE patches a token)."""
MIN_PIXELS = (PATCH * MERGE) ** 2
MAX_PIXELS = 64 * 64


def grid(width: int, height: int) -> tuple[int, int]:
    """The merged grid (rows, columns) Qwen2-VL's processor gives an image of this size:
    each side rounded to a multiple of PATCH * MERGE (within MAX_PIXELS)."""
    factor = PATCH * MERGE
    rows, columns = (
        max(factor, round(height / factor) * factor),
        max(factor, round(width / factor) * factor),
    )
    assert rows * columns <= MAX_PIXELS
    return rows // factor, columns // factor


def _config(vocab: int, ids: dict[str, int]) -> dict[str, Any]:
    return {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        # Half of each head's rotary dims split over (temporal, row, column).
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        "max_position_embeddings": MAX_POSITIONS,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "vision_config": {
            "model_type": "qwen2_vl",
            "depth": 1,
            "embed_dim": 32,
            "hidden_size": HIDDEN,
            "num_heads": 2,
            "mlp_ratio": 2,
            "in_channels": 3,
            "patch_size": PATCH,
            "spatial_patch_size": PATCH,
            "spatial_merge_size": MERGE,
            "temporal_patch_size": 2,
        },
    }


def write_folder(target: Path, make_config: Any, patch: int) -> dict[str, Any]:
    """Write a tiny Qwen-VL folder: the tiny tokenizer with the vision tokens, the config
    `make_config(vocab, ids)` makes, the image processor's config (`patch`-pixel patches);
    return the config. The weights are the caller's (`save_weights`)."""
    target.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer()
    tokenizer.add_special_tokens(VISION_TOKENS)
    tokenizer.save(str(target / "tokenizer.json"))
    ids = {token: tokenizer.token_to_id(token) for token in VISION_TOKENS}
    tokenizer_config = _tokenizer_config(tokenizer)
    for token, token_id in ids.items():
        tokenizer_config["added_tokens_decoder"][str(token_id)] = added_token(token)
    _write_json(target / "tokenizer_config.json", tokenizer_config)
    config: dict[str, Any] = make_config(tokenizer.get_vocab_size(), ids)
    _write_json(target / "config.json", config)
    _write_json(
        target / "preprocessor_config.json",
        {
            "image_processor_type": "Qwen2VLImageProcessor",
            "min_pixels": MIN_PIXELS,
            "max_pixels": MAX_PIXELS,
            "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
            "patch_size": patch,
            "merge_size": MERGE,
            "temporal_patch_size": 2,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
        },
    )
    eos = [tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")]
    _write_json(target / "generation_config.json", {"eos_token_id": eos})
    return config


def save_weights(target: Path, model: Any) -> Path:
    """The model's random weights as model.safetensors in `target`, in mlx-vlm's format."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(target / "model.safetensors"), weights, {"format": "mlx"})
    return target


def write_qwen2vl_files(target: Path) -> dict[str, Any]:
    """Write the tiny Qwen2-VL's tokenizer, processor, config and generation config into
    `target` (every file but the weights); its config."""
    return write_folder(target, _config, PATCH)


def build_qwen2vl_model(target: Path, seed: int = 0) -> Path:
    """Write the tiny Qwen2-VL (vision tower, merger, the tiny Qwen2 text model) into `target`."""
    import mlx.core as mx
    from mlx_vlm.models.qwen2_vl import Model, ModelConfig, TextConfig, VisionConfig

    config = write_qwen2vl_files(target)
    mx.random.seed(seed)
    model_config = ModelConfig.from_dict(dict(config))
    model_config.text_config = TextConfig.from_dict(model_config.text_config)
    model_config.vision_config = VisionConfig.from_dict(config["vision_config"])
    return save_weights(target, Model(model_config))
