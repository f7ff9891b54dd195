"""Late-interaction document-image retrievers (ColQwen2, ColPali) on torch through transformers:
a page image is a matrix of its visual prompt's token vectors, a text a matrix of its query's
(the processor's query prefix and augmentation tokens in), both in the model's one space, so
a query scores a page by MaxSim.

Texts are read as the processor's `process_queries` reads them and images as its
`process_images` does; each row is the model's own (projected, normalized) vector."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mlxcel.backends.embeddings.image_text import embed_decoded
from mlxcel.backends.embeddings.layout import read_json
from mlxcel.backends.embeddings.torch_models import chunks, max_tokens
from mlxcel.backends.embeddings.types import EncoderInfo, Unreadable, longest_piece
from mlxcel.media.images import EncodedImage

ENGINE = "transformers"
# An image's rows at the most, for the shared batch's budget, when the processor does not say.
_IMAGE_TOKENS = 1024


def _classes(model_type: str) -> tuple[Any, Any]:
    from transformers import (
        ColPaliForRetrieval,
        ColPaliProcessor,
        ColQwen2ForRetrieval,
        ColQwen2Processor,
    )

    if model_type == "colpali":
        return ColPaliForRetrieval, ColPaliProcessor
    return ColQwen2ForRetrieval, ColQwen2Processor


def _image_tokens(images: Any) -> int:
    """The most tokens one image becomes: Qwen2-VL's pixel bound over its merged patches."""
    most = getattr(images, "max_pixels", None) or (getattr(images, "size", None) or {}).get(
        "longest_edge"
    )
    patch = getattr(images, "patch_size", None)
    merge = getattr(images, "merge_size", 1) or 1
    if isinstance(most, int) and isinstance(patch, int) and patch:
        return max(1, most // (patch * patch * merge * merge))
    return _IMAGE_TOKENS


class ColVisionEmbedder:
    """A ColQwen2 or ColPali folder on torch: a matrix per text or image."""

    def __init__(self, path: Path, *, threads: int, batch_tokens: int) -> None:
        import torch

        torch.set_num_threads(threads)
        model_class, processor_class = _classes(str(read_json(path / "config.json")["model_type"]))
        self._model = model_class.from_pretrained(str(path), local_files_only=True).eval()
        self._processor = processor_class.from_pretrained(str(path), local_files_only=True)
        tokenizer = self._processor.tokenizer
        self._pad = int(tokenizer.pad_token_id or 0)
        self._budget = batch_tokens
        config = self._model.config
        text = getattr(config, "vlm_config", config)
        text = getattr(text, "text_config", text)
        length = max_tokens(tokenizer, text, None)
        self.info = EncoderInfo(
            engine=ENGINE,
            max_tokens=length,
            longest_token=longest_piece(tokenizer.get_vocab()),
            vocab_size=len(tokenizer),
            dimensions=int(config.embedding_dim),
            pooling="none",
            modalities=("text", "image"),
            image_tokens=_image_tokens(self._processor.image_processor),
            query_tokens=length,
        )

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text as the model reads a query (its prefix and augmentation tokens in)."""
        batch = self._processor.process_queries(text=texts)
        rows = zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist(), strict=True)
        return [[int(t) for t, on in zip(ids, mask, strict=True) if on] for ids, mask in rows]

    def tokenize_queries(self, texts: list[str]) -> list[list[int]]:
        """The same: a text is a query to these models."""
        return self.tokenize(texts)

    def _rows(self, inputs: dict[str, Any]) -> list[np.ndarray]:
        """Each input's rows, those its attention mask keeps."""
        embeddings = self._model(**inputs).embeddings.float().numpy()
        masks = inputs["attention_mask"].numpy().astype(bool)
        return [values[mask] for values, mask in zip(embeddings, masks, strict=True)]

    def embed(self, batch: list[list[int]]) -> list[np.ndarray]:
        """Each text's matrix."""
        import torch

        out: list[np.ndarray] = [np.empty((0, self.info.dimensions), np.float32)] * len(batch)
        with torch.inference_mode():
            for run in chunks(batch, self._budget):
                width = max(len(batch[i]) for i in run)
                ids = torch.full((len(run), width), self._pad, dtype=torch.long)
                mask = torch.zeros((len(run), width), dtype=torch.long)
                for n, i in enumerate(run):
                    ids[n, : len(batch[i])] = torch.tensor(batch[i], dtype=torch.long)
                    mask[n, : len(batch[i])] = 1
                rows = self._rows({"input_ids": ids, "attention_mask": mask})
                for n, i in enumerate(run):
                    out[i] = rows[n]
        return out

    def embed_images(self, images: list[EncodedImage]) -> list[np.ndarray | Unreadable]:
        """Each image's matrix; an image that does not decode is `Unreadable`."""
        import torch

        def run(pictures: list[Any]) -> list[np.ndarray]:
            return self._rows(dict(self._processor.process_images(images=pictures)))

        with torch.inference_mode():
            return embed_decoded(images, self._budget // max(1, self.info.image_tokens), run)

    def close(self) -> None:
        """Drop the model."""
        del self._model
