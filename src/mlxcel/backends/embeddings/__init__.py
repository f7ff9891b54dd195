"""Embedding and reranking engines: llama.cpp for a GGUF; for a model folder, ONNX Runtime,
torch (sentence-transformers) or MLX (mlx-embeddings, embeddings only), as measured or asked;
image-text folders (CLIP, SigLIP) on ONNX Runtime or torch, late-interaction ones (ColBERT) on
torch. Each loads lazily: its packages are imported only when a model of its kind is opened."""

from __future__ import annotations

import importlib.util
import json
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mlxcel.backends.embeddings.layout import folder_layout, is_vision_retriever
from mlxcel.backends.embeddings.types import (
    Embedder,
    EmbedsImages,
    EncoderInfo,
    Reranker,
    TakesQueries,
    Unreadable,
)
from mlxcel.extras import install_extra

if TYPE_CHECKING:
    from mlxcel.backends.embeddings.llamacpp import LlamaCppEncoder

__all__ = [
    "Embedder",
    "EmbedsImages",
    "EncoderInfo",
    "EncoderOptions",
    "Reranker",
    "TakesQueries",
    "Unreadable",
    "folder_engine",
    "open_embedder",
    "open_reranker",
]

INSTALL_HINT = install_extra("embeddings")


@dataclass(frozen=True)
class EncoderOptions:
    """How to open an encoder model."""

    threads: int
    batch_tokens: int
    """Tokens one forward pass may hold (padding included on torch)."""
    ctx_size: int = 0
    """The longest input llama.cpp is sized for (0: the model's training context)."""
    engine: str = "auto"
    """A folder's engine: auto, onnxruntime, torch or mlx (a GGUF runs on llama.cpp)."""


def folder_engine(requested: str, folder: Path, rerank: bool) -> str:
    """The engine a model folder runs on, unless one is asked for: MLX (mlx-embeddings) for an
    MLX-quantized embedding folder, or on Apple Silicon where it is installed; else ONNX Runtime
    on Linux (measured ahead of torch on a Linux CPU by bench/embeddings.py, for texts and,
    with --images, for CLIP's images) when it is installed; else torch. A late-interaction
    folder (ColBERT) runs on torch."""
    layout = "text" if rerank else folder_layout(folder)
    if layout == "late-interaction":
        return "torch"
    if requested != "auto":
        return requested
    if layout == "image-text":
        onnx = sys.platform == "linux" and importlib.util.find_spec("onnxruntime") is not None
        return "onnxruntime" if onnx else "torch"
    if not rerank and importlib.util.find_spec("mlx_embeddings") is not None:
        config = folder / "config.json"
        quantized = config.is_file() and "quantization" in json.loads(config.read_text())
        if quantized or (sys.platform == "darwin" and platform.machine() == "arm64"):
            return "mlx"
    onnx = sys.platform == "linux" and importlib.util.find_spec("onnxruntime") is not None
    return "onnxruntime" if onnx else "torch"


_PACKAGES = {
    "onnxruntime": ("sentence_transformers", "onnxruntime"),
    "torch": ("sentence_transformers",),
    "mlx": ("mlx_embeddings",),
}


def _folder_engine(requested: str, folder: Path, rerank: bool) -> str:
    """The engine for a folder, its packages checked."""
    engine = folder_engine(requested, folder, rerank)
    if rerank and engine == "mlx":
        raise ValueError("mlx-embeddings has no cross-encoders: rerank on onnxruntime or torch")
    if engine == "mlx" and folder_layout(folder) != "text":
        raise ValueError(f"{folder.name}: image-text folders run on onnxruntime or torch, not mlx")
    for package in _PACKAGES[engine]:
        if importlib.util.find_spec(package) is None:
            hint = "pip install mlx-embeddings" if engine == "mlx" else INSTALL_HINT
            raise ValueError(
                f"a model folder for embeddings or reranking on {engine} needs "
                f"{package.replace('_', '-')}: {hint}"
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
    engine = _folder_engine(options.engine, path, rerank=False)
    layout = folder_layout(path)
    if layout != "text":
        return _open_special(path, layout, engine, options)
    if engine == "mlx":
        from mlxcel.backends.embeddings.mlx_models import MlxEmbedder

        return MlxEmbedder(path, batch_tokens=options.batch_tokens)
    if engine == "onnxruntime":
        from mlxcel.backends.embeddings.onnx_models import OnnxEmbedder

        return OnnxEmbedder(path, threads=options.threads, batch_tokens=options.batch_tokens)
    from mlxcel.backends.embeddings.torch_models import TorchEmbedder

    return TorchEmbedder(path, threads=options.threads, batch_tokens=options.batch_tokens)


def _open_special(path: Path, layout: str, engine: str, options: EncoderOptions) -> Embedder:
    """An image-text folder (CLIP, SigLIP) or a late-interaction one (ColBERT, ColQwen2,
    ColPali)."""
    if layout == "late-interaction" and is_vision_retriever(path):
        from mlxcel.backends.embeddings.colvision import ColVisionEmbedder

        return ColVisionEmbedder(path, threads=options.threads, batch_tokens=options.batch_tokens)
    if layout == "late-interaction":
        from mlxcel.backends.embeddings.colbert import ColbertEmbedder

        return ColbertEmbedder(path, threads=options.threads, batch_tokens=options.batch_tokens)
    if engine == "onnxruntime":
        from mlxcel.backends.embeddings.image_text_onnx import OnnxImageTextEmbedder

        return OnnxImageTextEmbedder(
            path, threads=options.threads, batch_tokens=options.batch_tokens
        )
    from mlxcel.backends.embeddings.image_text import TorchImageTextEmbedder

    return TorchImageTextEmbedder(path, threads=options.threads, batch_tokens=options.batch_tokens)


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
    if _folder_engine(options.engine, path, rerank=True) == "onnxruntime":
        from mlxcel.backends.embeddings.onnx_models import OnnxReranker

        return OnnxReranker(path, threads=options.threads, batch_tokens=options.batch_tokens)
    from mlxcel.backends.embeddings.torch_models import TorchReranker

    return TorchReranker(path, threads=options.threads, batch_tokens=options.batch_tokens)
