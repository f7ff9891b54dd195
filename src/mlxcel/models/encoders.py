"""The embedding and rerank capabilities of a loaded model: its engine behind a batcher that
packs concurrent requests into shared forward passes, tokenizing off the event loop.

Inputs and outputs are plain data (strings, token-id lists, numpy arrays): the engine is the
model's worker process (`models/proxies.py`), one batch per call."""

from __future__ import annotations

import asyncio

import numpy as np

from mlxcel.backends.embeddings import EncoderInfo, Reranker, Unreadable
from mlxcel.media.images import EncodedImage
from mlxcel.models.encoder_batcher import EncoderBatcher
from mlxcel.models.proxies import RemoteEmbedder


class EmbeddingModel:
    """A model that embeds: tokenize, then vectors from a shared batch."""

    def __init__(self, engine: RemoteEmbedder, name: str, budget: int) -> None:
        self._engine = engine
        self.info: EncoderInfo = engine.info
        self._batcher: EncoderBatcher[np.ndarray] = EncoderBatcher(engine.embed, budget, name)
        # Images batch apart from texts (another forward pass), each costing its patches.
        self._images: EncoderBatcher[np.ndarray | Unreadable] | None = None
        if "image" in self.info.modalities:
            cost = max(1, self.info.image_tokens)
            self._images = EncoderBatcher(
                engine.embed_images, max(budget, cost), f"{name}-images", lambda _: cost
            )

    @property
    def batches(self) -> int:
        """Forward batches run so far."""
        return self._batcher.batches

    async def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids (special tokens included), on a worker thread."""
        return await asyncio.to_thread(self._engine.tokenize, texts)

    async def tokenize_queries(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids as a query (a late-interaction model's marker and form)."""
        return await asyncio.to_thread(self._engine.tokenize_queries, texts)

    async def embed(self, inputs: list[list[int]]) -> list[np.ndarray]:
        """Each input's raw (unnormalized) vector, or per-token matrix."""
        return await self._batcher.submit(inputs)

    async def embed_images(self, images: list[EncodedImage]) -> list[np.ndarray | Unreadable]:
        """Each image's raw vector (an image-text model's), or why its pixels did not decode."""
        assert self._images is not None, "the model takes no images"
        return await self._images.submit(images)

    def close(self) -> None:
        """Stop the batchers and free the weights."""
        self._batcher.stop()
        if self._images is not None:
            self._images.stop()
        self._engine.close()


class RerankModel:
    """A model that reranks: a relevance logit per (query, document) pair."""

    def __init__(self, engine: Reranker, name: str, budget: int) -> None:
        self._engine = engine
        self.info: EncoderInfo = engine.info
        self._batcher: EncoderBatcher[float] = EncoderBatcher(engine.score, budget, name)

    async def tokenize_pairs(self, query: str, documents: list[str]) -> list[list[int]]:
        """Each pair's token ids, on a worker thread."""
        return await asyncio.to_thread(self._engine.tokenize_pairs, query, documents)

    async def score(self, pairs: list[list[int]]) -> list[float]:
        """Each pair's relevance logit."""
        return await self._batcher.submit(pairs)

    def close(self) -> None:
        """Stop the batcher and free the weights."""
        self._batcher.stop()
        self._engine.close()
