"""The embedding and rerank models' flags: their request limits and their shared-batch size
(the models themselves are side models: --embedding-model, --reranker-model)."""

from __future__ import annotations

import argparse
from typing import Any

from mlxcel.config import settings as defaults


def encoder_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the embedding and rerank limit flags."""
    group = parser.add_argument_group("embeddings and reranking")
    add = group.add_argument
    add(
        "--embedding-max-inputs",
        type=int,
        default=defaults.DEFAULT_EMBEDDING_MAX_INPUTS,
        help="inputs one embedding request may hold, else 413 (default: %(default)s)",
    )
    add(
        "--embedding-max-tokens",
        type=int,
        default=defaults.DEFAULT_EMBEDDING_MAX_TOKENS,
        help="tokens one embedding or rerank request may hold, else 413 (default: %(default)s)",
    )
    add(
        "--rerank-max-documents",
        type=int,
        default=defaults.DEFAULT_RERANK_MAX_DOCUMENTS,
        help="documents one rerank request may hold, else 413 (default: %(default)s)",
    )
    add(
        "--embedding-batch-tokens",
        type=int,
        default=defaults.DEFAULT_EMBEDDING_BATCH_TOKENS,
        help="tokens one shared forward pass may hold, across requests (default: %(default)s)",
    )
    add(
        "--embedding-engine",
        choices=defaults.ENCODER_ENGINES,
        default="auto",
        help="engine of an embedding or reranker model folder: auto is onnxruntime on Linux "
        "(measured faster there), mlx (mlx-embeddings, embeddings only) on Apple Silicon or for "
        "an MLX-quantized folder, torch elsewhere; CLIP and SigLIP folders run on onnxruntime or "
        "torch, ColBERT folders on torch; a GGUF runs on llama.cpp "
        "(default: %(default)s)",
    )


def encoder_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The ServerConfig fields these flags set (--embedding-batch-tokens and
    --embedding-engine are per model)."""
    for name in (
        "embedding_max_inputs",
        "embedding_max_tokens",
        "rerank_max_documents",
        "embedding_batch_tokens",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return {
        "embedding_max_inputs": args.embedding_max_inputs,
        "embedding_max_tokens": args.embedding_max_tokens,
        "rerank_max_documents": args.rerank_max_documents,
    }
