"""GET /health and /v1/health (public), GET /models and /models/{id} (under /v1 and without)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from mlxcel.api.auth import require_api_key
from mlxcel.api.state import loaded_registry
from mlxcel.engine.registry import LoadedModel
from mlxcel.serving.errors import APIError

public = APIRouter()
router = APIRouter(dependencies=[Depends(require_api_key)])


@public.get("/health")
@public.get("/v1/health")
async def health(request: Request) -> dict[str, str]:
    """200 once every model is loaded, 503 before."""
    if request.app.state.load_error is not None:
        raise APIError(503, f"model failed to load: {request.app.state.load_error}")
    if request.app.state.registry is None:
        raise APIError(503, "loading model", code="loading")
    return {"status": "ok"}


def _model_object(request: Request, model: LoadedModel) -> dict[str, Any]:
    return {
        "id": model.name,
        "object": "model",
        "created": request.app.state.started,
        "owned_by": "mlxcel",
        "aliases": list(model.names),
        "meta": {"backend": model.backend, "path": str(model.path)},
    }


@router.get("/models")
async def list_models(request: Request) -> dict[str, Any]:
    """The served models in OpenAI's list shape."""
    registry = loaded_registry(request)
    return {"object": "list", "data": [_model_object(request, m) for m in registry.all()]}


@router.get("/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> dict[str, Any]:
    """One served model by any of its names (hub ids hold a slash); 404 for other names."""
    registry = loaded_registry(request)
    model = registry.named(model_id)
    if model is None:
        message = f"the model '{model_id}' does not exist; {registry.served()}"
        raise APIError(404, message, param="model", code="model_not_found")
    return _model_object(request, model)
