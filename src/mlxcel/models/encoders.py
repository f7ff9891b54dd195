"""The embedding and rerank capabilities of a loaded model: its engine behind a batcher that
packs concurrent requests into shared forward passes, tokenizing off the event loop.

Inputs and outputs are plain data (strings, token-id lists, numpy arrays): the engine is the
model's worker process (`models/proxies.py`), one batch per call."""

from __future__ import annotations

import asyncio

import numpy as np

from mlxcel.backends.embeddings import Embedder, EncoderInfo, Reranker
from mlxcel.models.encoder_batcher import EncoderBatcher


class EmbeddingModel:
    """A model that embeds: tokenize, then vectors from a shared batch."""

    def __init__(self, engine: Embedder, name: str, budget: int) -> None:
        self._engine = engine
        self.info: EncoderInfo = engine.info
        self._batcher: EncoderBatcher[np.ndarray] = EncoderBatcher(engine.embed, budget, name)

    @property
    def batches(self) -> int:
        """Forward batches run so far."""
        return self._batcher.batches

    async def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids (special tokens included), on a worker thread."""
        return await asyncio.to_thread(self._engine.tokenize, texts)

    async def embed(self, inputs: list[list[int]]) -> list[np.ndarray]:
        """Each input's raw (unnormalized) vector, or per-token matrix."""
        return await self._batcher.submit(inputs)

    def close(self) -> None:
        """Stop the batcher and free the weights."""
        self._batcher.stop()
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
