"""The side models a route reads: the embedding model and the reranker served beside the chat
model (--embedding-model, --reranker-model), found by the request's `model` field."""

from __future__ import annotations

from typing import TypeVar

from fastapi import Request

from mlxcel.api.state import loaded_registry
from mlxcel.engine.registry import DEFAULT_MODEL_NAMES
from mlxcel.serving.encoders import EmbeddingModel, Encoders, RerankModel, Served
from mlxcel.serving.errors import APIError

M = TypeVar("M", EmbeddingModel, RerankModel)


def encoders(request: Request) -> Encoders:
    """The side models (503 while the server loads)."""
    loaded_registry(request)
    found: Encoders = request.app.state.encoders
    return found


def _pick(request: Request, name: str | None, served: Served[M] | None, does: str) -> Served[M]:
    """The side model a request names: 400 when the named model cannot do it, 404 when no
    model has that name (unless lenient names let the one such model answer)."""
    chat = loaded_registry(request)
    side = encoders(request)
    if served is not None and (name is None or name in DEFAULT_MODEL_NAMES or name == served.name):
        return served
    others = [s.name for s in (side.embedding, side.rerank) if s is not None]
    if name is not None and (chat.named(name) is not None or name in others):
        what = "text generation" if chat.named(name) is not None else "another capability"
        hint = f"; '{served.name}' does" if served is not None else ""
        raise APIError(
            400,
            f"the model '{name}' cannot do {does}: it serves {what}{hint}",
            param="model",
            code="model_not_supported",
        )
    if served is None:
        raise APIError(
            400,
            f"no model here does {does}; start the server with "
            f"{'--embedding-model' if does == 'embeddings' else '--reranker-model'}",
            param="model",
            code="model_not_supported",
        )
    if request.app.state.strict_model_names:
        raise APIError(
            404,
            f"the model '{name}' does not exist; {does} are served by '{served.name}'",
            param="model",
            code="model_not_found",
        )
    return served


def embedding_model(request: Request, name: str | None) -> Served[EmbeddingModel]:
    """The embedding model a request names."""
    return _pick(request, name, encoders(request).embedding, "embeddings")


def rerank_model(request: Request, name: str | None) -> Served[RerankModel]:
    """The reranker a request names."""
    return _pick(request, name, encoders(request).rerank, "reranking")
