"""Embedding and reranking engines: llama.cpp for a GGUF; for a model folder, ONNX Runtime or
torch (sentence-transformers), as measured or asked. Each loads lazily: its packages are imported
only when a model of its kind is opened."""

from __future__ import annotations

import importlib.util
import sys
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
    "folder_engine",
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
    engine: str = "auto"
    """A folder's engine: auto, onnxruntime or torch (a GGUF runs on llama.cpp)."""


def folder_engine(requested: str) -> str:
    """The engine a model folder runs on: ONNX Runtime on Linux (measured ahead of torch on a
    Linux CPU by bench/embeddings.py) when it is installed, else torch; or the one asked for."""
    if requested != "auto":
        return requested
    onnx = sys.platform == "linux" and importlib.util.find_spec("onnxruntime") is not None
    return "onnxruntime" if onnx else "torch"


def _folder_engine(requested: str) -> str:
    """The engine for a folder, its packages checked."""
    engine = folder_engine(requested)
    for package in ("sentence_transformers", *(["onnxruntime"] if engine == "onnxruntime" else [])):
        if importlib.util.find_spec(package) is None:
            raise ValueError(
                f"a model folder for embeddings or reranking on {engine} needs "
                f"{package.replace('_', '-')}: {INSTALL_HINT}"
            )
    return engine


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
    if _folder_engine(options.engine) == "onnxruntime":
        from mlxcel.backends.embeddings.onnx_models import OnnxEmbedder

        return OnnxEmbedder(path, threads=options.threads, batch_tokens=options.batch_tokens)
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
    if _folder_engine(options.engine) == "onnxruntime":
        from mlxcel.backends.embeddings.onnx_models import OnnxReranker

        return OnnxReranker(path, threads=options.threads, batch_tokens=options.batch_tokens)
    from mlxcel.backends.embeddings.torch_models import TorchReranker

    return TorchReranker(path, threads=options.threads, batch_tokens=options.batch_tokens)
