"""A rerank request's documents, as both scorers read them (a cross-encoder's, `rerank.py`,
and a late-interaction model's MaxSim, `late_interaction.py`)."""

from __future__ import annotations

from mlxcel.protocol.embeddings import RerankRequest
from mlxcel.protocol.errors import invalid_request
from mlxcel.serving.embeddings import too_many
from mlxcel.serving.encoder_limits import EncoderLimits


def _documents(body: RerankRequest) -> tuple[list[str], str]:
    """The documents' texts and the field they came in."""
    if body.documents is not None and body.texts is not None:
        raise invalid_request("send 'documents' or 'texts', not both", param="texts")
    if body.texts is not None:
        return body.texts, "texts"
    if body.documents is None:
        raise invalid_request("'documents' is required", param="documents")
    return [d if isinstance(d, str) else d.text for d in body.documents], "documents"


def checked_documents(body: RerankRequest, limits: EncoderLimits) -> tuple[list[str], str]:
    """The documents' texts and the field they came in, the query and their count checked."""
    documents, param = _documents(body)
    if not body.query.strip():
        raise invalid_request("'query' is empty", param="query")
    if not documents:
        raise invalid_request(f"'{param}' is empty: give at least one document", param=param)
    if len(documents) > limits.max_documents:
        raise too_many(
            "documents", len(documents), limits.max_documents, "--rerank-max-documents", param
        )
    return documents, param


def best_first(scores: list[float]) -> list[tuple[int, float]]:
    """(index, score) best first, ties by index."""
    return sorted(enumerate(scores), key=lambda item: (-item[1], item[0]))
