"""What one embedding or rerank request may ask of its model: the limits each route checks."""

from __future__ import annotations

from dataclasses import dataclass

from mlxcel.config.settings import (
    DEFAULT_EMBEDDING_MAX_INPUTS,
    DEFAULT_EMBEDDING_MAX_TOKENS,
    DEFAULT_RERANK_MAX_DOCUMENTS,
)


@dataclass(frozen=True)
class EncoderLimits:
    """What one request may ask of an encoder model (each a flag)."""

    max_inputs: int = DEFAULT_EMBEDDING_MAX_INPUTS
    """Inputs per embedding request (413 past it, as TEI's --max-client-batch-size)."""
    max_tokens: int = DEFAULT_EMBEDDING_MAX_TOKENS
    """Tokens per embedding or rerank request, all inputs together."""
    max_documents: int = DEFAULT_RERANK_MAX_DOCUMENTS
    """Documents per rerank request."""
