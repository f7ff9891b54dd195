"""Reranking with a late-interaction model (ColBERT): the query read as a query, each document
as a document, every row normalized, and a document's score the MaxSim of ColBERT and PyLate:
the sum over the query's rows of each row's best cosine among the document's rows."""

from __future__ import annotations

import numpy as np

from mlxcel.models.encoders import EmbeddingModel
from mlxcel.protocol.embeddings import RerankRequest
from mlxcel.serving.embeddings import cut, normalize, token_inputs, too_many, within_size
from mlxcel.serving.encoder_limits import EncoderLimits
from mlxcel.serving.rerank_documents import best_first, checked_documents


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """Sum over the query's (normalized) rows of the best dot product with a document row."""
    if len(document) == 0:
        return 0.0
    return float((query @ document.T).max(axis=1).sum())


async def maxsim_scored(
    model: EmbeddingModel, body: RerankRequest, limits: EncoderLimits
) -> tuple[list[tuple[int, float]], list[str], int]:
    """(index, MaxSim) best first, the documents, and the tokens read."""
    documents, param = checked_documents(body, limits)
    info = model.info
    truncate = body.truncate or body.max_tokens_per_doc is not None
    query_text = within_size(body.query, info, body.truncate, "'query'", "query")
    # The documents as the model reads them; the answer gives them back as they were sent.
    (query,) = await token_inputs(
        model,
        [query_text],
        prefix="",
        truncate=body.truncate,
        limits=limits,
        param="query",
        query=True,
        names=["'query'"],
    )
    rows = await token_inputs(
        model,
        list(documents),
        prefix="",
        truncate=truncate,
        limits=limits,
        param=param,
        names=[f"document {i}" for i in range(len(documents))],
    )
    if body.max_tokens_per_doc is not None:
        # Cohere's per-document cut: the document's own tokens, its markers besides.
        bare = len((await model.tokenize([""]))[0])
        rows = [cut(row, bare + body.max_tokens_per_doc, info.end_token) for row in rows]
    tokens = len(query) + sum(len(row) for row in rows)
    if tokens > limits.max_tokens:
        raise too_many("tokens", tokens, limits.max_tokens, "--embedding-max-tokens", param)
    query_rows, *document_rows = [normalize(m, 2) for m in await model.embed([query, *rows])]
    return best_first([maxsim(query_rows, d) for d in document_rows]), documents, tokens
