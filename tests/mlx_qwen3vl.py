"""A tiny random-weight Qwen3-VL in mlx-vlm's format, built offline for the tests: M-RoPE with
interleaved sections, and deepstack (features of two vision blocks added into the first two
decoder layers' hidden states at the image's tokens)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.mlx_model import HIDDEN, _model_config
from tests.mlx_qwen2vl import MERGE, PATCH, save_weights, write_folder

DEEPSTACK_BLOCKS = [0, 1]
"""The vision blocks whose merged features join decoder layers 0 and 1."""


def _config(vocab: int, ids: dict[str, int]) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": False,
        "text_config": {
            **_model_config("qwen3", vocab),
            "model_type": "qwen3_vl_text",
            # Half of each head's rotary dims, interleaved over (temporal, row, column).
            "rope_scaling": {
                "rope_type": "default",
                "mrope_section": [2, 3, 3],
                "mrope_interleaved": True,
            },
        },
        "vision_config": {
            "model_type": "qwen3_vl",
            "depth": len(DEEPSTACK_BLOCKS),
            "hidden_size": 32,
            "intermediate_size": 64,
            "out_hidden_size": HIDDEN,
            "num_heads": 2,
            "in_channels": 3,
            "patch_size": PATCH,
            "spatial_merge_size": MERGE,
            "temporal_patch_size": 2,
            "num_position_embeddings": 16,
            "deepstack_visual_indexes": DEEPSTACK_BLOCKS,
        },
    }


def build_qwen3vl_model(target: Path, seed: int = 0) -> Path:
    """Write the tiny Qwen3-VL (vision tower with its deepstack mergers, a 2-layer text model)
    into `target`."""
    import mlx.core as mx
    from mlx_vlm.models.qwen3_vl import Model, ModelConfig

    config = write_folder(target, _config, PATCH)
    mx.random.seed(seed)
    return save_weights(target, Model(ModelConfig.from_dict(dict(config))))
