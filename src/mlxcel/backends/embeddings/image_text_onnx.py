"""Image-text embedding models (CLIP, SigLIP) on ONNX Runtime: each tower (text, image) with
its projection exported once from the torch model and cached as the text encoders' exports are.
Measured at 2.3x torch's images/s on a Linux CPU at ViT-B/32's shape, even with it on a tiny
model, where decoding the images dominates (bench/embeddings.py --images); the vectors are
torch's to float rounding."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mlxcel.backends.embeddings.image_text import TorchImageTextEmbedder, features_of
from mlxcel.backends.embeddings.layout import clip_folder
from mlxcel.backends.embeddings.onnx_models import ENGINE, cached_export, session


def _towers(model: Any, names: list[str]) -> tuple[Any, Any]:
    """The text tower (named inputs) and the image tower (pixel values), each with its
    projection, as torch modules of positional tensors."""
    import torch

    class Text(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            inputs = dict(zip(names, tensors, strict=True))
            return features_of(self.inner.get_text_features(**inputs))

    class Image(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return features_of(self.inner.get_image_features(pixel_values=pixel_values))

    return Text().eval(), Image().eval()


class OnnxImageTextEmbedder(TorchImageTextEmbedder):
    """A CLIP or SigLIP folder whose two towers run in onnxruntime."""

    def __init__(self, path: Path, *, threads: int, batch_tokens: int) -> None:
        super().__init__(path, threads=threads, batch_tokens=batch_tokens)
        folder = clip_folder(path)
        assert folder is not None
        text_sample = self.text_inputs(self.tokenize(["a sentence to trace", "b"]))
        names = list(text_sample)
        vision = self._model.config.vision_config
        pixels = np.zeros((2, 3, vision.image_size, vision.image_size), dtype=np.float32)
        import torch

        image_sample = {"pixel_values": torch.from_numpy(pixels)}
        text, image = _towers(self._model, names)
        text_file = cached_export(folder, "text", text, text_sample)
        image_file = cached_export(
            folder, "image", image, image_sample, {"pixel_values": {0: "batch"}}
        )
        self._text = session(text_file, threads)
        self._image = session(image_file, threads)
        self._names = names
        del self._model
        self.info = replace(self.info, engine=ENGINE)

    def text_features(self, inputs: dict[str, Any]) -> np.ndarray:
        """The exported text tower's features."""
        feed = {name: inputs[name].numpy() for name in self._names}
        return np.asarray(self._text.run(None, feed)[0], dtype=np.float32)

    def image_features(self, pixels: np.ndarray) -> np.ndarray:
        """The exported image tower's features."""
        return np.asarray(self._image.run(None, {"pixel_values": pixels})[0], dtype=np.float32)

    def close(self) -> None:
        """Drop the sessions."""
        del self._text, self._image
