"""What an MLX model's config files say: its sampling defaults and its text config's values."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# generation_config.json's sampling keys under our names.
_HF_SAMPLING_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repeat_penalty",
}


def read_generation_config(path: Path) -> dict[str, float]:
    file = path / "generation_config.json"
    if not file.is_file():
        return {}
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        logger.warning("ignoring %s: %s", file, exc)
        return {}
    return {
        name: float(config[key])
        for key, name in _HF_SAMPLING_KEYS.items()
        if isinstance(config.get(key), (int, float))
    }


def config_value(config: Mapping[str, Any], key: str) -> Any:
    """A model config value, also looked up in `text_config` (multimodal checkpoints)."""
    return config.get(key) or config.get("text_config", {}).get(key)
