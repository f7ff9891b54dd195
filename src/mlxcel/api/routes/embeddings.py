"""The embedding and rerank routes: OpenAI's /v1/embeddings, llama-server's /embedding,
/v1/rerank with its aliases (Jina/Cohere's shape, or TEI's with `texts`), Cohere's /v2/rerank."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from mlxcel.api.auth import require_api_key
from mlxcel.api.body_check import CheckedJsonRoute
from mlxcel.api.state import encoder_for, invalid_model
from mlxcel.models.encoders import EmbeddingModel, RerankModel
from mlxcel.models.loaded import LoadedEncoder
from mlxcel.protocol.embeddings import EmbeddingRequest, NativeEmbeddingRequest, RerankRequest
from mlxcel.serving.embeddings import embeddings, native_embeddings
from mlxcel.serving.encoder_limits import EncoderLimits
from mlxcel.serving.rerank import rerank

router = APIRouter(route_class=CheckedJsonRoute, dependencies=[Depends(require_api_key)])
RERANK_PATHS = ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking")


def _limits(request: Request) -> EncoderLimits:
    limits: EncoderLimits = request.app.state.encoder_limits
    return limits


async def _embedder(request: Request, name: str | None) -> tuple[LoadedEncoder, EmbeddingModel]:
    loaded = await encoder_for(request, name, "embedding")
    if not isinstance(loaded.encoder, EmbeddingModel):
        raise invalid_model(f"the model '{loaded.name}' does not embed")
    return loaded, loaded.encoder


@router.post("/v1/embeddings")
async def openai_embeddings(body: EmbeddingRequest, request: Request) -> dict[str, Any]:
    """OpenAI's embeddings list."""
    loaded, model = await _embedder(request, body.model)
    return await embeddings(model, loaded.name, body, _limits(request), request.app.state.media)


@router.post("/embedding")
async def native_embedding(body: NativeEmbeddingRequest, request: Request) -> Any:
    """llama-server's shape: [{index, embedding: [[...]]}]."""
    loaded, model = await _embedder(request, body.model)
    return await native_embeddings(
        model, loaded.name, body, _limits(request), request.app.state.media
    )


@router.post("/embeddings")
async def bare_embeddings(request: Request, body: Annotated[dict[str, Any], Body()]) -> Any:
    """OpenAI's shape, or llama-server's when the body has `content` (as llama-server's own
    /embeddings answers)."""
    try:
        if "content" in body:
            return await native_embedding(NativeEmbeddingRequest.model_validate(body), request)
        return await openai_embeddings(EmbeddingRequest.model_validate(body), request)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from exc


async def _rerank(body: RerankRequest, request: Request, v2: bool) -> Any:
    loaded = await encoder_for(request, body.model, "rerank")
    # A late-interaction embedding model reranks too, by MaxSim.
    late = isinstance(loaded.encoder, EmbeddingModel) and loaded.encoder.info.query_tokens > 0
    if not (isinstance(loaded.encoder, RerankModel) or late):
        raise invalid_model(f"the model '{loaded.name}' does not rerank")
    return await rerank(loaded.encoder, loaded.name, body, _limits(request), v2)


async def rerank_route(body: RerankRequest, request: Request) -> Any:
    """Documents scored against the query, best first."""
    return await _rerank(body, request, v2=False)


for _path in RERANK_PATHS:
    router.add_api_route(_path, rerank_route, methods=["POST"])


@router.post("/v2/rerank")
async def cohere_rerank(body: RerankRequest, request: Request) -> Any:
    """Cohere's v2 shape: {id, results: [{index, relevance_score}], meta}."""
    return await _rerank(body, request, v2=True)
