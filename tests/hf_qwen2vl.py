"""The tiny random-weight Qwen2-VL of tests/mlx_qwen2vl.py in the Hugging Face format
(transformers' save_pretrained), built offline for the transformers engine's tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.mlx_qwen2vl import write_qwen2vl_files


def tiny_config(target: Path) -> Any:
    """The tiny Qwen2-VL's files written into `target`, and its transformers config."""
    from transformers import AutoConfig

    write_qwen2vl_files(target)
    config = AutoConfig.from_pretrained(target)
    # transformers' defaults are the real Qwen2-VL's ids, outside the tiny vocabulary.
    eos = json.loads((target / "generation_config.json").read_text())["eos_token_id"]
    config.text_config.bos_token_id = None
    config.text_config.eos_token_id = eos[0]
    return config


def build_hf_qwen2vl_model(target: Path, seed: int = 0) -> Path:
    """Write the tiny Qwen2-VL with seeded random weights (float32) into `target`."""
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    config = tiny_config(target)
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config).to(torch.float32).eval()
    model.save_pretrained(target)
    return target
