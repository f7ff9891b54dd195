"""Image-text embedding models (CLIP, SigLIP) on torch through transformers: texts and images
embedded into one space, from a Hugging Face folder or sentence-transformers' CLIP layout.

Texts go as transformers' processor makes them (CLIP padded to the longest in a batch with its
attention mask, SigLIP to its fixed length as it was trained); images are decoded here, in the
worker, and prepared by the folder's own image processor. A vector is the model's projected
feature (`get_text_features`, `get_image_features`), unnormalized: serving normalizes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mlxcel.backends.embeddings.layout import clip_folder
from mlxcel.backends.embeddings.torch_models import chunks, end_token, max_tokens, token_ids
from mlxcel.backends.embeddings.types import EncoderInfo, Unreadable, longest_piece
from mlxcel.media.images import EncodedImage
from mlxcel.media.policy import MediaError

logger = logging.getLogger(__name__)

ENGINE = "transformers"


def features_of(output: Any) -> Any:
    """The projected features: the tensor older transformers return, or the pooled output of
    the object newer ones do."""
    return output if hasattr(output, "shape") else output.pooler_output


def decoded(images: list[EncodedImage]) -> tuple[list[np.ndarray | Unreadable], dict[int, Any]]:
    """Each image's place in the answer (`Unreadable` where its pixels do not decode, an empty
    array to fill in where they do) and the Pillow images that decoded, by index."""
    out: list[np.ndarray | Unreadable] = []
    pictures: dict[int, Any] = {}
    for index, image in enumerate(images):
        try:
            pictures[index] = image.decoded().to_pil()
            out.append(np.empty(0, dtype=np.float32))
        except MediaError as exc:
            out.append(Unreadable(exc.message, exc.code))
    return out, pictures


def embed_decoded(
    images: list[EncodedImage], per_batch: int, run: Callable[[list[Any]], Sequence[np.ndarray]]
) -> list[np.ndarray | Unreadable]:
    """Each image's vector (or matrix): those that decode go to `run` as Pillow images,
    `per_batch` at a time, the others are `Unreadable`."""
    out, pictures = decoded(images)
    readable = list(pictures)
    for start in range(0, len(readable), max(1, per_batch)):
        part = readable[start : start + max(1, per_batch)]
        values = run([pictures[i] for i in part])
        for row, i in enumerate(part):
            out[i] = values[row]
    return out


class TorchImageTextEmbedder:
    """A CLIP or SigLIP folder on torch."""

    def __init__(self, path: Path, *, threads: int, batch_tokens: int) -> None:
        import torch
        from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

        torch.set_num_threads(threads)
        folder = clip_folder(path)
        if folder is None:
            raise ValueError(f"{path.name} is not a CLIP or SigLIP folder")
        self._model = AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
        self._tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        self._processor = AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
        self._budget = batch_tokens
        config = self._model.config
        text, vision = config.text_config, config.vision_config
        self._pad = int(self._tokenizer.pad_token_id or 0)
        self._mask = "attention_mask" in self._tokenizer.model_input_names
        length = max_tokens(self._tokenizer, text, None)
        # SigLIP was trained on texts padded to its length, and reads them so (its processor's
        # padding="max_length"); CLIP pads to the longest of a batch.
        self._pad_to = length if config.model_type == "siglip" else 0
        width = getattr(config, "projection_dim", None) or getattr(
            text, "projection_size", text.hidden_size
        )
        self.info = EncoderInfo(
            engine=ENGINE,
            max_tokens=length,
            longest_token=longest_piece(self._tokenizer.get_vocab()),
            vocab_size=len(self._tokenizer),
            dimensions=int(width),
            pooling="projection",
            end_token=end_token(self._tokenizer),
            modalities=("text", "image"),
            # CLIP's class token besides its patches; SigLIP pools without one.
            image_tokens=(vision.image_size // vision.patch_size) ** 2 + (0 if self._pad_to else 1),
        )

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids with the tokenizer's special tokens, uncut and unpadded."""
        return token_ids(self._tokenizer, texts)

    def text_inputs(self, rows: list[list[int]]) -> dict[str, Any]:
        """input_ids (and attention_mask where the tokenizer gives one), padded as the
        processor pads them."""
        import torch

        width = max(self._pad_to, *(len(r) for r in rows))
        ids = torch.full((len(rows), width), self._pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for n, row in enumerate(rows):
            ids[n, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[n, : len(row)] = 1
        return {"input_ids": ids, "attention_mask": mask} if self._mask else {"input_ids": ids}

    def text_features(self, inputs: dict[str, Any]) -> np.ndarray:
        """The projected text features of a padded batch."""
        return features_of(self._model.get_text_features(**inputs)).float().numpy()

    def image_features(self, pixels: np.ndarray) -> np.ndarray:
        """The projected image features of a batch of pixel values."""
        import torch

        output = self._model.get_image_features(pixel_values=torch.from_numpy(pixels))
        return features_of(output).float().numpy()

    def embed(self, batch: list[list[int]]) -> list[np.ndarray]:
        """Each text's vector, unnormalized."""
        import torch

        out: list[np.ndarray] = [np.empty(0, dtype=np.float32)] * len(batch)
        with torch.inference_mode():
            for run in chunks(batch, self._budget):
                values = self.text_features(self.text_inputs([batch[i] for i in run]))
                for row, i in enumerate(run):
                    out[i] = values[row]
        return out

    def embed_images(self, images: list[EncodedImage]) -> list[np.ndarray | Unreadable]:
        """Each image's vector, unnormalized; an image that does not decode is `Unreadable`,
        and the others are embedded all the same."""
        import torch

        def run(pictures: list[Any]) -> Sequence[np.ndarray]:
            pixels = self._processor(images=pictures, return_tensors="np")["pixel_values"]
            return list(self.image_features(np.asarray(pixels, dtype=np.float32)))

        with torch.inference_mode():
            return embed_decoded(images, self._budget // max(1, self.info.image_tokens), run)

    def close(self) -> None:
        """Drop the model."""
        del self._model
