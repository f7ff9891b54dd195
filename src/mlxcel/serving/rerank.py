"""POST /v1/rerank and its aliases: a cross-encoder's score for each document against the
query (or a late-interaction model's MaxSim, `late_interaction.py`), sorted best first (ties by
index). `documents` answers in Jina's and Cohere's shape, `texts` in Text Embeddings
Inference's; /v2/rerank in Cohere's v2 shape."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from typing import Any

from mlxcel.models.encoders import EmbeddingModel, RerankModel
from mlxcel.protocol.embeddings import RerankRequest
from mlxcel.protocol.errors import invalid_request
from mlxcel.serving.embeddings import check_total_size, cut, too_many, within_size
from mlxcel.serving.encoder_limits import EncoderLimits
from mlxcel.serving.late_interaction import maxsim_scored
from mlxcel.serving.rerank_documents import best_first, checked_documents


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


async def scored(
    model: RerankModel, body: RerankRequest, limits: EncoderLimits
) -> tuple[list[tuple[int, float]], list[str], int]:
    """(index, logit) best first, the documents, and the tokens read."""
    documents, param = checked_documents(body, limits)
    info = model.info
    query = within_size(body.query, info, False, "'query'", "query")
    truncate = body.truncate or body.max_tokens_per_doc is not None
    # The documents as the model reads them; the answer gives them back as they were sent.
    read = [
        within_size(text, info, truncate, f"document {index}", param)
        for index, text in enumerate(documents)
    ]
    check_total_size([*([query] * len(read)), *read], info, limits, param)
    pairs = await model.tokenize_pairs(query, read)
    limit = info.max_tokens
    if body.max_tokens_per_doc is not None:
        # Cohere's per-document cut, measured on the document beside the query.
        query_only = (await model.tokenize_pairs(query, [""]))[0]
        limit = min(limit, len(query_only) + body.max_tokens_per_doc)
    for index, ids in enumerate(pairs):
        if len(ids) <= limit:
            continue
        if not (body.truncate or body.max_tokens_per_doc is not None):
            raise invalid_request(
                f"document {index} with the query is {len(ids)} tokens, longer than the "
                f"model's maximum of {info.max_tokens}; shorten it or send truncate: true",
                param=param,
                code="input_too_long",
            )
        pairs[index] = cut(ids, limit, info.end_token)
    tokens = sum(len(p) for p in pairs)
    if tokens > limits.max_tokens:
        raise too_many("tokens", tokens, limits.max_tokens, "--embedding-max-tokens", param)
    return best_first(await model.score(pairs)), documents, tokens


async def rerank(
    model: RerankModel | EmbeddingModel,
    name: str,
    body: RerankRequest,
    limits: EncoderLimits,
    v2: bool = False,
) -> Any:
    """Jina/Cohere's {model, object, results, usage}, TEI's bare array with `texts`, or with
    `v2` Cohere's /v2/rerank {id, results, meta}. A cross-encoder's logit is given through a
    sigmoid (TEI's raw_scores: as it is); a late-interaction model's MaxSim as it is."""
    if v2 and body.texts is not None:
        raise invalid_request("/v2/rerank takes 'documents', not 'texts'", param="texts")
    if isinstance(model, EmbeddingModel):
        order, documents, tokens = await maxsim_scored(model, body, limits)
        # MaxSim is a sum of cosines, not a logit: it is given as it is.
        squash: Callable[[float], float] = float
    else:
        order, documents, tokens = await scored(model, body, limits)
        squash = _sigmoid
    if body.top_n is not None:
        order = order[: body.top_n]
    if v2:
        return {
            "id": str(uuid.uuid4()),
            "results": [{"index": i, "relevance_score": squash(score)} for i, score in order],
            "meta": {
                "api_version": {"version": "2"},
                "billed_units": {"search_units": 1},
                "tokens": {"input_tokens": tokens, "output_tokens": 0},
            },
        }
    if body.texts is not None:
        return [
            {
                "index": i,
                "score": score if body.raw_scores else squash(score),
                **({"text": documents[i]} if body.return_text else {}),
            }
            for i, score in order
        ]
    results = []
    for i, score in order:
        result: dict[str, Any] = {"index": i, "relevance_score": squash(score)}
        if body.return_documents:
            result["document"] = {"text": documents[i]}
        results.append(result)
    return {
        "model": name,
        "object": "list",
        "results": results,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
