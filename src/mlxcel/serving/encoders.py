"""The embedding and rerank capabilities of a loaded model: its engine behind a batcher that
packs concurrent requests into shared forward passes, tokenizing off the event loop.

Inputs and outputs are plain data (strings, token-id lists, numpy arrays), so the engine side
can move into a worker process without changing the routes."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np

from mlxcel.backends.embeddings import (
    Embedder,
    EncoderInfo,
    EncoderOptions,
    Reranker,
    open_embedder,
    open_reranker,
)
from mlxcel.config import (
    DEFAULT_EMBEDDING_MAX_INPUTS,
    DEFAULT_EMBEDDING_MAX_TOKENS,
    DEFAULT_RERANK_MAX_DOCUMENTS,
    ServerConfig,
)
from mlxcel.serving.encoder_batcher import EncoderBatcher

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EncoderLimits:
    """What one request may ask of an encoder model (each a flag)."""

    max_inputs: int = DEFAULT_EMBEDDING_MAX_INPUTS
    """Inputs per embedding request (413 past it, as TEI's --max-client-batch-size)."""
    max_tokens: int = DEFAULT_EMBEDDING_MAX_TOKENS
    """Tokens per embedding or rerank request, all inputs together."""
    max_documents: int = DEFAULT_RERANK_MAX_DOCUMENTS
    """Documents per rerank request."""


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


def load_embedding_model(path: Path, options: EncoderOptions, name: str) -> EmbeddingModel:
    """Open an embedding model and start its batcher."""
    return EmbeddingModel(open_embedder(path, options), name, options.batch_tokens)


def load_rerank_model(path: Path, options: EncoderOptions, name: str) -> RerankModel:
    """Open a reranker and start its batcher."""
    return RerankModel(open_reranker(path, options), name, options.batch_tokens)


M = TypeVar("M", EmbeddingModel, RerankModel)


@dataclass
class Served(Generic[M]):
    """One side model and the name it is served under."""

    name: str
    model: M

    def close(self) -> None:
        """Stop its batcher and free its weights."""
        self.model.close()


@dataclass
class Encoders:
    """The side models of this server, and the limits their requests live within."""

    limits: EncoderLimits
    embedding: Served[EmbeddingModel] | None = None
    rerank: Served[RerankModel] | None = None

    def close(self) -> None:
        """Free every side model."""
        for served in (self.embedding, self.rerank):
            if served is not None:
                served.close()


def _served_name(path: Path) -> str:
    """A side model's id: the packaged MiniLM's own name, else its file stem or folder name."""
    from mlxcel.weights import DEFAULT_EMBEDDING_NAME, default_embedding_model

    try:
        if path == default_embedding_model():
            return DEFAULT_EMBEDDING_NAME
    except OSError:
        pass
    return path.stem if path.suffix.lower() == ".gguf" else path.name


def load_encoders(config: ServerConfig) -> Encoders:
    """Open the side models the config names, each with its batcher running."""
    limits = EncoderLimits(
        config.embedding_max_inputs, config.embedding_max_tokens, config.rerank_max_documents
    )
    options = EncoderOptions(config.threads, config.embedding_batch_tokens, config.ctx_size)
    found = Encoders(limits)
    try:
        if config.embedding_model is not None:
            name = _served_name(config.embedding_model)
            model = load_embedding_model(config.embedding_model, options, name)
            found.embedding = Served(name, model)
            logger.info(
                "serving embeddings as '%s' (%s, %d dimensions, %d tokens at most)",
                name,
                model.info.engine,
                model.info.dimensions,
                model.info.max_tokens,
            )
        if config.reranker_model is not None:
            name = _served_name(config.reranker_model)
            reranker = load_rerank_model(config.reranker_model, options, name)
            found.rerank = Served(name, reranker)
            logger.info(
                "serving reranking as '%s' (%s, %d tokens at most)",
                name,
                reranker.info.engine,
                reranker.info.max_tokens,
            )
    except BaseException:
        found.close()
        raise
    return found
