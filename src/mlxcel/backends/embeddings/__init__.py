"""Embedding and reranking engines: llama.cpp for a GGUF, torch (sentence-transformers) for a
model folder, mlx-embeddings for an MLX folder. Each loads lazily: its packages are imported
only when a model of its kind is opened."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mlxcel.backends.embeddings.types import Embedder, EncoderInfo, Reranker

if TYPE_CHECKING:
    from mlxcel.backends.embeddings.llamacpp import LlamaCppEncoder

__all__ = [
    "Embedder",
    "EncoderInfo",
    "EncoderOptions",
    "Reranker",
    "open_embedder",
    "open_reranker",
]

INSTALL_HINT = "pip install 'mlxcel[embeddings]'"


@dataclass(frozen=True)
class EncoderOptions:
    """How to open an encoder model."""

    threads: int
    batch_tokens: int
    """Tokens one forward pass may hold (padding included on torch)."""
    ctx_size: int = 0
    """The longest input llama.cpp is sized for (0: the model's training context)."""


def _torch_engine() -> None:
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        raise ValueError(
            f"a model folder for embeddings or reranking needs sentence-transformers: "
            f"{INSTALL_HINT}"
        ) from None


def _open_gguf(path: Path, options: EncoderOptions) -> LlamaCppEncoder:
    from mlxcel.backends.embeddings.llamacpp import LlamaCppEncoder

    return LlamaCppEncoder(
        path, threads=options.threads, ctx_size=options.ctx_size, batch_tokens=options.batch_tokens
    )


def open_embedder(path: Path, options: EncoderOptions) -> Embedder:
    """The embedding model at `path`, on the engine its format calls for."""
    if path.is_file():
        encoder = _open_gguf(path, options)
        if encoder.info.pooling == "rank":
            encoder.close()
            raise ValueError(f"{path.name} is a reranker (rank pooling), not an embedding model")
        return encoder
    _torch_engine()
    from mlxcel.backends.embeddings.torch_models import TorchEmbedder

    return TorchEmbedder(path, threads=options.threads, batch_tokens=options.batch_tokens)


def open_reranker(path: Path, options: EncoderOptions) -> Reranker:
    """The cross-encoder at `path`: a rank-pooling GGUF, or a sequence-classification folder."""
    if path.is_file():
        encoder = _open_gguf(path, options)
        if encoder.info.pooling != "rank":
            encoder.close()
            raise ValueError(
                f"{path.name} has {encoder.info.pooling} pooling: a reranker GGUF has rank pooling"
            )
        return encoder
    _torch_engine()
    from mlxcel.backends.embeddings.torch_models import TorchReranker

    return TorchReranker(path, threads=options.threads, batch_tokens=options.batch_tokens)
