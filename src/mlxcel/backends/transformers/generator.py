"""A Hugging Face vision-language folder (the Qwen2-VL family) on transformers: torch runs
the vision tower and the language model, one KV cache (DynamicCache) per slot; the slots,
the vocabulary and the sampler chain are the MLX generator's, so a request samples as it
would on an MLX model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np
from transformers import DynamicCache

from mlxcel.backends.mlx.config import read_generation_config
from mlxcel.backends.mlx.generator import MlxGenerator, MlxOptions, Slot
from mlxcel.backends.mlx.mrope import chunk_positions, grid_positions
from mlxcel.backends.mlx.sampling import sample_rows
from mlxcel.backends.transformers.model import QwenVisionModel
from mlxcel.engine.media import ImageRows
from mlxcel.engine.types import EngineError, Feed, MediaSpan, Sample
from mlxcel.media.audio import Media
from mlxcel.media.images import MEDIA_MARKER, Image


@dataclass(frozen=True)
class TransformersOptions:
    """How to serve a folder on transformers."""

    ctx_size: int
    parallel: int
    batch_size: int
    threads: int


class TransformersVisionGenerator(MlxGenerator):
    """TextGenerator (and TakesMedia) over transformers, one sequence at a time: each feed of
    a step is a forward pass of its own (`batched` is False, as /props says).

    An image is laid out by the model's image processor, embedded by its vision tower (the
    rows kept for the next prompt with it) and evaluated from those rows at its M-RoPE grid
    positions, the slot's jumps mapping token indices to positions after it. Every torch and
    MLX call runs on the generator's one worker thread. No host-memory prompt cache.
    """

    scores_prompts = False  # its model and caches are torch's, not mlx-lm's

    def __init__(self, path: Path, options: TransformersOptions) -> None:
        self._threads = options.threads
        self._image_rows = ImageRows()
        self._caches: dict[int, DynamicCache] = {}
        super().__init__(path, MlxOptions(options.ctx_size, options.parallel, options.batch_size))

    def _load(self, path: Path, options: MlxOptions) -> None:
        self._model = self._call(QwenVisionModel, path, self._threads)
        self._read_vocabulary(path, options, self._model.config)
        self._generation_config = read_generation_config(path)
        self._can_save_state = self._shares_prefixes = False

    @property
    def batched(self) -> bool:
        return False

    @property
    def input_modalities(self) -> tuple[str, ...]:
        return ("text", "image")

    @property
    def media_marker(self) -> str:
        return MEDIA_MARKER

    @property
    def audio_rate(self) -> int | None:
        return None

    def tokenize_with_media(
        self, text: str, media: Sequence[Media]
    ) -> tuple[list[int], tuple[MediaSpan, ...]]:
        """Each marker becomes the vision start token, a placeholder for each merged patch of
        its image's grid, and the vision end token (Qwen2-VL's processor's expansion of its
        image token); the text between the markers is tokenized piece by piece."""
        images = [medium for medium in media if isinstance(medium, Image)]
        if len(images) != len(media):
            raise EngineError("model does not support audio input", "invalid_request")
        pieces = text.split(MEDIA_MARKER)
        if len(pieces) != len(images) + 1:
            raise EngineError(
                f"the prompt has {len(pieces) - 1} image markers for {len(images)} images",
                "invalid_request",
            )
        tokens = self.tokenize(pieces[0], add_special=True, parse_special=True)
        spans = []
        for image, piece in zip(images, pieces[1:], strict=True):
            rows, grid = self._call(self._embed, image)
            span = MediaSpan(len(tokens) + 1, rows, image.digest, grid_positions(*grid))
            tokens += [self._model.vision_start, *[span.placeholder] * len(rows)]
            tokens += [self._model.vision_end]
            tokens += self.tokenize(piece, add_special=False, parse_special=True)
            spans.append(span)
        return tokens, tuple(spans)

    def _embed(self, image: Image) -> tuple[np.ndarray, tuple[int, int, int]]:
        """An image's embedding rows (from the cache when it holds them) and its merged grid."""
        pixels, (t, h, w) = self._model.pixels(image.to_pil())
        key = f"{image.digest}:{t}x{h}x{w}"
        rows = self._image_rows.get(key)
        if rows is None:
            rows = self._model.image_rows(pixels, (t, h, w))
            self._image_rows.put(key, rows)
        return rows, (t, h // self._model.merge, w // self._model.merge)

    def _kept_prefix(self, slot: int, reuse: int) -> Slot:
        state = self._slots.get(slot)
        if state is None or reuse == 0:
            self._caches[slot] = self._model.new_cache()
            return Slot(None)
        if len(state.tokens) > reuse:
            # The scheduler never cuts inside an image.
            self._caches[slot].crop(reuse - len(state.tokens))
            del state.tokens[reuse:]
            state.jumps.keep(reuse)
        return state

    def _forget(self, slot: int) -> None:
        self._slots.pop(slot, None)
        self._caches.pop(slot, None)

    def _step(self, feeds: Sequence[Feed]) -> list[Sample | None]:
        out: list[Sample | None] = []
        for feed in feeds:
            state, tokens = self._slots[feed.slot], list(feed.tokens)
            at = chunk_positions(
                state.jumps, len(state.tokens), len(tokens), feed.media, feed.mrope
            )
            logits = self._model.forward(
                self._caches[feed.slot], tokens, feed.media, np.array(at), logits=feed.sample
            )
            state.tokens += tokens
            sample = None
            if logits is not None:
                sample = sample_rows([self._sampler(feed.slot)], mx.array(logits)[None])[0]
            out.append(sample)
        return out

    def _release(self) -> None:
        self._slots.clear()
        self._caches.clear()
        del self._model
        mx.clear_streams()
