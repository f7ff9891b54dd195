"""A Qwen2-VL-family folder on transformers (torch, CPU): its image processor, its vision
tower and its language model, called as the generator needs them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from PIL.Image import Image as PILImage
from transformers import AutoImageProcessor, DynamicCache
from transformers.utils import logging as hf_logging

# The folders' model types this backend serves, and their transformers classes. Both take an
# image as a grid of merged patches placed with M-RoPE positions.
FAMILIES = {
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
}


def model_type(path: Path) -> str | None:
    """The `model_type` a model folder's config.json names, if it has one."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    kind = config.get("model_type") if isinstance(config, dict) else None
    return kind if isinstance(kind, str) else None


class QwenVisionModel:
    """The model in float32 (torch's fastest CPU kernels), with no gradients anywhere."""

    def __init__(self, path: Path, threads: int) -> None:
        kind = model_type(path)
        if kind not in FAMILIES:
            raise ValueError(
                f"{path}: the transformers backend serves {', '.join(FAMILIES)} folders, "
                f"not {kind or 'one without a model_type'}"
            )
        torch.set_num_threads(threads)
        hf_logging.disable_progress_bar()
        model_class = getattr(transformers, FAMILIES[kind])
        self._model = model_class.from_pretrained(path, dtype=torch.float32).eval()
        # The PIL image processor: the default one needs torchvision.
        self._processor = AutoImageProcessor.from_pretrained(path)
        config = self._model.config
        self.config: dict[str, Any] = config.to_dict()
        self.merge = int(self._processor.merge_size)
        self.image_token = int(config.image_token_id)
        self.vision_start = int(config.vision_start_token_id)
        self.vision_end = int(config.vision_end_token_id)
        self._text_config = config.get_text_config()
        self._embed = self._model.get_input_embeddings()

    def pixels(self, image: PILImage) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """An image's patches as the vision tower takes them, and its grid (t, h, w patches)."""
        out = self._processor(images=[image], return_tensors="pt")
        t, h, w = (int(n) for n in out["image_grid_thw"][0])
        return out["pixel_values"], (t, h, w)

    @torch.inference_mode()
    def image_rows(self, pixels: torch.Tensor, grid: tuple[int, int, int]) -> np.ndarray:
        """The vision tower's embedding rows (float32, one a merged patch) of one image."""
        features = self._model.model.get_image_features(pixels, torch.tensor([grid]))
        rows: np.ndarray = features.pooler_output[0].float().numpy()
        return rows

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self._text_config)

    @torch.inference_mode()
    def forward(
        self,
        cache: DynamicCache,
        tokens: Sequence[int],
        media: Sequence[tuple[int, np.ndarray]],
        positions: np.ndarray,
        *,
        logits: bool,
    ) -> np.ndarray | None:
        """Evaluate `tokens` into `cache` at `positions` ([3, 1, n]: M-RoPE's sections), each image
        (offset, rows) from its rows; the last token's logits (float32) when asked for."""
        # An image's positions hold placeholder ids (negative): embedded as token 0, replaced.
        ids = torch.tensor([[max(token, 0) for token in tokens]])
        embeds = self._embed(ids)
        for offset, rows in media:
            embeds[0, offset : offset + len(rows)] = torch.from_numpy(rows)
        out = self._model.model.language_model(
            inputs_embeds=embeds,
            position_ids=torch.from_numpy(positions).long(),
            cache=cache,
            use_cache=True,
        )
        if not logits:
            return None
        last: np.ndarray = self._model.lm_head(out.last_hidden_state[0, -1]).float().numpy()
        return last
