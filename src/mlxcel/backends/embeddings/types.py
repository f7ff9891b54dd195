"""What an embedding or reranking engine is to the rest of the server: token ids in, plain
numbers out, so the same calls can cross a process boundary (everything here pickles)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from mlxcel.media.images import EncodedImage

# `projection`: an image-text model's own projected feature (CLIP's, SigLIP's).
Pooling = Literal["mean", "cls", "last", "none", "rank", "projection"]


@dataclass(frozen=True)
class EncoderInfo:
    """What serving needs to know about an encoder model, read once at load."""

    engine: str
    """The engine that runs it, as /v1/models names it (sentence-transformers, llama.cpp)."""
    max_tokens: int
    """The longest input, special tokens included."""
    longest_token: int
    """The most bytes of text one token stands for: what bounds an input's size before it is
    tokenized."""
    vocab_size: int
    dimensions: int
    """Width of one vector (embedders); 0 for a reranker."""
    pooling: Pooling
    end_token: int | None = None
    """The token every tokenized input ends with (BERT's [SEP]), kept when cutting to length."""
    prompts: dict[str, str] = field(default_factory=dict)
    """The model's named prompts (sentence-transformers' `prompts`: query, passage...)."""
    query_prompt: str | None = None
    """The name of the prompt for queries, when the model has one."""
    modalities: tuple[str, ...] = ("text",)
    """What its inputs may be: text, and image for an image-text model (CLIP, SigLIP)."""
    image_tokens: int = 0
    """What one image costs in a shared batch's token budget (its patches)."""
    query_tokens: int = 0
    """A late-interaction model's query length: its queries are read apart from documents
    (`TakesQueries`) and padded to this many rows; 0 for other models."""

    @property
    def multi_vector(self) -> bool:
        """One vector per token (late interaction), not one per input."""
        return self.pooling == "none"


def longest_piece(pieces: Iterable[str | bytes]) -> int:
    """The most bytes a token's text takes, over a vocabulary (at least 1). A Hugging Face
    vocabulary's markers (WordPiece's ##, byte-level BPE's Ġ, SentencePiece's ▁) only make a
    token's text look longer: the bound stays safe."""
    return max((len(p.encode() if isinstance(p, str) else p) for p in pieces), default=1) or 1


class Embedder(Protocol):
    """An embedding model on one engine."""

    info: EncoderInfo

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids with the model's special tokens, not cut to any length."""
        ...

    def embed(self, batch: list[list[int]]) -> list[np.ndarray]:
        """Each input's vector (a matrix, one row per token, with pooling `none`), before any
        normalization; the inputs run together in as few forward passes as fit."""
        ...

    def close(self) -> None:
        """Free the weights."""
        ...


@dataclass(frozen=True)
class Unreadable:
    """An image whose header read but whose pixels did not decode: its request's 400, not a
    failure of the batch it shared with others."""

    message: str
    code: str


@runtime_checkable
class EmbedsImages(Protocol):
    """An embedder whose vectors for images share the space of its texts' (CLIP, SigLIP)."""

    def embed_images(self, images: list[EncodedImage]) -> list[np.ndarray | Unreadable]:
        """Each image's vector before any normalization, decoded here (in the worker)."""
        ...


@runtime_checkable
class TakesQueries(Protocol):
    """A late-interaction embedder, which reads a query apart from a document (its marker,
    its expansion to a fixed length)."""

    def tokenize_queries(self, texts: list[str]) -> list[list[int]]:
        """Each query's token ids, its marker in, not yet expanded nor cut."""
        ...


class Reranker(Protocol):
    """A cross-encoder on one engine: a score for how well a document answers a query."""

    info: EncoderInfo

    def tokenize_pairs(self, query: str, documents: list[str]) -> list[list[int]]:
        """The token ids of each (query, document) pair, as the model reads a pair."""
        ...

    def score(self, batch: list[list[int]]) -> list[float]:
        """Each tokenized pair's raw relevance logit (higher is more relevant)."""
        ...

    def close(self) -> None:
        """Free the weights."""
        ...
